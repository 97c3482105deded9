"""The shipped recipes against the papers' numbers (issue 26): each test reads a shipped sweep, config or suite and
checks the paper's value, and the numbers the docs quote against the code or the committed result file they come
from."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
from builders import attention_config

from eval.downstream import table
from eval.suites import SUITES, SuiteError
from neox_dar.variants.mswa import mswa_window_table, window_budget
from neox_dar.sweep.slurm import eval_args
from neox_dar.sweep.planning import plan
from neox_dar.sweep.spec import load_sweep

ROOT = Path(__file__).resolve().parents[1]


def _plan(path: str, tmp_path: Path) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {p.spec.name: p.cfg for p in plan(load_sweep(ROOT / path), tmp_path)}


def _header_budgets(path: str) -> dict[str, float]:
    """The ``window budgets (...): run value, run value`` line of a sweep file's header."""
    header = " ".join(line[1:].strip() for line in (ROOT / path).read_text().splitlines() if line.startswith("#"))
    found = re.search(r"window budgets? \(.*?\): ((?:[\w-]+ \d\.\d{3}(?:, )?)+)", header)
    assert found, f"{path}: no window budget line in the header"
    return {name: float(value) for name, value in (item.split() for item in found.group(1).split(", "))}


# ---- 1. MSWA Table 6: the decreasing order reverses the layer groups ---------------------------------------------

@pytest.mark.parametrize("layers", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 13, 24, 32])
@pytest.mark.parametrize("variant,progression", [("full", "geometric"), ("layers", "geometric"),
                                                 ("full", "arithmetic")])
def test_mswa_decreasing_order_is_the_reversed_table_with_the_same_budget(layers, variant, progression):
    kwargs = dict(H=8, num_layers=layers, window_size=128, mswa_variant=variant, mswa_progression=progression)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        up = attention_config("mswa", mswa_layer_order="increasing", **kwargs)
        down = attention_config("mswa", mswa_layer_order="decreasing", **kwargs)
        assert mswa_window_table(down) == mswa_window_table(up)[::-1]
        assert window_budget(down) == window_budget(up)


def test_mswa_table6_sweep_changes_the_order_and_nothing_else(tmp_path):
    cfgs = _plan("configs/sweeps/mswa-table6.yml", tmp_path)
    ours, decreasing = cfgs["mswa"].model, cfgs["mswa-decreasing"].model
    assert [row[0] for row in mswa_window_table(decreasing)] == [64, 64, 64, 32, 32, 32, 16, 16, 16, 8, 8, 8]
    assert mswa_window_table(decreasing) == mswa_window_table(ours)[::-1]
    assert window_budget(decreasing) == window_budget(ours) == 225 / 256  # the paper's budget for both orders


# ---- 4, 5, 8. MSWA budgets and setups ----------------------------------------------------------------------------

def _budget(cfg, w_ref: int) -> float:
    """Summed windows of the MSWA layers over SWA's (layers x heads x w_ref); SWA itself: w / w_ref."""
    a = cfg.model.attention
    if a.attention_type == "swa":
        return a.window_size / w_ref
    table = mswa_window_table(cfg.model)
    return sum(map(sum, table)) / (len(table) * cfg.model.num_attention_heads * w_ref)


@pytest.mark.parametrize("path", ["configs/sweeps/mswa-vs-swa.yml", "configs/sweeps/mswa-table6.yml",
                                  "configs/sweeps/mswa-enwik8.yml", "configs/sweeps/mswa-linear.yml",
                                  "configs/finetune/sweeps/mswa-lora.yml"])
def test_sweep_headers_state_each_runs_window_budget(path, tmp_path):
    """Every MSWA sweep's header gives each MSWA run's window budget; here they are recomputed from the plan."""
    cfgs = _plan(path, tmp_path)
    stated = _header_budgets(path)
    for name, value in stated.items():
        cfg = cfgs[name]
        w_ref = 1024 if "mswa-lora" in path else cfg.model.attention.window_size  # LoRA: SWA's w = 1,024
        assert round(_budget(cfg, w_ref), 3) == value, name
    assert {n for n, c in cfgs.items() if c.model.attention.attention_type in ("mswa", "linear+mswa")} <= set(stated)


