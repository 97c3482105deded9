"""Train (or continue training) a model.

    python train.py CONFIG.yml [MORE.yml ...] [key=value ...] [--max-epochs E]  # 1 process: CPU or one GPU
    torchrun --nproc_per_node 8 train.py CONFIG.yml ... save=runs/x          # data-parallel, one node
    deepspeed --num_gpus 8 train.py CONFIG.yml ... save=runs/x               # same, DeepSpeed's launcher
    srun python train.py ...   (MASTER_ADDR / MASTER_PORT exported)          # SLURM, one task per GPU

YAML files layer left to right, then ``key=value`` overrides (see docs/config_reference.md). ``save`` is
the run directory. Running the same command again continues from the newest complete checkpoint. Before starting,
rank 0 prints the token budget and the epochs of the training data it reads, a warning above one epoch (as ``sweep
plan``); ``--max-epochs E`` says that up to E are intended (a sweep's run: its sweep file's ``max_epochs``).

Exit codes: 0 done; 2 a problem with the config, the data, a checkpoint or the disk (one line; ``status.json``
says ``failed`` with the reason); 3 stopped early with a checkpoint (SIGTERM/SIGUSR1, a first Ctrl-C, or
exit_interval): run the same command again to continue; 130 a Ctrl-C during start-up or a second one in training
(one line). Any other failure (a bug) prints its traceback and also leaves ``failed``.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path


def _strip_launcher_args(argv: list[str]) -> list[str]:
    """Drop ``--local_rank=N`` (the ``deepspeed`` launcher adds it; LOCAL_RANK is in the environment too)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--local_rank", "--local-rank"):
            skip = True
        elif not a.startswith(("--local_rank=", "--local-rank=")):
            out.append(a)
    return out


def _take_max_epochs(args: list[str]) -> tuple[list[str], float | None]:
    """``args`` without ``--max-epochs E`` (or ``--max-epochs=E``), and E (None when not given); ValueError (one
    line) unless E is a number > 0."""
    out, value, i = [], None, 0
    while i < len(args):
        a = args[i]
        if a == "--max-epochs" or a.startswith("--max-epochs="):
            text = a.partition("=")[2] if "=" in a else (args[i + 1] if i + 1 < len(args) else "")
            i += 1 if "=" in a else 2
            try:
                value = float(text)
            except ValueError:
                value = float("nan")
            if not value > 0 or value == float("inf"):
                raise ValueError(f"--max-epochs wants a number > 0 (the epochs of the training data this run may read "
                                 f"without a warning), got {text!r}")
            continue
        out.append(a)
        i += 1
    return out, value


def main(argv: list[str] | None = None) -> int:
    from neox_dar.training.signals import catch_stops_early, release_early_stops

    catch_stops_early()  # a stop during start-up stops the run at its first step (SLURM's cancel, preemption)
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C during start-up, or a second one in training (the first stops at a step)
        print("train.py: interrupted (Ctrl-C); run the same command again to continue from the last checkpoint",
              file=sys.stderr)
        return 130
    finally:
        release_early_stops()


