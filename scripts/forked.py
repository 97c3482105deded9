"""Python scripts run in children forked from one process that imported their libraries once: the GPU kit's
rehearsal (scripts/gpu_check.sh) and the tests' train.py runs (tests/fork_server.py). On the CPU a torch + dynamo +
DeepSpeed start costs seconds a process; a forked child starts where the imports left off.

    preload(["torch", "deepspeed"], ["train.py"])   # once, in the parent
    if os.fork() == 0:
        run_script(["train.py", *args])             # the child: `python train.py ARGS`; never returns
"""

from __future__ import annotations

import gc
import importlib
import os
import runpy
import sys
import traceback
from typing import NoReturn


def preload(modules: list[str], scripts: list[str]) -> None:
    """Import ``modules`` and the module-level imports of ``scripts`` (run as ``__preload__``: their ``main()`` does
    not run), then keep what they made out of later garbage collections (no copy-on-write of those pages in the
    children)."""
    for name in modules:
        importlib.import_module(name)
    for script in scripts:
        runpy.run_path(script, run_name="__preload__")
    gc.freeze()


def run_script(argv: list[str]) -> NoReturn:
    """Run ``argv[0]`` as ``python SCRIPT ARGS`` would (``__main__``, ``sys.argv``, ``sys.path[0]``) and leave this
    process with its exit status: 0, a ``SystemExit``'s code (a message printed to stderr, as Python does), or 1
    after printing the traceback of an exception."""
    code = 1
    try:
        sys.argv = argv
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
