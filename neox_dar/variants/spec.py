"""What a variant declares: its ``attention_type`` name, config keys, the common keys it reads, statistics, rules,
model-dependent defaults and descriptions. Torch-free: the config reads these alone."""

from __future__ import annotations

import importlib
import warnings
from typing import Any, ClassVar

from ..config_fields import Key, check
from ..notices import Notice

# The model section of a loaded config (neox_dar.config.ModelConfig), which the specs' rules and descriptions read.
# The config package builds its schema from this package, so the type is named here, not imported.
ModelConfig = Any

KERNEL_MAX_HEAD_DIM = 256
"""The largest head_dim the project's Triton kernels take: ``kernels.runtime.MAX_HEAD_DIM``, read here without
importing Triton (a test holds the two equal)."""


class VariantSpec:
    """Base of every variant's declarations. A built-in variant subclasses it in ``neox_dar/variants/<name>.py``
    and names its torch module in :attr:`module_path`; the module (an :class:`~neox_dar.attention.base.Attention`
    subclass) holds the spec as its ``spec`` attribute (``class DARAttention(DARLayer, Attention): spec = DARSpec``).
    A plug-in registers its module class itself, which carries the spec the same way."""

    name: ClassVar[str] = ""                    # the attention_type value
    what: ClassVar[str] = ""                    # one line for the README's variant table (Markdown)
    doc: ClassVar[str] = "docs/attention.md"    # the page that gives its math and choices
    keys: ClassVar[dict[str, Key]] = {}         # config keys this variant adds (type, default, help, sweep label)
    reads: ClassVar[tuple[str, ...]] = ()       # common attention keys it reads, e.g. ("window_size",)
    stats: ClassVar[dict[str, str]] = {}        # per-head statistics it logs: name -> one-line meaning
    module_path: ClassVar[str] = ""             # the class that computes it, "package.module:Class"
    kernels: ClassVar[bool] = False             # its triton path runs the project's kernels (head_dim <= 256)

    @classmethod
    def module(cls) -> type:
        """The :class:`~neox_dar.attention.base.Attention` subclass that computes the variant: :attr:`module_path`,
        imported by name when a model is built (so the spec loads without torch, and this package imports nothing
        of :mod:`neox_dar.attention`). A plug-in registered as its module class is found by
        :func:`~.registry.module` instead."""
        if not cls.module_path:
            raise TypeError(f"{cls.__qualname__} declares a variant but names no module that computes it: set its "
                            "module_path, or register the module class whose `spec` it is")
        module, _, name = cls.module_path.partition(":")
        return getattr(importlib.import_module(module), name)

    # ---- configuration ------------------------------------------------------------------------------------
    @classmethod
    def reads_keys(cls) -> frozenset[str]:
        """Every attention key the variant reads: its own keys and the common ones in :attr:`reads`."""
        return frozenset(cls.keys) | frozenset(cls.reads)

    @classmethod
    def resolve(cls, cfg: ModelConfig) -> dict[str, Any]:
        """Values of its keys whose defaults depend on the model (e.g. ``dar_d_down: null`` -> d / 4)."""
        return {}

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        """Rules that hold when this variant is chosen; raise through :func:`neox_dar.config_fields.check`."""

    @classmethod
    def check_kernel_shape(cls, cfg: ModelConfig) -> None:
        """With :attr:`kernels`, ``attention_impl: triton`` needs ``head_dim <= KERNEL_MAX_HEAD_DIM`` (``auto`` takes
        sdpa above it); the config's rules call it for every variant in use."""
        if cls.kernels and cfg.attention.attention_impl == "triton":
            check(cfg.head_dim <= KERNEL_MAX_HEAD_DIM, "attention_impl", f"triton runs attention_type '{cls.name}' "
                  f"with the project's kernels, which take head_dim <= {KERNEL_MAX_HEAD_DIM} (head_dim is "
                  f"{cfg.head_dim}): use attention_impl: auto or sdpa", "triton")

    @classmethod
    def require_window(cls, cfg: ModelConfig) -> None:
        """``window_size >= 1``: for variants whose local path must see at least the token itself."""
        w = cfg.attention.window_size
        check(w >= 1, "window_size", f"must be >= 1 for attention_type '{cls.name}'", w)

    @classmethod
    def warn_if_window_holds_every_key(cls, cfg: ModelConfig, consequence: str) -> None:
        """Warn when ``window_size >= seq_length``: ``consequence`` says what the variant then computes."""
        w, T = cfg.attention.window_size, cfg.seq_length
        if w >= T:
            warnings.warn(f"window_size={w} >= seq_length={T}: {consequence}; a later config file or key may have "
                          "replaced the model config's window", Notice, stacklevel=7)

    # ---- descriptions -------------------------------------------------------------------------------------
    @classmethod
    def summary(cls, cfg: ModelConfig) -> str:
        """The attention in a few words for listings (sweep plans, the report): ``dar d_down=128 w=64``."""
        return cls.name

    @classmethod
    def label(cls, cfg: ModelConfig) -> str:
        """The kind of attention, for grouping runs in figures (``mswa-heads``); default: the name."""
        return cls.name

    @classmethod
    def describe(cls, cfg: ModelConfig) -> list[str]:
        """Lines ``python -m neox_dar.describe`` prints about the variant's own settings (windows, widths)."""
        return []
