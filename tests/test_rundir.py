"""The run directory's checkpoint files without training: manifests with checksums, verification, atomic
publication and deletion (killed for real at the fault points), leftovers, and loading that refuses damaged,
mismatched or untrusted checkpoints with one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from neox_dar.saved_model import load_model, save_weights
from neox_dar.config import load_config
from neox_dar.model import build_model
from neox_dar.rundir import (DEL_PREFIX, KILL_AT_ENV, LATEST, STATE, TMP_PREFIX, WEIGHTS, CheckpointError,
                             clean_leftovers, newest_checkpoint, prune, read_metrics, resolve_checkpoint,
                             set_aside_newer, step_dir_name, step_dirs, truncate_metrics, verify)
from neox_dar.training.checkpointing import safe_torch_load

from builders import published_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def test_manifest_catches_missing_truncated_and_same_size_corruption(tmp_path):
    root = tmp_path / "checkpoints"
    good, truncated, corrupt, missing, no_state = (published_checkpoint(root, s) for s in (10, 20, 30, 40, 50))
    (truncated / WEIGHTS).write_bytes(b"w" * 10)
    with open(corrupt / "rng_rank00000.pt", "r+b") as f:  # same size, other bytes
        f.write(b"\0" * 4)
    (missing / "rng_rank00000.pt").unlink()
    (no_state / STATE).unlink()
    assert verify(good) is None
    assert "has 10 bytes, the manifest says 64" in verify(truncated)
    assert verify(corrupt) == "rng_rank00000.pt is corrupt (its xxh3_64 checksum differs from the manifest)"
    assert verify(corrupt, checksums=False) is None  # sizes alone miss it
    assert verify(missing) == "rng_rank00000.pt is missing"
    assert verify(no_state) == f"no {STATE}"
    warnings = []
    assert newest_checkpoint(tmp_path, warn=warnings.append) == good
    assert len(warnings) == 4 and all("skipping checkpoint" in w for w in warnings)
    assert newest_checkpoint(tmp_path / "empty") is None
    for bad in (truncated, corrupt, missing, no_state):  # loaders refuse a named damaged checkpoint
        with pytest.raises(CheckpointError, match="refusing checkpoint"):
            resolve_checkpoint(bad)
    assert resolve_checkpoint(tmp_path) == good and resolve_checkpoint(good) == good


def test_publish_replaces_a_checkpoint_of_the_same_step(tmp_path):
    """A save never keeps another checkpoint's bytes under its name."""
    root = tmp_path / "checkpoints"
    published_checkpoint(root, 5, b"old" * 8)
    new = published_checkpoint(root, 5, b"new" * 8)
    assert (new / WEIGHTS).read_bytes() == b"new" * 8 and verify(new) is None
    assert (root / LATEST).read_text().strip() == step_dir_name(5)
    assert sorted(p.name for p in root.iterdir()) == sorted([LATEST, step_dir_name(5)])


def test_prune_keeps_the_newest_complete(tmp_path):
    root = tmp_path / "checkpoints"
    for s in (1, 2, 3, 4):
        published_checkpoint(root, s)
    (root / step_dir_name(4) / WEIGHTS).write_bytes(b"x")  # incomplete: does not count as kept
    assert prune(root, keep_last_n=None) == [] and [s for s, _ in step_dirs(root)] == [4, 3, 2, 1]  # keep all
    prune(root, keep_last_n=2)
    assert [s for s, _ in step_dirs(root)] == [4, 3, 2]
    assert not [p for p in root.iterdir() if p.name.startswith((TMP_PREFIX, DEL_PREFIX))]


