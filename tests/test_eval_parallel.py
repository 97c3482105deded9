"""Data-parallel evaluation (issue 37, item 3): ranks score their shares of the windows and add up to the one-process
result bit for bit; `torchrun -m eval.perplexity` (docs/evaluation.md) and `torchrun -m neox_dar.sweep.evaluate`
with two gloo processes write the one-process JSON; the sweep's SLURM job evaluates through the training's launcher
on every GPU of its nodes, and `run --local` on its --nproc processes."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import threading
from pathlib import Path

import pytest

from neox_dar.evaluation.corpora import load_local
from neox_dar.evaluation.scoring import score_documents
from neox_dar.tokenizer import load_tokenizer

from builders import published_checkpoint, saved_run

ROOT = Path(__file__).resolve().parents[1]
TIMING = ("seconds", "tokens_per_second")  # the only fields a run's ranks may change


@pytest.fixture(scope="module")
def aha_run(tmp_path_factory):
    """A tiny AHA run (seq 32; its gates report ``mu_f``, so the attention statistics are checked too)."""
    root = tmp_path_factory.mktemp("aha") / "run"
    model, cfg = saved_run(root, "attention_type=aha")
    return root, model


def _in_threads(world: int, score):
    """``score(rank, all_gather)`` on ``world`` threads, ``all_gather`` exchanging objects between them as
    torch.distributed would between processes; the results in rank order (a thread's error is raised here)."""
    barrier, slots, results = threading.Barrier(world, timeout=120), [None] * world, [None] * world

    def gather(rank):
        def all_gather(obj):
            slots[rank] = obj
            barrier.wait()
            out = list(slots)
            barrier.wait()
            return out
        return all_gather

    def run(rank):
        try:
            results[rank] = score(rank, gather(rank))
        except BaseException as e:  # noqa: BLE001 - handed to the test
            results[rank] = e
            barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [r for r in results if isinstance(r, BaseException) and not isinstance(r, threading.BrokenBarrierError)]
    if errors:
        raise errors[0]
    return results


def test_ranks_add_up_to_the_one_process_sums_bit_for_bit(aha_run, one_thread):
    """1, 2 and 3 ranks (3: more ranks than some corpora's batches divide evenly, so a rank repeats a forward): every
    rank returns the one-process per-document NLLs and AHA's per-head mu_f exactly, not to a tolerance."""
    _, model = aha_run
    tok = load_tokenizer()
    docs = [d.text for d in load_local("c4")[:5]] + ["", "short"]
    ids = [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)]
    one = score_documents(model, ids, 32, 0, batch_size=3, progress=False)
    assert one.attention_stats and one.tokens[-2] == 0
    for world in (2, 3):
        models = [copy.deepcopy(model) for _ in range(world)]  # a model each: a forward leaves its statistics on it
        ranks = _in_threads(world, lambda rank, gather: score_documents(
            models[rank], ids, 32, 0, batch_size=3, progress=False, rank=rank, world_size=world, all_gather=gather))
        for r in ranks:
            assert r.nll == one.nll and r.tokens == one.tokens and r.windows == one.windows
            assert r.attention_stats == one.attention_stats
    with pytest.raises(ValueError, match="needs all_gather"):
        score_documents(model, ids, 32, 0, progress=False, rank=0, world_size=2)


