"""``python -m neox_dar.attention``: the registered variants as the Markdown table of the README."""

from ..variants import registry

print(registry.table())
