"""The transformers config of an exported neox-dar model (``model_type: neox_dar``; ``trust_remote_code``).

Besides transformers' usual keys it holds, resolved by ``convert to-hf`` (nothing here re-derives a rule):

* ``neox_dar_block``: the layer shape of the model family, :class:`~.block.BlockShape` (:attr:`NeoxDarConfig.block`):
  the family, its module names, norm, residual wiring, query/key norms, activation, biases and rotary settings;
* ``neox_dar_layers``: one entry per layer, its layer type's ``export_spec()`` (the arguments of that type's
  ``build_variant``, in :data:`~.layer_types.LAYER_TYPES`): ``{"type": "windowed", "windows": [per query
  head, null = every earlier key]}`` (vanilla, SWA, MSWA), ``{"type": "aha", "window", "threshold"}``, ``{"type":
  "dar", "window", "d_down", "cache"}`` (uniform: window 0; ``cache``: ``keys`` or ``latent``), ``{"type":
  "linear", "feature_dim"}``, ``{"type": "dimpo", "d_proj"}``;
* ``neox_dar_config``: the model's neox-dar config keys, which ``python -m neox_dar.convert from-hf`` reads back.
"""

from transformers import PretrainedConfig

from .block import BlockShape


class NeoxDarConfig(PretrainedConfig):
    model_type = "neox_dar"

    def __init__(self, vocab_size: int = 50304, hidden_size: int = 512, num_hidden_layers: int = 6,
                 num_attention_heads: int = 8, num_key_value_heads: int | None = None, head_dim: int | None = None,
                 intermediate_size: int = 2048, max_position_embeddings: int = 2048,
                 neox_dar_block: dict | None = None, neox_dar_layers: list | None = None,
                 neox_dar_config: dict | None = None, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.intermediate_size = intermediate_size
        self.max_position_embeddings = max_position_embeddings
        self.neox_dar_block = neox_dar_block or {}
        self.neox_dar_layers = neox_dar_layers or []
        self.neox_dar_config = neox_dar_config or {}
        super().__init__(**kwargs)

    @property
    def block(self) -> BlockShape:
        """``neox_dar_block`` as its typed record."""
        return BlockShape.from_json(self.neox_dar_block)
