"""``python -m neox_dar.attention``: the registered variants as the Markdown table of the README."""

from . import registry

print(registry.table())