def _doc_command(doc: str, start: str) -> list[str]:
    """The one command of ``doc`` (under docs/) that starts with ``start``, as words."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "docs" / doc).read_text())
    lines = [ln.split(" #", 1)[0].strip() for ln in text.splitlines() if ln.strip().startswith(start)]
    assert len(lines) == 1, f"docs/{doc}: one command starting with `{start}`, found {lines}"
    return shlex.split(lines[0])


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"}


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    return out


def _one_process(main, argv: list[str]) -> None:
    """The one-process run of a command (``python -m MODULE ARGV``) by its ``main``, in this process with one intra-op
    thread (as OMP_NUM_THREADS=1 gives each rank of the torchrun runs): what it prints is not read."""
    import contextlib
    import io

    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
            code = main(argv)
    finally:
        torch.set_num_threads(threads)
    assert code == 0, out.getvalue() + err.getvalue()


def _without_timing(results: dict) -> dict:
    """The results but the timings, ``ranks`` and the provenance (the command and its date differ by launch)."""
    corpora = {name: {k: v for k, v in r.items() if k not in TIMING} for name, r in results["corpora"].items()}
    return {**{k: v for k, v in results.items() if k not in ("ranks", "provenance")}, "corpora": corpora}


def test_torchrun_eval_perplexity_writes_the_one_process_results(aha_run, tmp_path):
    """docs/evaluation.md's `torchrun --nproc_per_node 8 -m eval.perplexity RUN --out F`, run as written with 2
    processes (gloo) on the tiny AHA run: its JSON is the one-process JSON (per document, mu_f per head) but for the
    timings and `ranks`; rank 0 alone prints the summary and draws its progress bar."""
    root, _ = aha_run
    words = _doc_command("evaluation.md", "torchrun --nproc_per_node 8 -m eval.perplexity")
    assert words[:2] == ["torchrun", "--nproc_per_node"] and "--out" in words
    words[0], words[2] = shutil.which("torchrun") or "torchrun", "2"
    run_at = words.index("-m") + 2
    words[run_at] = str(root)
    words[words.index("--out") + 1] = str(tmp_path / "two.json")
    # 3 C4 documents, and WikiText-103's first (1,252 tokens: its next two hold 8,000 more, which only cost time)
    test_only = ["--corpora", "c4,wikitext103", "--max-docs", "3", "--max-docs", "wikitext103=1", "--batch-size", "3",
                 "--per-document", "--no-wandb"]
    two = _run([*words, *test_only])
    from eval.perplexity import main  # python -m eval.perplexity, in this process

    _one_process(main, [str(root), *test_only, "--no-progress", "--out", str(tmp_path / "one.json")])
    a, b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "two"))
    assert (a["ranks"], b["ranks"]) == (1, 2)
    assert _without_timing(a) == _without_timing(b)
    assert b["corpora"]["c4"]["attention_stats"] and len(b["corpora"]["c4"]["per_document"]) == 3
    assert len(b["corpora"]["wikitext103"]["per_document"]) == 1
    assert two.stdout.count("c4: token ppl") == 1
    assert "rank 0's share of 2" in two.stderr and "rank 1's" not in two.stderr


def test_torchrun_sweep_evaluate_scores_the_run_and_its_extra_corpus_as_one_process(aha_run, tmp_path):
    """docs/cluster.md's `torchrun --nproc_per_node 8 -m neox_dar.sweep.evaluate RUN ...` (the sweep's evaluation
    step by hand), run as written with 2 processes and an extra corpus: eval/perplexity.json is the one-process file
    but for the timings and `ranks`."""
    root, _ = aha_run
    extra = tmp_path / "mine.jsonl"
    extra.write_text("".join(json.dumps({"text": d.text}) + "\n" for d in load_local("fineweb_edu")[:3]))
    words = _doc_command("cluster.md", "torchrun --nproc_per_node 8 -m neox_dar.sweep.evaluate")
    words[0], words[2] = shutil.which("torchrun") or "torchrun", "2"
    test_only = ["--extra", f"mine={extra}", "--max-docs", "2", "--batch-size", "2", "--no-wandb", "--no-progress"]
    runs = {n: tmp_path / n for n in ("one", "two")}
    for run in runs.values():
        shutil.copytree(root / "checkpoints", run / "checkpoints")
    run_at = words.index("-m") + 2
    from neox_dar.sweep.evaluate import main  # python -m neox_dar.sweep.evaluate, in this process

    assert words[run_at - 1] == "neox_dar.sweep.evaluate"
    _one_process(main, [str(runs["one"]), *words[run_at + 1:], *test_only])
    _run([*words[:run_at], str(runs["two"]), *words[run_at + 1:], *test_only])
    a, b = (json.loads((runs[n] / "eval" / "perplexity.json").read_text()) for n in ("one", "two"))
    assert set(b["corpora"]) == {"c4", "mine"} and b["ranks"] == 2
    assert {k: v for k, v in _without_timing(a).items() if k != "checkpoint"} == \
        {k: v for k, v in _without_timing(b).items() if k != "checkpoint"}


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_the_sweep_job_evaluates_on_every_gpu_of_its_nodes(tmp_path):
    """The generated sbatch starts the evaluation as it starts the training: one srun task per node running
    slurm/launch_node.sh, whose torchrun starts `-m neox_dar.sweep.evaluate RUN ...` on every GPU of the node
    (2 nodes x 4 here), with the job's rendezvous. A fake srun runs each node's command; a fake torchrun records it."""
    from neox_dar.sweep.local import eval_command, train_command
    from neox_dar.sweep.slurm import LAUNCHER, TRAIN_SCRIPT, SlurmSettings, job_script
    from neox_dar.sweep.planning import plan, write_plan
    from neox_dar.sweep.spec import parse_sweep

    sweep = parse_sweep({"name": "ev", "configs": ["configs/tiny.yml"], "set": {"train_iters": 20},
                         "runs": [{"name": "one"}], "eval": {"source": "local", "corpora": ["c4"], "max_docs": 1}},
                        tmp_path / "s.yml")
    run_dir = plan(sweep, tmp_path / "runs")[0].run_dir
    write_plan(sweep, plan(sweep, tmp_path / "runs"))
    settings = SlurmSettings.from_dict({"nodes": 2, "gpus_per_node": 4, "cpus_per_task": 2})
    script = job_script(settings, "ev", [run_dir], tmp_path / "logs", sweep.eval, workdir=ROOT)
    eval_line = next(ln for ln in script.splitlines() if "-m neox_dar.sweep.evaluate" in ln)
    assert eval_line.strip().startswith('bash "$LAUNCHER" "$NPROC_PER_NODE" -m neox_dar.sweep.evaluate "$RUN_DIR"')
    (tmp_path / "job.sbatch").write_text(script)
    published_checkpoint(run_dir / "checkpoints", 20)  # what the trainer leaves

    bin_dir, rec = tmp_path / "bin", tmp_path / "rec"
    bin_dir.mkdir()
    rec.mkdir()
    _executable(bin_dir / "srun", f"""#!/bin/bash
