"""The conformance suite: every registered attention variant, the built-in ones and a plug-in written as
docs/adding_a_variant.md says (tests/conformance_toy.py), goes through the same checks, so a new variant is checked
by registering it:

- its ``reference`` and ``sdpa`` paths agree, outputs and every gradient; its ``triton`` path (Triton's CPU
  interpreter, one process for all variants) agrees too, or is refused in one line (never a silent fallback);
- its per-token statistics are (B, T, H) tensors of the statistics it declares, refreshed by every forward and by
  every decode step;
- incremental decoding through its cache gives the full forward's logits, and the cache holds the bytes
  ``describe`` prints (``kv_cache_per_token``);
- its Hugging Face export gives our logits in transformers, or, for a variant with no export, ``to-hf`` refuses it
  in one line naming it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch
from builders import ROOT, config
from conformance_toy import ConformanceToy, ConformanceToySpec
from test_generate import check_decoding

from neox_dar.attention import build_attention
from neox_dar.variants import register, unregister, variants
from neox_dar.attention.base import RotaryEmbedding
from neox_dar.config import ConfigError
from neox_dar.describe import kv_cache_bytes_per_token
from neox_dar.model import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

# keys that make a variant do its own work on a 64-wide model of 32-token sequences (a window well inside them);
# a plug-in not listed here runs with its defaults and these
COMMON = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32, "window_size": 4,
          "vocab_size": 512, "make_vocab_size_divisible_by": 64}
KEYS = {"dar": {"dar_d_down": 16}, "uniform": {"dar_d_down": 16}, "linear": {"linear_feature_dim": 8},
        "dimpo": {"dimpo_d_proj": 6}, "aha": {"aha_l1_coef": 0.1}}
NAMES = sorted({*variants(), ConformanceToy.spec.name})


@pytest.fixture(autouse=True, scope="module")
def toy_registered():
    register(ConformanceToy)
    yield
    unregister(ConformanceToy.spec.name)


def _cfg(name: str, **keys):
    return config(**{**COMMON, **KEYS.get(name, {}), "attention_type": name, **keys}).model


def _model(name: str, **keys):
    """A tiny random model of ``name`` (every parameter moved by 0.05 standard deviations), eval mode."""
    torch.manual_seed(0)
    model = build_model(_cfg(name, **keys)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def _layer_run(name: str, impl: str) -> list[torch.Tensor]:
    """One attention layer's output and every gradient (input and parameters) on a fixed input."""
    cfg = _cfg(name, attention_impl=impl)
    torch.manual_seed(0)
    m = build_attention(cfg, 1)
    a = torch.randn(2, 11, cfg.hidden_size, requires_grad=True)
    cos, sin = RotaryEmbedding(cfg.rotary_ndims, 10000)(11, torch.float32, a.device)
    out = m(a, cos, sin)
    up = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    aux = m.aux_loss if m.aux_loss is not None else 0
    ((out * up).sum() + aux).backward()
    return [out.detach(), a.grad] + [p.grad for p in m.parameters()]


@pytest.mark.parametrize("name", NAMES)
def test_reference_and_sdpa_paths_agree(name):
    for x, y in zip(_layer_run(name, "reference"), _layer_run(name, "sdpa"), strict=True):
        torch.testing.assert_close(y, x, atol=1e-5, rtol=1e-4)


TRITON = textwrap.dedent("""
    import sys
    sys.path.insert(0, "tests")
    import torch
    from conformance_toy import ConformanceToy
    from test_conformance import NAMES, _layer_run
    from neox_dar.variants import register
    register(ConformanceToy)
    for name in NAMES:
        ref = _layer_run(name, "reference")
        try:
            got = _layer_run(name, "triton")
        except RuntimeError as e:
            assert "triton" in str(e) and "\\n" not in str(e), (name, str(e))
            print(name, "refused")
            continue
        for x, y in zip(ref, got, strict=True):
            torch.testing.assert_close(y, x, atol=1e-5, rtol=1e-4)
        print(name, "ok")
""")


