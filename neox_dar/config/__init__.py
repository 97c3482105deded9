"""One typed, validated, sectioned configuration: model (with its attention), training, data and run.

Configs are YAML files with flat GPT-NeoX key names. Several files layer: a key in a later file overrides the same
key in an earlier one (nested mappings merge key by key), then ``key=value`` overrides from the command line apply,
with dotted paths for nested keys (``optimizer.params.lr=3e-4``). Hyphens and underscores in keys are the same key,
as in GPT-NeoX. The loaded :class:`Config` groups the keys in sections (``cfg.model.hidden_size``,
``cfg.model.attention.window_size``, ``cfg.training.train_iters``, ``cfg.data.split``, ``cfg.run.save``); attention
variants add their own keys (:mod:`neox_dar.variants.registry`).

Every error (unknown key, wrong type, impossible value, missing file, malformed YAML) is a :class:`ConfigError`
with a one-line message naming the key and the file it came from, raised before any work starts.

    python -m neox_dar.config configs/pythia-70m.yml configs/attention/dar.yml dar_d_down=64
    python -m neox_dar.config --reference      # Markdown reference of every key
"""

from ..config_fields import ConfigError, Key, check, setting
from .files import split_args
from .loading import load_config, model_config_from_flat
from .model_schema import ModelConfig, attention_config_class
from .neox import NEOX_IGNORED_KEYS
from .reference import derived_summary, reference_markdown
from .schema import DataConfig, RunConfig, TrainingConfig, key_field, split_shares
from .typed import Config, model_config_diff, model_flat

__all__ = ["NEOX_IGNORED_KEYS", "Config", "ConfigError", "DataConfig", "Key", "ModelConfig", "RunConfig",
           "TrainingConfig", "attention_config_class", "check", "derived_summary", "key_field", "load_config",
           "model_config_diff", "model_config_from_flat", "model_flat", "reference_markdown", "setting", "split_args",
           "split_shares"]
