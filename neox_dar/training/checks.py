"""Config rules that only training has: they need the data-parallel size, the run directory or the data files."""

from __future__ import annotations

from ..config import Config, ConfigError
from ..data import IndexedDatasetError, check_data_files


def check_training_config(cfg: Config, world_size: int) -> None:
    """Raise a one-line ConfigError when ``cfg`` cannot train with ``world_size`` data-parallel ranks: no ``save``,
    a global batch that does not divide, no data, bf16 without ZeRO, or a damaged data file (header, sizes, dtype
    and token ids against ``vocab_size``: :func:`neox_dar.data.check_data_files`)."""
    if not cfg.run.save:
        raise ConfigError("'save' (the run directory) must be set, e.g. save=runs/my_run")
    cfg.training.gradient_accumulation_for(world_size)
    if not (cfg.data.data_path or cfg.data.train_data_paths):
        raise ConfigError("no training data: set 'data_path' (one dataset split by 'split') or 'train_data_paths'")
    if cfg.training.dtype == "bf16" and cfg.training.zero_optimization.stage == 0:
        raise ConfigError("precision bf16 (the default on GPUs) needs zero_optimization.stage >= 1: DeepSpeed keeps "
                          "fp32 master weights for bf16 only under ZeRO (stage 1 on one GPU costs nothing)")
    try:
        check_data_files(cfg)
    except IndexedDatasetError as e:
        raise ConfigError(str(e)) from None