echo "srun $*" >> {rec}/srun.log
while [[ $1 == --* ]]; do shift; done
IFS=, read -r -a hosts <<<"$SLURM_JOB_NODELIST"
for i in "${{!hosts[@]}}"; do SLURM_NODEID=$i "$@" || exit $?; done
""")
    _executable(bin_dir / "scontrol", """#!/bin/bash
if [[ $1 == show && $2 == hostnames ]]; then tr , '\\n' <<<"$3"; fi
""")
    # plays the trainer (status done, a checkpoint) and records every start
    _executable(bin_dir / "fake_torchrun", f"""#!/bin/bash
echo "$*" >> {rec}/torchrun.log
if [[ " $* " != *" -m neox_dar.sweep.evaluate "* ]]; then
    echo '{{"state": "done", "step": 20, "train_iters": 20}}' > {run_dir}/status.json
fi
""")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TORCHRUN": str(bin_dir / "fake_torchrun"),
           "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu-a,gpu-b", "SLURM_JOB_NUM_NODES": "2",
           "SLURM_CPUS_PER_TASK": "2", "SLURM_GPUS_PER_NODE": "4"}
    out = subprocess.run(["bash", str(tmp_path / "job.sbatch")], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    starts = (rec / "torchrun.log").read_text().splitlines()
    assert len(starts) == 4, starts  # training, then evaluation, each on both nodes
    port = 12000 + 4242 % 20000
    for i, line in enumerate(starts):
        node = i % 2
        assert (f"--nnodes=2 --node_rank={node} --nproc_per_node=4 --master_addr=gpu-a --master_port={port} "
                "--max_restarts=0 ") in line
    assert starts[0].endswith(f"{TRAIN_SCRIPT} {run_dir / 'config.yml'}")
    assert f"-m neox_dar.sweep.evaluate {run_dir} --source local --corpora c4" in starts[2]
    srun = (rec / "srun.log").read_text().splitlines()
    assert len(srun) == 2 and all("--ntasks-per-node=1" in s and "--gpus-per-node=4" in s and str(LAUNCHER) in s
                                  for s in srun)
    assert "evaluating" in (run_dir / "logs" / "job.log").read_text()
    # run --local: the evaluation on the processes the training runs on
    assert eval_command(run_dir, sweep.eval, 1)[1:4] == ["-m", "neox_dar.sweep.evaluate", str(run_dir)]
    two = eval_command(run_dir, sweep.eval, 2)
    assert two[:5] == train_command(run_dir, 2)[:5] and two[5:8] == ["-m", "neox_dar.sweep.evaluate", str(run_dir)]
