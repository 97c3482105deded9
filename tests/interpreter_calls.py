"""The Triton CPU interpreter, in the suite, patches ``triton.language`` once per device function and launch.

Under ``TRITON_INTERPRET=1`` a kernel launch (``GridExecutor.__call__``) patches ``triton.language`` with the
interpreter's implementations for the whole launch and restores it at the end. Every call of a ``@triton.jit``
device function inside the launch (``InterpretedFunction.__call__``; our kernels call their row loops and tile
helpers once per tile) patches the language again: an ``inspect.getmembers`` walk of ``triton.language``,
``triton.language.tensor`` and ``triton.language.math`` that finds every member already patched. In the suite's
kernel tests that walk is about a third of the interpreter's time (``-k matches_reference`` of
``tests/test_kernels.py``, two workers: 126 -> 81 CPU-seconds).

:func:`install` makes a device function patch the language on its first call in each launch only. The first call
does exactly what Triton does, so a device function whose module reaches the language under other names than the
kernel's is still served; later calls in the same launch find every member patched already. Outside a launch a
device function patches on every call, as in Triton. Only the suite installs this (tests/conftest.py): the
kernels, the package and the GPU kit run Triton's interpreter unchanged.
"""

from __future__ import annotations

import warnings


def install() -> bool:
    """Wrap the interpreter's launches and its language patching (once per process); False, with a warning, when
    this Triton's interpreter lacks the internals it wraps (the tests then run at Triton's own speed)."""
    from triton.runtime import interpreter

    grid_executor = getattr(interpreter, "GridExecutor", None)
    patch_lang, scope = getattr(interpreter, "_patch_lang", None), getattr(interpreter, "_LangPatchScope", None)
    if grid_executor is None or patch_lang is None or scope is None:
        warnings.warn("tests/interpreter_calls.py: this Triton's interpreter has no GridExecutor/_patch_lang/"
                      "_LangPatchScope; the kernel tests run at the interpreter's own speed")
        return False
    if getattr(patch_lang, "once_per_launch", False):
        return True
    launch_call = grid_executor.__call__
    launches: list[set] = []  # per running launch, the functions that have patched the language in it

    def launch(self, *args, **kwargs):
        launches.append(set())
        try:
            return launch_call(self, *args, **kwargs)
        finally:
            launches.pop()

    def patch_once(fn):
        """Triton's ``_patch_lang(fn)`` the first time ``fn`` asks in a launch (the launch's own call, which it
        restores at the end, included); later asks in the same launch get a scope with nothing to restore."""
        if launches and fn in launches[-1]:
            return scope()
        if launches:
            launches[-1].add(fn)
        return patch_lang(fn)

    patch_once.once_per_launch = True
    grid_executor.__call__ = launch
    interpreter._patch_lang = patch_once
    return True
