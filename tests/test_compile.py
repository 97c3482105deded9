"""torch.compile over the whole model: every registered variant traces in one graph (``fullgraph=True``: forward,
the chunked loss, AHA's straight-through router and auxiliary loss, backward) and trains to the same losses and
parameters as eager. ``torch_compile: true`` in train.py (DeepSpeed's engine.compile) giving the eager losses, resumed
too, is tests/test_train.py's two-process ZeRO-2 test; the Triton kernel path of the same check runs in
tests/test_kernels.py (the interpreter there, compiled on a GPU).

Backend ``aot_eager``: dynamo's graph capture and AOT autograd's joint graph as inductor receives them, run by eager
kernels (inductor's C++ build of the CPU graphs takes minutes on two cores; the GPU kit runs inductor).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from neox_dar.config import ConfigError, load_config
from neox_dar.variants import registry
from neox_dar.model import build_model

from builders import attention_config
from trainrun import ROOT, train_env

VARIANTS = list(registry.variants())
# Every variant's reference path, and the sdpa paths that differ from it in the code they trace (training on a GPU
# without Triton). AHA on sdpa gathers the (batch, head) slices that route a row through each path (.nonzero():
# shapes that depend on the data), which dynamo cannot trace in one graph; its reference and Triton paths trace.
PATHS = [(v, "reference") for v in VARIANTS] + [(v, "sdpa") for v in ("vanilla", "dar", "mswa")]


def train_steps(model, steps: int = 2) -> list[float]:
    """``steps`` AdamW steps on fixed random batches: the loss (+ the variant's aux loss) of each."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(4)
    out = []
    for _ in range(steps):
        tokens = torch.randint(0, model.cfg.vocab_size, (2, 25), generator=gen)
        loss = model(tokens[:, :-1], tokens[:, 1:])
        aux = model.aux_loss()
        total = loss + (aux if aux is not None else 0.0)
        total.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append(total.item())
    return out


@pytest.mark.filterwarnings("ignore:MSWA")
@pytest.mark.parametrize("variant,impl", PATHS, ids=[f"{v}-{i}" for v, i in PATHS])
def test_every_variant_compiles_in_one_graph_and_trains_as_eager(variant, impl):
    cfg = attention_config(variant, impl, window_size=6, num_layers=2)
    torch.manual_seed(0)
    eager = build_model(cfg).train()
    compiled_model = build_model(cfg).train()
    compiled_model.load_state_dict(eager.state_dict())
    torch._dynamo.reset()
    compiled = torch.compile(compiled_model, backend="aot_eager", fullgraph=True)
    compiled.cfg, compiled.aux_loss = compiled_model.cfg, compiled_model.aux_loss
    expected = train_steps(eager)
    got = train_steps(compiled)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(eager.named_parameters(), compiled_model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-6, msg=name)


MODE_ENGINE = """
import sys
import torch
from neox_dar.config import load_config
from neox_dar.training.distributed import init_distributed
from neox_dar.training.engine import build_engine
seen = []
torch.compile = lambda fn, **kwargs: seen.append(kwargs) or fn  # what DeepSpeed's engine.compile asks of torch
info = init_distributed()
for mode in sys.argv[1:]:  # "-": torch_compile_mode unset
    cfg = load_config("configs/tiny.yml", overrides=["seq_length=16", "train_batch_size=1", "torch_compile=true",
                                                     "train_micro_batch_size_per_gpu=1",
                                                     *([f"torch_compile_mode={mode}"] if mode != "-" else [])])
    build_engine(cfg, info)
    print(sorted(seen[-1].items()))
"""


def test_torch_compile_mode_reaches_torch_compile_with_inductor():
    """``torch_compile_mode`` goes to torch.compile with the inductor backend (unset: no mode, torch's default)."""
    out = subprocess.run([sys.executable, "-c", MODE_ENGINE, "-", "max-autotune-no-cudagraphs"], cwd=ROOT,
                         env=train_env(LOCAL_RANK="0"), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    default, mode = [("backend", "inductor")], [("backend", "inductor"), ("mode", "max-autotune-no-cudagraphs")]
    assert out.stdout.strip().splitlines()[-2:] == [str(default), str(mode)]


def test_torch_compile_with_zero_stage_3_is_refused_in_one_line():
    """DeepSpeed's ZeRO-3 under engine.compile stops in dynamo (it traces the partitioned parameters as empty
    tensors: found by training configs/tiny.yml so, one and two processes): refused when the config loads."""
    with pytest.raises(ConfigError, match=r"^invalid value for 'torch_compile' in the command line: True \(is not "
                                          r"supported with zero_optimization.stage 3 .*use stage 1 or 2"):
        load_config(ROOT / "configs/tiny.yml", overrides=["torch_compile=true", "zero_optimization.stage=3"])
    load_config(ROOT / "configs/tiny.yml", overrides=["torch_compile=true", "zero_optimization.stage=2"])
    load_config(ROOT / "configs/tiny.yml", overrides=["torch_compile=false", "zero_optimization.stage=3"])


def test_torch_compile_mode_needs_inductor_in_one_line():
    with pytest.raises(ConfigError, match=r"^invalid value for 'torch_compile_mode' in the command line: "
                                          r"'reduce-overhead' \(needs torch_compile_backend: inductor"):
        load_config(ROOT / "configs/tiny.yml", overrides=["torch_compile_mode=reduce-overhead",
                                                          "torch_compile_backend=aot_eager"])
