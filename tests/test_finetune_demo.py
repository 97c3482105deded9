"""README "Continued training": its CPU walkthrough, run line by line as a user runs it (in a scratch directory
instead of runs/demo): a tiny random OLMo-2 made by transformers -> from-hf -> chat SFT data -> DAR stage 1 ->
stage 2 -> rolling perplexity -> a downstream suite with a local lm-eval task -> its table."""

from __future__ import annotations

import json
import os
import re
import subprocess

import torch
from builders import ROOT
from safetensors.torch import load_file


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text[text.index("<!-- finetune-demo:start -->"):text.index("<!-- finetune-demo:end -->")]
    code = block.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("  #")[0].strip() for line in re.sub(r"\\\n\s*", "", code).splitlines() if line.strip()]


def test_readme_walkthrough_runs(tmp_path):
    commands = readme_commands()
    assert len(commands) == 8
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    for command in commands:
        out = subprocess.run(["bash", "-c", command.replace("runs/demo", str(tmp_path))], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, f"{command}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    imported = load_file(str(tmp_path / "olmo2" / "model.safetensors"))
    stage1 = load_file(str(tmp_path / "dar-stage1" / "checkpoints" / "step_00000006" / "model.safetensors"))
    stage2 = load_file(str(tmp_path / "dar" / "checkpoints" / "step_00000006" / "model.safetensors"))
    assert all(torch.equal(stage1[k], v) for k, v in imported.items())  # stage 1 trained the bottleneck only
    assert not torch.equal(stage2["model.layers.0.self_attn.q_proj.weight"],
                           imported["model.layers.0.self_attn.q_proj.weight"])  # stage 2 trained everything
    manifest = json.loads((tmp_path / "chat.manifest.json").read_text())
    assert manifest["conversations"]["written"] == 8
    ppl = json.loads((tmp_path / "ppl.json").read_text())["corpora"]["c4"]
    assert ppl["documents"] == 3 and ppl["token_perplexity"] > 1
    suite = json.loads((tmp_path / "demo.json").read_text())
    (task,) = suite["tasks"]
    assert task["task"] == "neox_dar_demo" and task["docs"] + task["dropped_short"] == 8
    assert 0.0 <= task["score"] <= 1.0
