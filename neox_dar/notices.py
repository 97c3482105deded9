"""Warnings meant for the user of a command (a config that does not do what it seems to, an import that drops a
setting): :class:`Notice`, and :func:`one_line_notices`, which a command calls at its start so that they print as
``warning: MESSAGE``, one line, without Python's source location and code line (which name this package's code,
not the user's mistake). Other warnings keep Python's format. Imports nothing: the config and the variants, which
import no torch, use it."""

from __future__ import annotations

import warnings


class Notice(UserWarning):
    """A warning to the user of a command (``warnings.warn(message, Notice)``)."""


def one_line_notices() -> None:
    """Print :class:`Notice` warnings as ``warning: MESSAGE`` from now on (this process); idempotent."""
    default = warnings.formatwarning
    if getattr(default, "one_line_notices", False):
        return

    def formatwarning(message, category, filename, lineno, line=None):
        if issubclass(category, Notice):
            return f"warning: {message}\n"
        return default(message, category, filename, lineno, line)

    formatwarning.one_line_notices = True
    warnings.formatwarning = formatwarning