def test_mswa_table2_and_5_keep_the_papers_model_budgets_and_rows(tmp_path):
    """Table 2's relative costs (SWA 1.14, MSWA-h and MSWA-l 1.07, MSWA 1.00) are budget ratios 1 : 15/16 : 15/16 :
    225/256 (Eqs. 8-11); on the paper's 12 layers they hold exactly, at every base w of Table 5."""
    cfgs = _plan("configs/sweeps/mswa-vs-swa.yml", tmp_path)
    for name, cfg in cfgs.items():
        m = cfg.model
        assert (m.num_layers, m.hidden_size, m.num_attention_heads) == (12, 512, 8), name  # Appendix B.2.1
    for w in (64, 128, 256, 512):
        assert window_budget(cfgs[f"mswa-w{w}"].model) == 225 / 256
        assert cfgs[f"swa-w{w}"].model.attention.window_size == w
    assert window_budget(cfgs["mswa-h-w128"].model) == window_budget(cfgs["mswa-l-w128"].model) == 15 / 16
    assert round(1 / (225 / 256), 2) == 1.14 and round((15 / 16) / (225 / 256), 2) == 1.07  # the paper's column
    tokens = {n: c.model.seq_length * c.training.train_batch_size for n, c in cfgs.items()}
    assert cfgs["vanilla-n1024"].model.seq_length == 1024 and cfgs["vanilla"].model.seq_length == 2048
    assert len(set(tokens.values())) == 1  # n = 1024 sees the same tokens per step


def test_mswa_enwik8_sweep_is_table_2s_enwik8_setup(tmp_path):
    """Appendix B.2.1: 12 layers, d = 512, 8 heads; 150,000 steps of 49,152 tokens; AdamW (0.9, 0.98), lr 2e-4,
    1,000 warmup steps, cosine; scored in bits per character on enwik8's test split."""
    sweep = load_sweep(ROOT / "configs/sweeps/mswa-enwik8.yml")
    cfgs = _plan("configs/sweeps/mswa-enwik8.yml", tmp_path)
    assert sorted(cfgs) == sorted(["vanilla", "vanilla-n1024", "swa", "mswa-h", "mswa-l", "mswa"])
    for name, cfg in cfgs.items():
        m, t = cfg.model, cfg.training
        assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.vocab_size) == (12, 512, 8, 257)
        assert m.seq_length * t.train_batch_size == 49_152 and t.train_iters == 150_000
        assert t.optimizer.type == "AdamW" and t.optimizer.params.lr == 2e-4
        assert list(t.optimizer.params.betas) == [0.9, 0.98] and t.lr_decay_style == "cosine"
        assert round(t.warmup * t.train_iters) == 1000
        assert cfg.data.train_data_paths == ["data/enwik8/enwik8_train"]
    assert cfgs["vanilla-n1024"].model.seq_length == 1024
    assert window_budget(cfgs["mswa"].model) == 225 / 256
    args = eval_args(sweep.eval)
    assert args[len(args) - 1 - args[::-1].index("--corpora") + 1] == "enwik8"  # the last --corpora wins
    assert "enwik8=data/enwik8/enwik8_test.raw" in args and sweep.raw["report"]["metric"] == "bits_per_byte"


@pytest.mark.parametrize("path", ["configs/sweeps/mswa-vs-swa.yml", "configs/sweeps/mswa-table6.yml",
                                  "configs/sweeps/mswa-enwik8.yml", "configs/sweeps/mswa-linear.yml"])
def test_mswa_sweep_headers_say_what_differs(path):
    header = " ".join(line.lstrip("# ") for line in (ROOT / path).read_text().split("\nname:")[0].splitlines())
    assert "Transformer-XL" in header and "segment memory" in header
    assert "12 layers" in header


def test_mswa_lora_matches_swas_resources(tmp_path):
    """Appendix B.2.2: SWA at w = 1/4 of the 4,096-token sequence; MSWA's windows "ensuring consistent resource
    usage with SWA": its summed windows within 0.1% of SWA's (from w = 1,024 itself they would be 0.879)."""
    cfgs = _plan("configs/finetune/sweeps/mswa-lora.yml", tmp_path)
    swa, mswa = cfgs["swa"].model, cfgs["mswa"].model
    assert swa.seq_length == 4096 and swa.attention.window_size == 1024
    L, H = mswa.num_layers, mswa.num_attention_heads
    assert (L, H) == (32, 32)
    assert sum(map(sum, mswa_window_table(mswa))) / (L * H * 1024) == pytest.approx(1, abs=1e-3)
    assert load_sweep(ROOT / "configs/finetune/sweeps/mswa-lora.yml").raw["grid"]["attention"]["mswa"]["set"] == {
        "window_size": 1165}
    text = (ROOT / "configs/finetune/mswa-lora.yml").read_text()
    assert "window_size: 1165" in text


