"""The family records (neox_dar/families.py): the docs' table is theirs, every preset is what its family's class
can express, and a new family is one record plus its preset (docs/models.md's Mistral example, added at run
time, imports and exports with transformers' logits)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from builders import FAMILY_PRESETS, ROOT, config

from neox_dar.hf import export_problems
from neox_dar.families import FAMILIES, table

DOC = (ROOT / "docs" / "models.md").read_text()


def test_docs_table_is_the_records():
    assert table() in DOC, "docs/models.md: regenerate the family table with python -m neox_dar.families"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_preset_is_what_the_class_expresses(family):
    cfg = config(FAMILY_PRESETS[family]).model
    assert cfg.model_family == family and export_problems(cfg) == []


NEW_FAMILY = r"""
import json, re, sys
from pathlib import Path
import torch
import transformers
import neox_dar.families as families
from neox_dar.config import load_config
from neox_dar.hf import from_hf, hf_config_dict, to_hf
from neox_dar.model import build_model, count_parameters
from neox_dar.tiny_hf_model import tiny_hf_model
from neox_dar.tokenizer import DEFAULT_TOKENIZER

doc = Path("docs/models.md").read_text()
record = eval(re.search(r"```python\n(Family\(.*?)```", doc, re.S).group(1), vars(families))
families.register_family(record)  # after the config and the model are imported: nothing froze the names

tmp = Path(sys.argv[1])
hf = tiny_hf_model(record.name)
hf.save_pretrained(tmp / "hf")
model, cfg = from_hf(tmp / "hf")
x = torch.randint(0, 96, (2, 37), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    torch.testing.assert_close(model.eval()(x), hf(x).logits, atol=1e-4, rtol=0)
    again = getattr(transformers, record.hf_class).from_pretrained(
        to_hf(model, cfg, tmp / "export", DEFAULT_TOKENIZER), attn_implementation="eager").float().eval()
    torch.testing.assert_close(again(x).logits, model(x), atol=1e-5, rtol=0)

(tmp / "preset.yml").write_text(re.search(r"```yaml\n(model_family: " + record.name + ".*?)```", doc, re.S).group(1))
preset = load_config(tmp / "preset.yml").model
exported = hf_config_dict(preset)
with torch.device("meta"):
    theirs = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(exported.pop("model_type"), **exported))
    ours = count_parameters(build_model(preset))["total"]
assert ours == sum(p.numel() for p in theirs.parameters()), ours
print("ok", record.name, ours)
"""


def test_a_new_family_is_one_record_and_its_preset(tmp_path):
    out = subprocess.run([sys.executable, "-c", NEW_FAMILY, str(tmp_path)], capture_output=True, text=True,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"^ok mistral \d+$", out.stdout, re.M), out.stdout