def test_a_checkpoint_that_failed_its_check_is_set_aside_and_pruning_keeps_the_good_ones(tmp_path):
    """A resume sets the checkpoints newer than the one it continues (each failed its check) aside as
    ``failed-step_N`` and points ``latest`` at the resumed one. (Before: pruning, which checks sizes only, counted
    a same-size corrupt checkpoint as complete, deleted the good ones older than it and kept it.)"""
    root = tmp_path / "checkpoints"
    good = published_checkpoint(root, 15)
    corrupt = published_checkpoint(root, 18)
    with open(corrupt / "rng_rank00000.pt", "r+b") as f:
        f.write(b"\0" * 4)
    published_checkpoint(root / "elsewhere", 18).rename(root / "failed-step_00000018")  # an earlier one aside
    warnings = []
    assert newest_checkpoint(tmp_path, warn=warnings.append) == good
    assert set_aside_newer(root, good, warn=warnings.append) == [root / "failed-step_00000018.2"]
    assert warnings[-1] == (f"set {corrupt} aside as failed-step_00000018.2 (it failed its check): kept for "
                            "inspection, never resumed or pruned; delete it when done")
    assert (root / LATEST).read_text().strip() == good.name and set_aside_newer(root, good) == []
    published_checkpoint(root, 20)
    prune(root, keep_last_n=2)
    assert [s for s, _ in step_dirs(root)] == [20, 15]
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("failed-")) == [
        "failed-step_00000018", "failed-step_00000018.2"]


_PRUNE = """
import sys
from pathlib import Path
from neox_dar.rundir import prune
prune(Path(sys.argv[1]), keep_last_n=1)
"""


@pytest.mark.parametrize("point", ["prune-renamed", "prune-deleting"])
def test_a_kill_while_pruning_leaves_no_half_deleted_checkpoint(tmp_path, point):
    """SIGKILL inside prune: the doomed checkpoint is either whole or renamed .del-*, which start-up removes.
    (The old in-place rmtree left a step_* directory without its manifest, never cleaned.)"""
    root = tmp_path / "checkpoints"
    for s in (1, 2, 3):
        published_checkpoint(root, s)
    proc = subprocess.run([sys.executable, "-c", _PRUNE, str(root)], env={**os.environ, KILL_AT_ENV: point},
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    for _, d in step_dirs(root):
        assert verify(d) is None  # no step directory is half deleted
    warnings = []
    clean_leftovers(root, warn=warnings.append)
    assert not [p for p in root.iterdir() if p.name.startswith(DEL_PREFIX)]
    assert len(warnings) == (1 if point == "prune-renamed" else 0)
    prune(root, keep_last_n=1)
    assert [s for s, _ in step_dirs(root)] == [3]


def test_leftovers_of_interrupted_writes_and_old_deletions_are_removed(tmp_path):
    root = tmp_path / "checkpoints"
    keep = published_checkpoint(root, 4)
    (root / (TMP_PREFIX + step_dir_name(6))).mkdir()
    (root / (DEL_PREFIX + step_dir_name(2))).mkdir()
    half_deleted = root / step_dir_name(3)  # what the old rmtree left: files gone, manifest gone first
    half_deleted.mkdir()
    (half_deleted / "mp_rank_00_model_states.pt").write_bytes(b"m")
    corrupt = published_checkpoint(root, 5)
    (corrupt / "rng_rank00000.pt").write_bytes(b"R" * 16)
    warnings = []
    removed = clean_leftovers(root, warn=warnings.append)
    assert sorted(p.name for p in removed) == sorted([TMP_PREFIX + step_dir_name(6), DEL_PREFIX + step_dir_name(2),
                                                      step_dir_name(3)])
    assert len(warnings) == 3
    assert corrupt.is_dir() and keep.is_dir()  # a corrupt checkpoint is kept for inspection, skipped on resume
    assert newest_checkpoint(tmp_path, warn=None) == keep


_WRITE = """
import resource, sys
from neox_dar.rundir import write_text_atomic
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
try:
    write_text_atomic(sys.argv[1], "x" * 5000)
except OSError as e:
    print(e)
"""


def test_a_failed_atomic_write_names_the_path_and_leaves_nothing(tmp_path):
    target = tmp_path / "status.json"
    target.write_text("old")
    out = subprocess.run([sys.executable, "-c", _WRITE, str(target)], cwd=ROOT, capture_output=True, text=True)
    assert f"cannot write {target}" in out.stdout and "GiB free on" in out.stdout, out.stdout + out.stderr
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["status.json"]


def test_truncate_metrics_drops_rows_after_the_resume_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, 8)) + '{"step": 8, "lo')
    truncate_metrics(tmp_path, 5)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4, 5]


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_pickled_callable_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "mp_rank_00_model_states.pt"
    torch.save({"module": {"w": torch.ones(2)}, "hook": _Payload(marker)}, path)
    with pytest.raises(CheckpointError, match=r"holds pickled (posix|os)\.system.*trust"):
        safe_torch_load(path)
    assert not marker.exists()
    clean = tmp_path / "clean.pt"
    torch.save({"module": {"w": torch.ones(2)}, "step": 3}, clean)
    assert safe_torch_load(clean)["step"] == 3


