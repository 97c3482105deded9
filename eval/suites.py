"""The papers' downstream suites: each a list of (lm-eval task, few-shot count, metric) as the paper ran it, the
context length every model it compares is evaluated at, and whether prompts shorter than the window are dropped
(:data:`SUITES`); more from a YAML suite file (:func:`load_suites`). :mod:`eval.downstream` runs them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from neox_dar.config import ConfigError
from neox_dar.config.files import load_yaml
from neox_dar.dimpo.tasks import PAPER_TASKS, TASK_TITLES


@dataclass(frozen=True)
class SuiteTask:
    task: str  # lm-eval task or group name
    shots: int
    metric: str  # lm-eval's result key, e.g. "acc_norm,none"
    label: str = ""


@dataclass(frozen=True)
class Suite:
    paper: str
    tasks: tuple[SuiteTask, ...]
    min_context: str | None = None  # "window": drop documents whose prompt is shorter than the model's window
    relative: str = "Rel. (%)"
    notes: str = ""
    max_length: int | None = None  # the context length of every model the suite compares (None: each one's own)
    metadata: dict | None = None  # lm-eval task metadata (RULER's max_seq_lengths); the model's tokenizer is added


def _tasks(*rows: tuple) -> tuple[SuiteTask, ...]:
    return tuple(SuiteTask(*row) for row in rows)


_DAR_AHA = (("mmlu", 5, "acc,none", "MMLU"), ("hellaswag", 5, "acc_norm,none", "HellaSwag"),
            ("commonsense_qa", 5, "acc,none", "CSQA"))
OLMO2_CONTEXT = 4096  # OLMo-2-0425-1B(-SFT)'s max_position_embeddings: DAR's and AHA's suites evaluate every model here
LLAMA2_CONTEXT = 4096  # Llama-2-7B's context and MSWA's fine-tuning sequence length (Appendix B.2.2)
RULER_CONTEXT = 8192  # DimPO Table 4's longest RULER length
_COMMONSENSE = (("piqa", "PIQA"), ("openbookqa", "OBQA"), ("winogrande", "WinoGrande"), ("hellaswag", "HellaSwag"),
                ("boolq", "BoolQ"), ("copa", "COPA"), ("arc_easy", "ARC-e"), ("arc_challenge", "ARC-c"))
SUITES: dict[str, Suite] = {
    "dar-table4": Suite(
        "DAR Table 4 (Sec. 3.4)",
        _tasks(*_DAR_AHA, ("gsm8k", 5, "exact_match,flexible-extract", "GSM8K"), ("mbpp", 3, "pass_at_1,none", "MBPP"),
               ("longbench_multi_news", 0, "rouge_score,none", "Multi-News")),
        "window", "Rel. (%)", "relative to the no-bottleneck run (d_down = d); samples shorter than the window "
                              "dropped; GSM8K flexible-extract", OLMO2_CONTEXT),
    "aha-table1": Suite(
        "AHA Table 1 (Sec. 3.2)",
        _tasks(*_DAR_AHA, ("gsm8k", 5, "exact_match,strict-match", "GSM8K"), ("mbpp", 0, "pass_at_1,none", "MBPP"),
               ("longbench_multi_news", 0, "rouge_score,none", "MultiNews")),
        "window", "Retain %", "relative to the base model (OLMo-2-0425-1B-SFT); samples shorter than the window "
                              "dropped; GSM8K exact match (strict)", OLMO2_CONTEXT),
    "mswa-table4": Suite("MSWA Table 4, 3-shot (Sec. 5.2)",
                         _tasks(*((t, 3, "acc,none", label) for t, label in _COMMONSENSE)), max_length=LLAMA2_CONTEXT),
    "mswa-table4-5shot": Suite("MSWA Table 4, 5-shot (Sec. 5.2)",
                               _tasks(*((t, 5, "acc,none", label) for t, label in _COMMONSENSE)),
                               max_length=LLAMA2_CONTEXT),
    "dimpo-table2": Suite(
        "DimPO Tables 2-3 (Sec. 4)",
        _tasks(*((t, 0, f"{metric},none", TASK_TITLES[t]) for t, metric in PAPER_TASKS.items())),
        None, "Retain %", "relative to the unprojected model"),
    "dimpo-table4": Suite(
        "DimPO Table 4 (Sec. 4), RULER",
        _tasks(("ruler", 0, "4096,none", "RULER 4k"), ("ruler", 0, "8192,none", "RULER 8k")),
        None, "Retain %", "relative to the unprojected model; the mean over RULER's 13 subtasks at each length",
        RULER_CONTEXT, {"max_seq_lengths": [4096, 8192]}),
}
CODE_TASKS = {"mbpp"}  # their metric runs model-written code


class SuiteError(ValueError):
    """A bad suite, suite file or result file (one line)."""


def load_suites(path: str | None) -> dict[str, Suite]:
    """:data:`SUITES` plus the suites of a YAML file."""
    suites = dict(SUITES)
    if path is None:
        return suites
    try:
        data = load_yaml(Path(path)) or {}
        for name, spec in data.items():
            rows = [SuiteTask(str(t), int(s), str(m), str(t)) for t, s, m in spec["tasks"]]
            if not rows:
                raise ValueError("no tasks")
            if any(r.shots < 0 for r in rows):
                raise ValueError(f"shots must be >= 0, got {min(r.shots for r in rows)}")
            max_length = spec.get("max_length")
            if max_length is not None and (type(max_length) is not int or max_length < 1):
                raise ValueError(f"max_length must be an integer >= 1 or null, got {max_length!r}")
            metadata = spec.get("metadata")
            if metadata is not None and not isinstance(metadata, dict):
                raise ValueError(f"metadata must be a mapping, got {metadata!r}")
            suites[name] = Suite(spec.get("paper", name), tuple(rows), spec.get("min_context"),
                                 spec.get("relative", "Rel. (%)"), spec.get("notes", ""), max_length, metadata)
    except ConfigError as e:  # not UTF-8, not YAML, a key given twice
        raise SuiteError(f"{e}; expected {{name: {{tasks: [[task, shots, metric], ...]}}}}") from None
    except (OSError, KeyError, TypeError, ValueError, AttributeError) as e:
        raise SuiteError(f"{path}: not a suite file ({type(e).__name__}: {e}); expected "
                         "{name: {tasks: [[task, shots, metric], ...]}}") from None
    return suites
