"""Every command the README, the docs and the GPU kit name is run by a test: a script or module entry point that no
test runs rots unnoticed. A static guard: each `python -m MODULE` and each script path (`bench/x.py`,
`scripts/x.sh`, ...) named there must be run somewhere in tests/ (by its path, its `-m` name, or its `main`),
bench/*.py through tests/test_bench.py's glob, the set-up and test scripts by CI itself (.ci/run), and the few that
tests run through another file by that file (:data:`INDIRECT`, itself checked)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAMING = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "scripts" / "gpu_check.sh"]
NOT_OURS = {"venv", "pip", "pytest"}
RUN_BY_CI = {"scripts/setup.sh", "scripts/test.sh"}  # .ci/run: the install, then the suite itself

# Run by the tests through other files: chains from a test to what it runs last, each link naming the next
INDIRECT = [
    ["tests/test_bench.py", "bench/quickstart.py", "scripts/quickstart.sh"],
    ["tests/test_slurm.py", "neox_dar/sweep/slurm.py", "slurm/sweep.sbatch", "neox_dar.sweep.job"],  # job scripts
    ["tests/test_slurm.py", "neox_dar/sweep/slurm.py", "slurm/launch_node.sh"],  # the launcher those jobs start
    ["tests/test_finetune_demo.py", "README.md", "neox_dar.tiny_hf_model"],  # the walkthrough the test runs by line
]


def named() -> tuple[set[str], set[str]]:
    """The modules (`python -m M`, or a path under neox_dar/ that runs as one) and the script paths the documents
    name."""
    text = "\n".join(p.read_text() for p in NAMING)
    modules = set(re.findall(r"python3? -m ([A-Za-z_][\w.]*)", text)) - NOT_OURS
    paths = set(re.findall(r"\b((?:bench|scripts|eval|data_prep|slurm|neox_dar)/[\w/.-]+\.(?:py|sh))\b", text))
    scripts = {"train.py"}
    for p in paths:  # a module file counts only when it runs as a script
        if (ROOT / p).is_file() and (p.endswith(".sh") or "__main__" in (ROOT / p).read_text()):
            if p.startswith("neox_dar/"):
                modules.add(p.removesuffix(".py").replace("/", "."))
            else:
                scripts.add(p)
    return modules, scripts


def text_of_tests() -> str:
    return "\n".join(p.read_text() for p in (ROOT / "tests").glob("*.py") if p.name != Path(__file__).name)


def indirect() -> set[str]:
    return {chain[-1] for chain in INDIRECT}


def module_is_run(module: str, text: str) -> bool:
    """Run as `-m` or through its `main` (imported from it, or called on the module imported from its package), by
    name or module_name()."""
    short = module.removeprefix("neox_dar.")
    parent, _, leaf = module.rpartition(".")
    quoted = [f'"{module}"', f"'{module}'", f"-m {module}", f'module_name("{short}")', f"{module}.main"]
    return any(q in text for q in quoted) or bool(
        re.search(rf"from {re.escape(module)}(?:\.__main__)? import \(?[\w, \n]*\bmain\b", text)
        or (re.search(rf"from {re.escape(parent)} import [\w, ]*\b{leaf}\b", text) and f"{leaf}.main(" in text))


def test_the_indirect_chains_hold():
    """Each link of :data:`INDIRECT` names the next: by its path, its file name, or its module name."""
    for chain in INDIRECT:
        for this, following in zip(chain, chain[1:]):
            text = (ROOT / this).read_text()
            forms = {following, Path(following).name, following.removesuffix(".py").replace("/", ".")}
            assert any(f in text for f in forms), f"{this} does not name {following}"


def test_every_named_module_is_run_by_a_test():
    modules, _ = named()
    assert {"eval.perplexity", "neox_dar.convert", "data_prep.tokenize"} <= modules  # the scan finds them
    text = text_of_tests()
    missing = sorted(m for m in modules - indirect() if not module_is_run(m, text))
    assert not missing, f"named in the README/docs/GPU kit, run by no test: {missing}"


def test_every_named_script_is_run_by_a_test():
    _, scripts = named()
    assert {"train.py", "scripts/gpu_check.sh", "bench/gpu_targets.py"} <= scripts  # the scan finds them
    text = text_of_tests()
    bench_smoke = (ROOT / "tests" / "test_bench.py").read_text()
    missing = []
    for path in sorted(scripts - RUN_BY_CI - indirect()):
        name = Path(path).name
        if path.startswith("bench/"):
            ok = f'"{name}": (' in bench_smoke  # test_bench runs each bench/*.py at its smallest arguments
        else:
            ok = path in text or f'"{name}"' in text or (
                path.endswith(".py") and module_is_run(path.removesuffix(".py").replace("/", "."), text))
        if not ok:
            missing.append(path)
    assert not missing, f"named in the README/docs/GPU kit, run by no test: {missing}"


def test_training_examples_in_the_docs_run_the_variant_they_name():
    """Every `python train.py ...` example in the README and the docs that names an attention preset loads (data and
    run folder aside) without the warning that its window spans the whole sequence: such an example would train
    vanilla attention under the variant's name."""
    import shlex
    import warnings

    from neox_dar.config import load_config, split_args

    examples = []
    for doc in NAMING[:-1]:
        text = re.sub(r"\\\n\s*", " ", doc.read_text())  # continued lines joined
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("python train.py ") and "configs/attention/" in line and "..." not in line:
                examples.append((doc.name, line))
    assert len(examples) >= 3
    for doc, line in examples:
        words = shlex.split(line)[2:]
        if "--max-epochs" in words:  # train.py's own option, not the config's
            del words[words.index("--max-epochs"):words.index("--max-epochs") + 2]
        args = [a for a in words if not a.startswith(("data_path=", "save=", "train_data_paths=", "valid_data_paths="))]
        paths, overrides = split_args(args)
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            try:
                load_config(*(ROOT / p for p in paths), overrides=overrides)
            except UserWarning as w:
                raise AssertionError(f"{doc}: `{line}` warns: {w}") from None


def test_every_relative_data_path_in_the_docs_is_one_a_shown_command_writes():
    """A `data_path=` under runs/ in the README or the docs is the `--out` of a `data_prep.tokenize` command they
    show (so copying the commands in order works); absolute paths and placeholders stand for the user's data."""
    text = "\n".join(p.read_text() for p in NAMING[:-1])
    written = set(re.findall(r"data_prep\.tokenize [^\n`]*--out (\S+)", text))
    used = set(re.findall(r"data_path=(runs/[\w/.-]+)", text))
    assert used and used <= written, f"data paths no shown command writes: {sorted(used - written)}"