@pytest.fixture
def weights_dir(tmp_path) -> Path:
    cfg = load_config("configs/tiny.yml", overrides=["attention_type=dar"]).model
    torch.manual_seed(0)
    return save_weights(build_model(cfg), cfg, tmp_path / "weights")


def test_weights_keep_the_step_they_were_trained_to(weights_dir, tmp_path):
    """save_weights(step=N) records N (a run's published weights, which evaluation then records as their step: a
    published checkpoint said step null, so its result had no budget for the report to check); None without."""
    from neox_dar.evaluation.loading import load_for_eval
    from neox_dar.rundir import checkpoint_step

    assert checkpoint_step(weights_dir) is None
    model, cfg = load_model(weights_dir)
    published = save_weights(model, cfg, tmp_path / "published", step=800)
    assert checkpoint_step(published) == 800 and load_for_eval(published).info["step"] == 800


def test_load_model_refuses_damaged_weights_in_one_line(weights_dir):
    model, _ = load_model(weights_dir)
    size = (weights_dir / WEIGHTS).stat().st_size
    with open(weights_dir / WEIGHTS, "r+b") as f:  # same-size garbage: NaN perplexity before, an error now
        f.seek(size // 2)
        f.write(b"\xff" * 4096)
    with pytest.raises(CheckpointError, match="model.safetensors is corrupt"):
        load_model(weights_dir)
    os.truncate(weights_dir / WEIGHTS, size // 2)
    with pytest.raises(CheckpointError, match="model.safetensors has"):
        load_model(weights_dir)


def test_load_model_names_a_config_that_no_longer_matches_the_weights(weights_dir):
    """A config edited after the fact (here: no manifest to catch it) is one line naming the tensor and shapes,
    not a size-mismatch traceback."""
    (weights_dir / STATE).unlink()
    text = (weights_dir / "model.yml").read_text().replace("dar_d_down: 16", "dar_d_down: 8")
    (weights_dir / "model.yml").write_text(text)
    with pytest.raises(CheckpointError, match=r"dar_down.weight has shape \(16, 64\), its config.yml implies \(8, 64\)"):
        load_model(weights_dir)


# ----------------------------------------------------------------------------------------------
# issue 24: links, changed state, concurrent pruning, full disks, bad paths


def test_run_files_are_never_written_through_a_symbolic_link(tmp_path):
    """A link planted as run.lock, slurm_jobs.txt or a temporary name: refused in one line or replaced, and its
    target keeps its bytes. (Before: `ln -s victim SAVE/run.lock` made the trainer write the lock into victim.)"""
    from neox_dar.rundir import JOBS, LOCK, RunFileError, lock_run_dir, record_job, write_status

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    save = tmp_path / "save"
    save.mkdir()
    for name in (LOCK, JOBS, f"{TMP_PREFIX}status.json.{os.getpid()}"):
        (save / name).symlink_to(victim)
    with pytest.raises(RunFileError, match=f"{save / LOCK} is a symbolic link"):
        lock_run_dir(save)
    with pytest.raises(RunFileError, match="is a symbolic link"):
        record_job(save, "123")
    write_status(save, "running", 0, 10)  # replaces the link at the temporary name, never follows it
    (save / "status.json").unlink()
    (save / "status.json").symlink_to(victim)
    write_status(save, "done", 10, 10)
    assert victim.read_text() == "precious\n" and not (save / "status.json").is_symlink()


def test_a_changed_state_json_is_refused(tmp_path):
    """`"step": 3` edited to `"step": 4` (same size) in state.json: the checkpoint fails its check (its own checksum),
    and a state rewritten with a matching checksum but another step than its directory's name fails too. (Before:
    it resumed at the edited step and silently skipped optimizer steps.)"""
    from neox_dar.rundir import write_manifest

    root = tmp_path / "checkpoints"
    edited, renamed = published_checkpoint(root, 3), published_checkpoint(root, 5)
    state = edited / STATE
    state.write_text(state.read_text().replace('"step": 3', '"step": 4'))
    assert verify(edited) == f"{STATE} is corrupt (its xxh3_64 checksum differs from its contents)"
    meta = {k: v for k, v in json.loads((renamed / STATE).read_text()).items() if k != "files"}
    write_manifest(renamed, {**meta, "step": 6})
    assert verify(renamed) == f"its name says step 5 but its {STATE} says step 6"
    legacy = published_checkpoint(root, 7)  # a state.json written before it had a checksum is still read
    body = json.loads((legacy / STATE).read_text())
    del body["checksum"]
    (legacy / STATE).write_text(json.dumps(body))
    assert verify(legacy) is None


def test_a_checkpoint_held_by_a_starting_run_survives_a_concurrent_prune(tmp_path):
    """Stage 2 holds stage 1's newest checkpoint while stage 1 publishes a newer one and prunes to 1: the held one
    stays whole until released and goes at the next prune; one pruned between being chosen and held is chosen
    again. (Before: stage 2 read a model.safetensors that the prune had just removed.)"""
    from neox_dar.rundir import checkpoints, hold_checkpoint

    root = tmp_path / "stage1" / "checkpoints"
    published_checkpoint(root, 1)
    held = hold_checkpoint(root.parent)
    assert held.path == root / step_dir_name(1)
    published_checkpoint(root, 2)
    prune(root, keep_last_n=1)
    assert [s for s, _ in step_dirs(root)] == [2, 1] and verify(held.path) is None
    held.release()
    prune(root, keep_last_n=1)
    assert [s for s, _ in step_dirs(root)] == [2]

    chosen = []
    real = checkpoints._hold

    def pruned_first(d):  # stage 1's prune renames the chosen checkpoint away just before it is held
        chosen.append(d)
        if len(chosen) == 1:
            published_checkpoint(root, 3)
            prune(root, keep_last_n=1)
        return real(d)

    checkpoints._hold = pruned_first
    try:
        again = hold_checkpoint(root.parent)
    finally:
        checkpoints._hold = real
    assert chosen == [root / step_dir_name(2), root / step_dir_name(3)] and again.path == root / step_dir_name(3)
    again.release()


_FULL_DISK = """
import os, sys
from pathlib import Path
from neox_dar.rundir import read_status, write_status, write_text_atomic
save = Path(sys.argv[1])
write_status(save, "running", 3, 10)
with open(save / "filler", "wb", buffering=0) as f:  # fill the file system
    try:
        while True:
            f.write(b"x" * 4096)
    except OSError:
        pass
try:
    write_text_atomic(save / "config.yml", "x" * 20000)
except OSError as e:
    print(e)
write_status(save, "failed", 3, 10, reason="disk full")
print(read_status(save)["state"])
"""


def test_a_full_disk_still_takes_the_final_status(tmp_path):
    """On a really full file system (a 1 MiB tmpfs in a private mount namespace): a write fails in one line naming
    the path and the free space, and status.json still becomes `failed` (rewritten in its own blocks). (Before:
    the status write failed too and status.json stayed `running`.)"""
    save = tmp_path / "mnt"
    save.mkdir()
    script = f"mount -t tmpfs -o size=1m tmpfs {save} && exec {sys.executable} -c '{_FULL_DISK}' {save}"
    out = subprocess.run(["unshare", "--mount", "--map-root-user", "sh", "-c", script], cwd=ROOT,
                         capture_output=True, text=True)
    if "mount" in out.stderr or "unshare" in out.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {out.stderr.strip()}")
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"cannot write {save / 'config.yml'}: No space left on device (0.00 GiB free on "), out
    assert lines[1] == "failed", out


def test_bad_run_directory_paths_are_one_line(tmp_path):
    """save that is a file, that cannot be created (under /proc), and run.lock that is a directory: one line each.
    (Before: FileExistsError, FileNotFoundError and IsADirectoryError tracebacks.)"""
    from neox_dar.rundir import LOCK, RunFileError, lock_run_dir

    (tmp_path / "file").write_text("x")
    with pytest.raises(RunFileError, match="is a file, not a directory"):
        lock_run_dir(tmp_path / "file")
    with pytest.raises(RunFileError, match="cannot create the run directory /proc/neox-dar-run"):
        lock_run_dir("/proc/neox-dar-run")
    (tmp_path / "run" / LOCK).mkdir(parents=True)
    with pytest.raises(RunFileError, match=f"{tmp_path / 'run' / LOCK} is a directory"):
        lock_run_dir(tmp_path / "run")


def test_a_staged_folder_removes_what_a_killed_writer_left_and_writes_through_a_link(tmp_path):
    """staged_dir (convert, prefetch, publish): the staging folder of a writer killed by SIGKILL or SIGTERM (no
    handler ran: a model-sized .tmp- folder stayed forever) is removed by the next write, a live writer's is not;
    a writer killed between its two renames left OUT missing beside its .del- folder, which is put back first; an
    OUT that is a symbolic link is written through (the swap renamed the link, then rmtree failed on it: exit 2
    with the link now a real folder)."""
    import fcntl

    from neox_dar.rundir import staged_dir

    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    dead = tmp_path / f"{TMP_PREFIX}out.4242"
    dead.mkdir()
    (dead / "weights").write_bytes(b"x" * 100)
    live = tmp_path / f"{TMP_PREFIX}out.4343"
    live.mkdir()
    other = tmp_path / f"{TMP_PREFIX}outer.4242"  # another folder's
    other.mkdir()
    held = os.open(live, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        with staged_dir(out) as stage:
            (stage / "new.txt").write_text("new")
    finally:
        os.close(held)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out", live.name, other.name])
    assert [p.name for p in out.iterdir()] == ["new.txt"]
    # killed between the renames: OUT gone, its earlier contents in .del-out.PID: restored, then replaced with keep
    os.rename(out, tmp_path / f"{DEL_PREFIX}out.4242")
    with staged_dir(out, keep=True) as stage:
        assert (stage / "new.txt").read_text() == "new"
        (stage / "more.txt").write_text("more")
    assert sorted(p.name for p in out.iterdir()) == ["more.txt", "new.txt"]
    real = tmp_path / "real"
    os.rename(out, real)
    out.symlink_to(real)
    with staged_dir(out) as stage:
        (stage / "linked.txt").write_text("through the link")
    assert out.is_symlink() and (real / "linked.txt").is_file() and not (real / "new.txt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((TMP_PREFIX + "real", DEL_PREFIX))]


def test_weights_files_are_readable_as_the_umask_allows(tmp_path):
    """model.safetensors of a saved model and of an export get the umask's mode like their sibling files
    (safetensors 0.8 wrote them 0600 through a private temporary file: unreadable to the group on a shared
    cluster folder)."""
    from neox_dar.hf import to_hf
    from neox_dar.tokenizer import DEFAULT_TOKENIZER

    cfg = load_config("configs/tiny.yml", overrides=["num_layers=1", "hidden_size=32", "num_attention_heads=2"])
    model = build_model(cfg.model)
    old = os.umask(0o022)
    try:
        save_weights(model, cfg.model, tmp_path / "saved")
        to_hf(model, cfg.model, tmp_path / "hf", DEFAULT_TOKENIZER)
    finally:
        os.umask(old)
    for folder in (tmp_path / "saved", tmp_path / "hf"):
        assert (folder / WEIGHTS).stat().st_mode & 0o777 == 0o644, folder