# ---- 2, 6. AHA recipes ------------------------------------------------------------------------------------------

def test_aha_table4_sweep_is_at_the_papers_window(tmp_path):
    """Table 4: lambda in {1e-4, 3e-4, 1e-3} at a fixed w = 128; lambda = 0 only as a labelled extra run."""
    cfgs = _plan("configs/finetune/sweeps/aha-sft-l1.yml", tmp_path)
    assert all(c.model.attention.window_size == 128 and c.model.attention.aha_threshold == 0.5 for c in cfgs.values())
    paper = {n: c.model.attention.aha_l1_coef for n, c in cfgs.items() if n != "l1-0"}
    assert sorted(paper.values()) == pytest.approx([1e-4, 3e-4, 1e-3])
    assert cfgs["l1-0"].model.attention.aha_l1_coef == 0.0
    sweep = load_sweep(ROOT / "configs/finetune/sweeps/aha-sft-l1.yml")
    extra = next(r for r in sweep.runs if r.name == "l1-0")
    assert "not in the paper" in extra.axes["l1"]


def test_aha_sft_header_lists_every_choice_the_paper_leaves_open(tmp_path):
    cfg = _plan("configs/finetune/sweeps/aha-sft.yml", tmp_path)["w128"]
    t = cfg.training
    assert (t.optimizer.params.lr, list(t.optimizer.params.betas), t.warmup, t.train_batch_size) == (
        3e-5, [0.9, 0.95], 0.03, 128)  # Sec. 3.1
    header = (ROOT / "configs/finetune/aha-sft.yml").read_text().split("\nattention_type:")[0]
    for value, phrase in ((t.weight_decay, "weight decay: "), (t.gradient_clipping, "gradient clipping: "),
                          (cfg.model.seq_length, "sequence length: "), (t.min_lr, "min_lr ")):
        assert phrase in header, phrase
        stated = re.search(re.escape(phrase) + r"([\d,.]+)", header).group(1).rstrip(".,").replace(",", "")
        assert float(stated) == value, phrase


def test_downstream_suites_use_the_papers_metrics_and_one_context_length():
    """AHA's GSM8K is exact match (strict), DAR's flexible-extract; each suite fixes the context for every model."""
    aha = {t.task: t.metric for t in SUITES["aha-table1"].tasks}
    dar = {t.task: t.metric for t in SUITES["dar-table4"].tasks}
    assert aha["gsm8k"] == "exact_match,strict-match" and dar["gsm8k"] == "exact_match,flexible-extract"
    assert SUITES["aha-table1"].max_length == SUITES["dar-table4"].max_length == 4096  # OLMo-2-0425-1B's context
    assert SUITES["mswa-table4"].max_length == SUITES["mswa-table4-5shot"].max_length == 4096  # Llama-2, B.2.2
    assert "2,196" in (ROOT / "eval/downstream.py").read_text()  # the reason, AHA's MultiNews input length


def test_table_refuses_results_at_different_context_lengths_and_states_it():
    def result(name, length):
        return {"checkpoint": name, "suite": "aha-table1", "max_length": length,
                "tasks": [{"task": "mmlu", "label": "MMLU", "score": 0.4}]}
    text = table([result("w128", 4096)], result("base", 4096), SUITES)
    assert "context 4,096 tokens for every model" in text
    with pytest.raises(SuiteError, match="different context lengths"):
        table([result("w128", 2048)], result("base", 4096), SUITES)


# ---- 9. numbers in the docs against the code and the committed results -------------------------------------------

def _doc(name: str) -> str:
    return " ".join((ROOT / "docs" / name).read_text().split())  # one line: sentences wrap anywhere


