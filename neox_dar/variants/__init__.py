"""The attention variants as the rest of the project sees them, without torch: the registry of ``attention_type``
names (:mod:`.registry`), each variant's spec (its keys, rules, model-dependent defaults, descriptions and
statistics: :class:`~.spec.VariantSpec`, one module per built-in variant) and the per-layer layouts
(``attention_config``, ``hybrid``: :mod:`.layers`).

The config builds its schema and checks from this package, which imports nothing of :mod:`neox_dar.config`; a
spec's :meth:`~.spec.VariantSpec.module` imports the torch module that computes the variant (``neox_dar/attention/``)
when a model is built. The built-in variants are registered here, one line each. See ``docs/adding_a_variant.md``.
"""

from __future__ import annotations

from . import registry
from .aha import AHASpec
from .dar import DARSpec, UniformSpec
from .dimpo import DimPOSpec
from .layers import layer_types, mixed_variant
from .linear import LinearSpec
from .mswa import MSWASpec, mswa_window_table
from .registry import register, unregister, variant_keys, variants
from .spec import VariantSpec
from .swa import SWASpec
from .vanilla import VanillaSpec

register(VanillaSpec)
register(DARSpec)
register(UniformSpec)
register(SWASpec)
register(MSWASpec)
register(AHASpec)
register(LinearSpec)
register(DimPOSpec)


def variant(name: str) -> type[VariantSpec]:
    """The spec of an ``attention_type`` value: a registered variant, or, for a model with per-layer types (whose
    resolved ``attention_type`` joins them: ``linear+mswa``), the spec describing their mix
    (:func:`.layers.mixed_variant`). KeyError for an unregistered name."""
    return mixed_variant(name) if "+" in name else registry.variant(name)


__all__ = ["VariantSpec", "layer_types", "mswa_window_table", "register", "unregister", "variant", "variant_keys",
           "variants"]
