"""DimPO on every model family, imported from Hugging Face folders: the original attention weights DimPO works from
(psi, from the captured rotated queries and keys, GQA's shared key/value heads, q/k norms, Llama-3 rope scaling,
Qwen3's head_dim != d / H) are the transformers model's own attention probabilities, and a fit runs end to end on
the folder."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from builders import hf_folder

from neox_dar.data import IndexedDatasetWriter
from neox_dar.dimpo import layer_qkv
from neox_dar.dimpo.__main__ import main
from neox_dar.dimpo.fit import load_results, projection_path
from neox_dar.dimpo.projections import load_projections
from neox_dar.evaluation.loading import load_for_eval
from neox_dar.families import FAMILIES


@pytest.mark.parametrize("family", list(FAMILIES))
def test_original_weights_are_the_models_attention(family, tmp_path):
    hf = hf_folder(tmp_path / "hf", family)
    model = load_for_eval(tmp_path / "hf").model
    ids = torch.randint(3, 96, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = hf(ids, output_attentions=True).attentions
    for layer, probs in enumerate(expected):
        q, k, _ = layer_qkv(model, layer, ids)
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # query head h reads key/value head h // group
        scores = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(
            ~torch.ones(24, 24, dtype=torch.bool).tril(), float("-inf"))
        torch.testing.assert_close(torch.softmax(scores, -1), probs, atol=2e-6, rtol=1e-4)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_fit_on_a_hugging_face_folder(family, tmp_path, capsys, one_thread):
    hf_folder(tmp_path / "hf", family)
    writer = IndexedDatasetWriter(tmp_path / "docs", np.uint16)
    for tokens in np.random.default_rng(0).integers(3, 96, (6, 40)):
        writer.add_document(tokens)
    writer.finalize()
    code = main(["fit", str(tmp_path / "hf"), "--train", str(tmp_path / "docs"), "--out", str(tmp_path / "fit"),
                 "--seq-len", "32", "--train-docs", "2", "--valid-docs", "2", "--test-docs", "2",
                 "--methods", "random,pca,orpo,dimpo", "--dims", "4", "--max-steps", "5", "--device", "cpu"])
    assert code == 0, capsys.readouterr().err
    results = load_results(tmp_path / "fit")
    head_dim = 32 if family == "qwen3" else 16
    assert results["complete"] and results["settings"]["model"]["shape"] == {
        "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "head_dim": head_dim}
    assert results["layers"]["1"]["instances"] == {"train": 64, "valid": 64, "test": 2 * 4 * 32}
    assert load_projections(projection_path(tmp_path / "fit", "dimpo", 4)).weights[1].shape == (4, head_dim)