def test_dimpo_doc_table_and_orderings_are_the_result_files():
    result = json.loads((ROOT / "bench/results/dimpo_table1_small.json").read_text())
    doc = (ROOT / "docs/dimpo.md").read_text()
    table_rows = [line for line in result["table_markdown"].splitlines() if line.startswith("| ")]
    assert "\n".join(table_rows) in doc  # the doc's table is the result's
    layers = result["results"]["layers"]

    def kl(method: str, d: str) -> float:
        return sum(layers[l]["results"][method][d]["test"]["kl"] for l in layers) / len(layers)

    trained = ["triplet", "cpo", "simpo", "orpo", "dimpo"]
    dims = [str(d) for d in result["results"]["settings"]["dims"]]
    lowest = [d for d in dims if min(trained, key=lambda m: kl(m, d)) == "dimpo"]
    assert lowest == ["8", "4", "1"]
    text = _doc("dimpo.md")
    assert "DimPO has the lowest KL of the preference and triplet losses at `d'` = 8, 4 and 1, but not at `d' = 2`" in text
    assert min(trained, key=lambda m: kl(m, "2")) == "orpo"
    assert f"ORPO's is lower ({kl('orpo', '2'):.3f} against {kl('dimpo', '2'):.3f}" in text
    below_pca = [d for d in dims if kl("dimpo", d) < kl("pca", d)]
    assert below_pca == ["4", "2", "1"] and "below PCA at `d' <= 4 = d_h / 4`" in text
    assert f"PCA is better at `d' = 8 = d_h / 2` ({kl('pca', '8'):.2f} against {kl('dimpo', '8'):.2f})" in text


def test_inference_doc_mswa_cache_is_the_decode_results():
    rows = json.loads((ROOT / "bench/results/decode_cpu.json").read_text())["results"]
    by = {(r["variant"], r["context"], r["batch"]): r for r in rows}
    mswa = {r["cache_bytes_per_sequence"] for r in rows if r["variant"] == "mswa"}
    swa = {r["cache_bytes_per_sequence"] for r in rows if r["variant"] == "swa"}
    assert len(mswa) == len(swa) == 1 and mswa.pop() / swa.pop() == 225 / 256
    text = _doc("inference.md")
    mib = next(r["cache_bytes_per_sequence"] for r in rows if r["variant"] == "mswa") / 2 ** 20
    assert f"**MSWA**: {mib:.3f} MiB against SWA's 0.5 at every context (225/256 of SWA's" in text
    assert "0.4375" not in text
    ratios = [by["mswa", c, b]["decode_tokens_per_s"] / by["swa", c, b]["decode_tokens_per_s"]
              for (v, c, b) in by if v == "mswa"]
    assert f"MSWA's tokens/s are {min(ratios):.2f}-{max(ratios):.2f} of SWA's" in text
    for (variant, c, b), r in by.items():  # the doc's table rows: cache MiB and tokens/s
        cells = f"| {c} | {b} | {r['cache_bytes_per_sequence'] / 2 ** 20:.3f} |"
        if variant in ("swa", "mswa", "vanilla"):
            assert f"| {variant} {cells}" in (ROOT / "docs/inference.md").read_text(), (variant, c, b)
        assert f"| {r['decode_tokens_per_s']:.1f} | {r['speed_vs_vanilla']:.2f} |" in text, (variant, c, b)
    dar = [by["dar", c, b]["speed_vs_vanilla"] for c in (2048, 8192) for b in (1, 16)]
    assert (f"(1.33x at batch 1, 1.62x at batch 16; {min(dar):.2f}-{max(dar):.2f}x at 2k and 8k)" in text
            and by["dar", 32768, 1]["speed_vs_vanilla"] == pytest.approx(1.33, abs=0.005)
            and by["dar", 32768, 16]["speed_vs_vanilla"] == pytest.approx(1.62, abs=0.005))


