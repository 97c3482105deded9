"""``python -m neox_dar.config FILES... [key=value ...]``: print the resolved config; ``--reference``: every key."""

from __future__ import annotations

import sys
import typing

from . import __doc__ as package_doc
from .files import split_args
from .reference import derived_summary, reference_markdown
from ..notices import one_line_notices


def main(argv: typing.Sequence[str] | None = None) -> int:
    one_line_notices()  # this package's warnings as `warning: ...`, one line
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv in (["-h"], ["--help"]):
        print(package_doc)
        return 0
    if argv == ["--reference"]:
        print(reference_markdown(), end="")
        return 0
    if "--reference" in argv:
        print("config error: --reference prints every key and takes no other argument", file=sys.stderr)
        return 2
    from ..training.checks import load_checked  # imports torch: not for --help and --reference

    paths, overrides = split_args(argv)
    cfg = load_checked(paths, overrides)
    if cfg is None:
        return 2
    print(cfg.to_yaml(), end="")
    print("# derived: " + ", ".join(f"{k}={v}" for k, v in derived_summary(cfg).items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
