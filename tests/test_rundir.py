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

from neox_dar.checkpoint import load_model, save_weights
from neox_dar.config import load_config
from neox_dar.model import build_model
from neox_dar.rundir import (DEL_PREFIX, KILL_AT_ENV, LATEST, STATE, TMP_PREFIX, WEIGHTS, CheckpointError,
                             clean_leftovers, newest_checkpoint, prune, read_metrics, resolve_checkpoint,
                             step_dir_name, step_dirs, truncate_metrics, verify)
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
    prune(root, keep_last_n=2)
    assert [s for s, _ in step_dirs(root)] == [4, 3, 2]
    assert not [p for p in root.iterdir() if p.name.startswith((TMP_PREFIX, DEL_PREFIX))]


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