def test_attention_doc_dar_cache_numbers_are_the_codes():
    from neox_dar.config import load_config
    from neox_dar.describe import kv_cache_bytes_per_token

    def bytes_per_token(files, *overrides):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cfg = load_config("configs/pythia-70m.yml", *(f"configs/attention/{f}.yml" for f in files),
                              overrides=list(overrides))
        return sum(kv_cache_bytes_per_token(cfg, 2048, "bf16")), cfg

    text = _doc("attention.md")
    vanilla, _ = bytes_per_token(["vanilla"])
    dar, cfg = bytes_per_token(["dar"])
    latent, _ = bytes_per_token(["dar"], "dar_inference_cache=latent")
    m = cfg.model
    far_keys = m.num_attention_heads * m.rotary_ndims
    assert f"a far token keeps {m.attention.dar_d_down + far_keys} numbers per layer with `keys` and the paper's " \
           f"{m.attention.dar_d_down} with `latent`" in text
    assert f"gives {100 * dar / vanilla:.1f}% of vanilla's cache (`keys`) and {100 * latent / vanilla:.1f}% (`latent`)" \
        in text
    uniform, _ = bytes_per_token(["uniform"])
    uniform_latent, _ = bytes_per_token(["uniform"], "dar_inference_cache=latent")
    swa, _ = bytes_per_token(["swa"])
    mswa, _ = bytes_per_token(["mswa"])
    linear, _ = bytes_per_token(["linear"])
    hybrid, _ = bytes_per_token(["mswa"], "num_layers=12", "hybrid=mswa_linear")
    vanilla12, _ = bytes_per_token(["vanilla"], "num_layers=12")
    assert (f"vanilla {vanilla:,.0f} B/token, DAR (w 128, d_down 128) {dar:,.0f} (`latent`: {latent:,.0f}), uniform "
            f"{uniform:,.0f} (`latent`: {uniform_latent:,.0f}), SWA (w 128) {swa:,.0f}, MSWA (w 128) {mswa:,.0f}, "
            f"linear (d_f 16) {linear:,.1f}; the 12-layer `hybrid: mswa_linear` {hybrid:,.1f} "
            f"({100 * hybrid / vanilla12:.1f}% of its vanilla's {vanilla12:,.0f})") in text
    assert "not an implemented incremental decoder" not in text


# ---- docs/experiments.md: the papers' sweeps and the coverage table -------------------------------------------

PAPERS = {"DAR": "dar-dual-dimensionality.md", "MSWA": "mswa-multi-scale-window.md", "AHA": "aha-all-or-here.md",
          "DimPO": "dimpo.md"}


def _coverage_rows() -> list[list[str]]:
    text = (ROOT / "docs/experiments.md").read_text()
    section = text.split("## Paper coverage\n", 1)[1].split("\n## ", 1)[0]
    return [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| paper") and not line.startswith("| ---")]


def test_paper_coverage_has_one_row_per_table_and_figure_of_each_paper():
    papers_dir = ROOT.parent / "shared" / "papers"
    if not papers_dir.is_dir():
        pytest.skip(f"the papers are not at {papers_dir}")
    rows = _coverage_rows()
    for paper, file in PAPERS.items():
        captions = set(re.findall(r"^(?:<b>)?(Table|Figure) (\d+):", (papers_dir / file).read_text(), re.M))
        expected = {("Fig." if kind == "Figure" else "Table", int(n)) for kind, n in captions}
        covered = []
        for row in rows:
            if row[0] != paper:
                continue
            found = re.match(r"(Tables?|Figs?\.) (\d+)(?:-(\d+))?", row[1])
            assert found, row
            kind = "Fig." if found.group(1).startswith("Fig") else "Table"
            covered += [(kind, n) for n in range(int(found.group(2)), int(found.group(3) or found.group(2)) + 1)]
        assert sorted(covered) == sorted(expected), paper  # each once, none missing
    for row in rows:
        assert re.match(r"(exact|substituted|left out)", row[3]), row
        for path in re.findall(r"`((?:configs|neox_dar|eval|bench)/[\w./-]+\.(?:yml|py))`", row[2]):
            assert (ROOT / path).exists(), path


def test_experiments_doc_budgets_and_versions_are_the_codes():
    import lm_eval

    text = _doc("experiments.md")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        six = {v: window_budget(attention_config("mswa", H=8, num_layers=6, window_size=128, mswa_variant=v))
               for v in ("full", "layers")}
        twelve = {v: window_budget(attention_config("mswa", H=8, num_layers=12, window_size=128, mswa_variant=v))
                  for v in ("full", "heads", "layers")}
    assert six["full"] == 250 / 256
    assert (f"MSWA at base `w` has {six['full']:.3f} of SWA's summed windows (250/256) and MSWA-l "
            f"{six['layers']:.3f}, against the paper's {twelve['full']:.3f} and {twelve['layers']:.3f}") in text
    assert (f"(MSWA 225/256 = {twelve['full']:.3f} of SWA's, MSWA-h and MSWA-l 15/16 = {twelve['heads']:.3f}") in text
    assert f"lm-eval {lm_eval.__version__} installed against the paper's 0.4.9.1" in text
    lora = (ROOT / "configs/finetune/mswa-lora.yml").read_text()
    assert all(f"\n{key}: {value}\n" in lora for key, value in (("train_iters", 2000), ("train_batch_size", 32),
                                                                  ("seq_length", 4096)))
    assert "(LoRA r 8, alpha 16, 2,000 steps of 32 x 4,096;" in text
