"""``python -m neox_dar.attention``: the registered variants as the Markdown table of the README."""

import argparse

from ..variants import registry

argparse.ArgumentParser(prog="python -m neox_dar.attention", description=__doc__.split(": ", 1)[1]).parse_args()
print(registry.table())
