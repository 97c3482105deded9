"""Train (or continue training) a model.

    python train.py CONFIG.yml [MORE.yml ...] [key=value ...]                 # 1 process: CPU or one GPU
    torchrun --nproc_per_node 8 train.py CONFIG.yml ... save=runs/x          # data-parallel, one node
    deepspeed --num_gpus 8 train.py CONFIG.yml ... save=runs/x               # same, DeepSpeed's launcher
    srun python train.py ...   (MASTER_ADDR / MASTER_PORT exported)          # SLURM, one task per GPU

YAML files layer left to right, then ``key=value`` overrides (see docs/config_reference.md). ``save`` is
the run directory. Running the same command again continues from the newest complete checkpoint.

Exit codes: 0 done; 2 configuration error (one line, before any work); 3 stopped early with a
checkpoint (SIGTERM/SIGUSR1 or exit_interval): run the same command again to continue.
"""

from __future__ import annotations

import logging
import sys
import warnings


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


def check_config(cfg, world_size: int) -> None:
    """Training-specific config rules that need the data-parallel size; raises ConfigError."""
    from neox_dar.config import ConfigError

    if not cfg.save:
        raise ConfigError("'save' (the run directory) must be set, e.g. save=runs/my_run")
    cfg.gradient_accumulation_for(world_size)
    if not (cfg.data_path or cfg.train_data_paths):
        raise ConfigError("no training data: set 'data_path' (one dataset split by 'split') or 'train_data_paths'")
    if cfg.dtype_name == "bf16" and cfg.zero_optimization.stage == 0:
        raise ConfigError("precision bf16 (the default on GPUs) needs zero_optimization.stage >= 1: DeepSpeed keeps "
                          "fp32 master weights for bf16 only under ZeRO (stage 1 on one GPU costs nothing)")
    from neox_dar.data import IndexedDatasetError, check_data_files

    try:
        check_data_files(cfg)  # every data file: header, sizes, dtype, token ids against vocab_size
    except IndexedDatasetError as e:
        raise ConfigError(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    args = _strip_launcher_args(list(sys.argv[1:] if argv is None else argv))
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    from neox_dar.config import ConfigError, load_config, split_args
    from neox_dar.training.distributed import world_size_from_env

    paths, overrides = split_args(args)
    try:
        cfg = load_config(*paths, overrides=overrides)
        check_config(cfg, world_size_from_env())
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2

    # torch's deprecation notices for the collectives DeepSpeed calls, once per call site and step
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    from neox_dar.training.distributed import init_distributed
    from neox_dar.training.loop import train

    info = init_distributed()
    if info.rank != 0:
        logging.getLogger().setLevel(logging.WARNING)
    try:
        return train(cfg, info)
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