def test_triton_paths_agree_or_are_refused_in_one_line():
    """Under Triton's CPU interpreter (switched on before Triton is imported: a fresh process): every variant's
    triton path gives the reference's outputs and gradients, or says in one line that it cannot run here."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", TRITON], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    verdicts = dict(line.split() for line in out.stdout.splitlines())
    assert set(verdicts) == set(NAMES)
    assert {n for n, v in verdicts.items() if v == "refused"} <= {"linear", ConformanceToy.spec.name}, verdicts


@pytest.mark.parametrize("name", NAMES)
def test_token_stats_are_the_declared_statistics_per_token_and_fresh(name):
    """After a forward of (B, T): exactly the variant's declared statistics, each (B, T, H); after a decode step of
    one token, each (B, 1, H) (a stale prompt-length tensor would be averaged against the wrong positions)."""
    model = _model(name)
    x = torch.randint(0, 512, (2, 9))
    with torch.inference_mode():
        model(x)
        for m in model.attention_modules():
            assert set(m.token_stats) == set(m.spec.stats)
            assert all(v.shape == (2, 9, model.cfg.num_attention_heads) for v in m.token_stats.values())
        cache = model.new_cache([9, 9], 2)
        model.prefill([x[0], x[1]], cache)
        model.decode(x[:, :1], cache)
        for m in model.attention_modules():
            assert all(v.shape == (2, 1, model.cfg.num_attention_heads) for v in m.token_stats.values()), name


@pytest.mark.parametrize("name", NAMES)
def test_decoding_equals_the_full_forward_and_the_cache_holds_what_describe_says(name):
    model = _model(name)
    check_decoding(model, [5, 13], 8, seed=3)
    for context in (3, 20):
        cache = model.new_cache([context - 1], 1)
        expected = sum(kv_cache_bytes_per_token(SimpleNamespace(model=model.cfg), context, "fp32")) * context
        assert cache.nbytes() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_export_gives_our_logits_or_is_refused_naming_the_variant(name, tmp_path):
    from transformers import AutoModelForCausalLM

    from neox_dar.hf import to_hf
    from neox_dar.tokenizer import DEFAULT_TOKENIZER

    model = _model(name, vocab_size=50277, make_vocab_size_divisible_by=128)
    if name == ConformanceToy.spec.name:
        with pytest.raises(ConfigError, match=f"attention_type '{name}' has no Hugging Face export"):
            to_hf(model, model.cfg, tmp_path / "hf", DEFAULT_TOKENIZER)
        return
    folder = to_hf(model, model.cfg, tmp_path / "hf", DEFAULT_TOKENIZER)
    theirs = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    x = torch.randint(0, 50277, (1, 21))
    with torch.inference_mode():
        torch.testing.assert_close(theirs(x).logits, model(x), atol=1e-4, rtol=1e-4)


class StaleSpec(ConformanceToySpec):
    name = "stale"


class StaleToy(ConformanceToy):
    """The plug-in with a decode that forgets to refresh its per-token statistics."""

    spec = StaleSpec

    def decode(self, a, cache, cos, sin) -> torch.Tensor:
        q, k, v = self.split_heads(a, cos, sin)
        return self.merge_heads(cache.attend(q * self.scale[None, :, None, None], k, v, self.head_dim ** -0.5))


def test_a_decode_that_leaves_stale_statistics_is_an_error_not_a_broadcast():
    """Generation averages the statistics of each decoded token; a (B, T_prompt, H) tensor left over from the
    prompt was silently broadcast against the (B, 1) step mask (generate reported 1.61 where the value was 0.81):
    now a one-line ValueError naming the statistic and the rule."""
    from neox_dar.evaluation.scoring import AttentionStatsMean
    from neox_dar.generate import generate

    register(StaleToy)
    try:
        model = _model("stale", conftoy_scale=0.81)
        with pytest.raises(ValueError, match=r"layer0/conftoy_scale_now: .* must set token_stats"):
            generate(model, [[1, 2, 3, 4]], 3, stats=AttentionStatsMean(model))
    finally:
        unregister("stale")


def test_generate_names_each_statistic_and_refuses_a_variant_without_decoding(tmp_path, capsys):
    """The command line labels a statistic with its own meaning (not AHA's Eq. 8 for every one), and a plug-in
    without a decode is one line, exit 2 (it was a NotImplementedError traceback)."""
    from builders import saved_model

    from neox_dar.generate.__main__ import main

    saved_model(tmp_path / "toy", "attention_type=conftoy", "conftoy_scale=0.81", "window_size=4")
    assert main([str(tmp_path / "toy"), "--prompt", "Hello", "--max-new-tokens", "2"]) == 0
    err = capsys.readouterr().err
    assert "conftoy_scale_now = 0.8100 over the generated tokens" in err and "conformance toy's learned" in err
    assert "AHA" not in err

    class NoDecodeSpec(ConformanceToySpec):
        name = "nodecode"

    class NoDecode(ConformanceToy):
        spec = NoDecodeSpec
        decode = ConformanceToy.__mro__[1].decode  # the base class's, which only refuses

    register(NoDecode)
    try:
        saved_model(tmp_path / "nodecode", "attention_type=nodecode", "window_size=4")
        assert main([str(tmp_path / "nodecode"), "--prompt", "Hello", "--max-new-tokens", "2"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "attention_type 'nodecode' has no incremental decoding" in err
    finally:
        unregister("nodecode")


def test_the_readmes_variant_table_is_the_registrys():
    """README's table of ``attention_type`` values is what ``python -m neox_dar.attention`` prints from the
    registry: every registered variant, in registration order, with its one line and its page (which exists)."""
    out = subprocess.run([sys.executable, "-m", "neox_dar.attention"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out in (ROOT / "README.md").read_text(), "README.md: paste `python -m neox_dar.attention`'s table"
    shipped = {name: cls for name, cls in variants().items() if cls is not ConformanceToy.spec}  # this module's own
    assert [line.split("`")[1] for line in out.splitlines()[2:]] == list(shipped)
    assert all(cls.what and (ROOT / cls.doc).is_file() for cls in shipped.values())



@pytest.mark.parametrize("module", ["neox_dar.attention", "neox_dar.families"])
def test_the_table_commands_refuse_arguments_in_one_line(module):
    """The table commands take no argument: one they were given is refused (it printed the table, exit 0)."""
    out = subprocess.run([sys.executable, "-m", module, "configs/pythia-70m.yml"], cwd=ROOT, capture_output=True,
                         text=True)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines()[-1] == f"python -m {module}: error: unrecognized arguments: configs/pythia-70m.yml"

def test_a_module_holds_its_spec_and_is_not_one():
    """Each registered variant's module carries the registered spec as ``spec`` and does not inherit from it (what a
    variant declares and what computes it are two classes); ``register`` takes a spec, or a module whose ``spec`` is
    one, and says so for anything else."""
    from neox_dar.variants import VariantSpec, registry

    for name, spec in variants().items():
        module = registry.module(name)
        assert module.spec is spec and not issubclass(module, VariantSpec), name
    with pytest.raises(TypeError, match=r"register\(\) takes a VariantSpec subclass or a module class"):
        register(torch.nn.Linear)
