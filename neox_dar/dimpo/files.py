"""Reading DimPO's JSON result files (a fit's ``results.json``, a task grid's ``grid.json``) with one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

from .instances import DimPOError


def read_result(folder: str | Path, name: str, fmt: str, command: str) -> dict:
    """``folder/name`` parsed, checked to carry ``"format": fmt``; ``command`` is the subcommand that writes it."""
    path = Path(folder) / name
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise DimPOError(f"no {name} in {folder} (run python -m neox_dar.dimpo {command} first)") from None
    except json.JSONDecodeError as e:
        raise DimPOError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise DimPOError(f"{path} is not a DimPO {command} result (no '{fmt}' format tag)")
    return data
