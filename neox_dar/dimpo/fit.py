"""The paper's Table 1 on one model: every method at every ``d'``, fitted and scored layer by layer.

Per layer: capture the layer's train, validation and test instances (:mod:`.instances`), fit each method at each
``d'`` (:mod:`.methods`), score all of them on the test instances in one pass (:mod:`.evaluate`), then release
the layer's vectors before the next layer is captured. After each layer the projection files
(``OUT/projections/{method}-d{d'}.safetensors``) and then ``OUT/results.json`` are rewritten, so a stopped run
loses at most the layer in progress; run the same command again to continue at the first unfinished layer.

``results.json``::

    {"format": "neox_dar.dimpo.table1", "settings": {...}, "complete": bool,
     "layers": {"0": {"seconds", "instances": {"train", "valid", "test"},
                      "results": {method: {d': {"test": {"kl", "mse"}, "valid": {"kl", "mse"}, "fit": {...}}}}}}}
"""

from __future__ import annotations

import json
import time
import zlib
from pathlib import Path

import torch

from ..progress import progress_bar
from ..provenance import provenance
from ..rundir import write_text_atomic
from .evaluate import evaluate
from .files import read_result
from .instances import Documents, DimPOError, capture_split
from .methods import PAIRWISE, Hyper, fit_projection
from .pairs import PairSelection, key_pairs
from .projections import Projections, load_projections, model_shape

RESULTS = "results.json"
FORMAT = "neox_dar.dimpo.table1"
DIMS = (64, 32, 16, 8, 4, 2, 1)


def projection_path(out: str | Path, method: str, d: int) -> Path:
    return Path(out) / "projections" / f"{method}-d{d}.safetensors"


def default_dims(head_dim: int) -> list[int]:
    """The paper's ``d'`` values below the head dim (Table 8: d_h = 64 gives 32..1)."""
    return [d for d in DIMS if d < head_dim]


def _seed(seed: int, layer: int, method: str, d: int) -> int:
    return zlib.crc32(f"{seed}/{layer}/{method}/{d}".encode())


def load_results(out: str | Path) -> dict:
    return read_result(out, RESULTS, FORMAT, "fit")


def run_fit(model: torch.nn.Module, settings: dict, docs: dict[str, Documents], hyper: dict[str, Hyper],
            out: str | Path, block: int = 1024) -> dict:
    """Fit and score ``settings["methods"]`` x ``settings["dims"]`` on every layer not yet in ``OUT/results.json``
    (whose settings must equal ``settings``), ``block`` queries at a time; returns the results."""
    out = Path(out)
    shape = settings["model"]["shape"]
    if (out / RESULTS).exists():
        results = load_results(out)
        results["settings"] = {"pairs": "top-bottom", **results["settings"]}  # fits from before --pairs
        if results["settings"] != settings:
            changed = sorted(k for k in settings if results["settings"].get(k) != settings[k])
            raise DimPOError(f"{out} holds a fit with other settings ({', '.join(changed)} differ); "
                             "use another --out")
    else:
        out.mkdir(parents=True, exist_ok=True)
        results = {"format": FORMAT, "settings": settings, "provenance": provenance(), "complete": False,
                   "layers": {}}
    files = {}
    for method in settings["methods"]:
        for d in settings["dims"]:
            path = projection_path(out, method, d)
            proj = Projections(method, d, shape, source=settings["model"]["source"])
            if path.exists():
                proj.weights = {l: w for l, w in load_projections(path).weights.items()
                                if str(l) in results["layers"]}
            files[method, d] = proj
    for layer in progress_bar(iterable=range(shape["num_layers"]), desc="DimPO layers", unit="layer"):
        if str(layer) in results["layers"]:
            continue
        start = time.perf_counter()
        train = capture_split(model, layer, docs["train"], every_query=False, keep_values=False,
                              desc=f"layer {layer} train")
        valid = capture_split(model, layer, docs["valid"], every_query=False, keep_values=True,
                              desc=f"layer {layer} valid")
        trained = [m for m in settings["methods"] if m in PAIRWISE or m == "dimpo"]
        pairs = key_pairs(train, PairSelection.parse(settings["pairs"]), block,
                          _seed(settings["seed"], layer, "pairs", 0)) if trained else None
        fitted, logs = {}, {}
        for method in settings["methods"]:
            for d in settings["dims"]:
                w, log = fit_projection(method, d, train, valid, hyper.get(method), settings["epochs"],
                                        settings["max_steps"], _seed(settings["seed"], layer, method, d), block,
                                        desc=f"layer {layer} {method} d'={d}", pairs=pairs)
                fitted[f"{method}/{d}"], logs[method, d] = w, log
        valid_scores = evaluate(valid, fitted, block)
        counts = {"train": len(train), "valid": len(valid)}
        del train, valid, pairs
        test = capture_split(model, layer, docs["test"], every_query=True, keep_values=True,
                             desc=f"layer {layer} test")
        test_scores = evaluate(test, fitted, block)
        counts["test"] = len(test)
        del test
        scores = {}
        for (method, d), log in logs.items():
            key = f"{method}/{d}"
            files[method, d].weights[layer] = fitted[key]
            scores.setdefault(method, {})[str(d)] = {"test": test_scores[key], "valid": valid_scores[key], "fit": log}
        for proj in files.values():
            proj.save(projection_path(out, proj.method, proj.d_proj))
        entry = {"seconds": time.perf_counter() - start, "instances": counts, "results": scores}
        results["layers"][str(layer)] = entry
        results["complete"] = len(results["layers"]) == shape["num_layers"]
        write_text_atomic(out / RESULTS, json.dumps(results, indent=1))
    return results


def fit_settings(model_info: dict, cfg, docs: dict[str, Documents], methods: list[str], dims: list[int],
                 hyper: dict[str, Hyper], epochs: int, max_steps: int | None, seed: int,
                 pairs: PairSelection = PairSelection()) -> dict:
    """The settings a fit's results depend on (a resumed run must match them exactly), JSON-ready."""
    shape = model_shape(cfg)
    return json.loads(json.dumps({
        "model": {"shape": shape, "source": {"checkpoint": model_info["checkpoint"],
                                             "config_hash": model_info["config_hash"]}},
        "data": {name: {"source": d.source, "documents": d.ids} for name, d in docs.items()},
        "seq_len": int(docs["train"].tokens.shape[1]),
        "methods": methods, "dims": dims,
        "hyper": {m: {"lr": h.lr, "batch_size": h.batch_size, **h.loss} for m, h in hyper.items()},
        "epochs": epochs, "max_steps": max_steps, "seed": seed, "pairs": pairs.label,
    }))