def _main(argv: list[str] | None) -> int:
    args = _strip_launcher_args(list(sys.argv[1:] if argv is None else argv))
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    try:
        args, max_epochs = _take_max_epochs(args)
    except ValueError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    from neox_dar.rundir import uninterrupted

    with uninterrupted():  # a Ctrl-C arrives after the imports: libraries interrupted mid-import crashed the start
        from neox_dar.config import ConfigError, split_args
        from neox_dar.notices import one_line_notices
        from neox_dar.training import startup  # the time per start-up phase, logged after the first step
        from neox_dar.training.checks import (check_training_config, epochs_line, foreign_save_warning, load_checked,
                                             other_run_warning, tokenizer_warnings)
        from neox_dar.training.distributed import world_size_from_env

    startup.mark("imports")
    one_line_notices()  # this package's warnings as `warning: ...`, one line
    paths, overrides = split_args(args)
    cfg = load_checked(paths, overrides)
    if cfg is None:
        return 2
    explained = _explained_errors()
    try:
        check_training_config(cfg, world_size_from_env())
    except explained as e:
        _record_failure(cfg, e)
        print(f"{'config error' if isinstance(e, ConfigError) else 'error'}: {e}", file=sys.stderr)
        return 2
    if os.environ.get("RANK", "0") == "0":
        print(epochs_line(cfg, world_size_from_env(), max_epochs), file=sys.stderr)
        for warning in [other_run_warning(paths, cfg), foreign_save_warning(cfg), *tokenizer_warnings(cfg)]:
            if warning:
                print(warning, file=sys.stderr)

    # torch's deprecation notices for the collectives DeepSpeed calls, once per call site and step
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    startup.mark("config")
    with uninterrupted():
        from neox_dar.training.distributed import init_distributed
        from neox_dar.attention.triton_bridge import AttentionImplError
        from neox_dar.training.loop import DivergedError, train

    startup.mark("imports")
    info = init_distributed()
    startup.mark("process group")
    if info.rank != 0:
        logging.getLogger().setLevel(logging.WARNING)
    try:
        return train(cfg, info)  # records its own failures in status.json
    except (*explained, DivergedError, AttentionImplError) as e:  # the last: attention_impl cannot run here
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _explained_errors() -> tuple[type[BaseException], ...]:
    """Errors that explain themselves in one line (config, data, checkpoint, tokenizer, disk): printed without a
    traceback."""
    from neox_dar.config import ConfigError
    from neox_dar.data import DataSplitError, IndexedDatasetError
    from neox_dar.evaluation.corpora import CorpusError
    from neox_dar.rundir import CheckpointError, RunFileError, RunWriteError
    from neox_dar.tokenizer import TokenizerError

    return (ConfigError, CheckpointError, IndexedDatasetError, DataSplitError, TokenizerError, RunFileError,
            RunWriteError, CorpusError)


def _record_failure(cfg, error: BaseException) -> None:
    """Rank 0: status.json = failed with the reason, when the run directory exists (a requeued job then stops).
    Only with the run's lock held: a run another trainer holds is left alone, and so is a run that is done."""
    from neox_dar.rundir import (RunFileError, RunLockedError, lock_run_dir, read_status, recorded_checkpoint,
                                 write_status)

    save = cfg.run.save and Path(cfg.run.save)
    if not save or os.environ.get("RANK", "0") != "0":
        return
    try:
        if not save.is_dir():
            return
        lock = lock_run_dir(save)
    except (RunLockedError, RunFileError, OSError):  # OSError: also a name too long to be a directory
        return
    try:
        previous = read_status(save) or {}
        if previous.get("state") != "done":
            write_status(save, "failed", previous.get("step", 0), previous.get("train_iters", cfg.training.train_iters),
                         checkpoint=recorded_checkpoint(save), reason=f"{type(error).__name__}: {error}"[:500])
    except (OSError, RunFileError) as e:
        print(f"warning: could not record the failure in {save}: {e}", file=sys.stderr)
    finally:
        lock.release()


def exit_process(code: int | None) -> None:
    """Leave with ``code``. A rank of a multi-process run leaves without the interpreter's teardown: by now its
    files are written and its process group destroyed (``main``), and C++ destructors that run in that teardown
    sometimes abort the process ("terminate called without an active exception", SIGABRT, after the run's last
    line: about 1 two-rank CPU run in 10 under load), which made a finished run a failed one. Exit handlers run
    and the standard streams are flushed first. A single process exits normally, and so does an interrupted one
    (130) without importing anything: a Ctrl-C during start-up may have left torch half-imported, and importing it
    again raised or crashed."""
    if code == 130:
        sys.exit(code)
    from neox_dar.config import ConfigError
    from neox_dar.training.distributed import world_size_from_env

    try:
        several = world_size_from_env() > 1
    except ConfigError:  # ranks without their rendezvous (main said so): this process leaves alone
        several = False
    if several:
        import atexit

        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code or 0)
    sys.exit(code)


if __name__ == "__main__":
    exit_process(main())
