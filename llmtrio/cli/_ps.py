"""``llmtrio ps``: the models a server has loaded (as Ollama's ``ps``), from its
``/v1/models``: name, kind, workers, estimated memory and when each unloads when idle."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

__all__ = ["ps", "table"]


def _size(value: object) -> str:
    if not isinstance(value, int) or value <= 0:
        return "-"
    return f"{value / (1 << 20):.0f} MiB" if value < 1 << 30 else f"{value / (1 << 30):.1f} GiB"


def _until(value: object) -> str:
    if value == -1:
        return "forever"
    if not isinstance(value, int) or value <= 0:
        return "-"  # busy, or loaded at start (--model): never idles out
    minutes, seconds = divmod(value, 60)
    return f"in {minutes} min {seconds} s" if minutes else f"in {seconds} s"


def table(models: Sequence[Mapping[str, Any]]) -> str:
    """The loaded models of a ``/v1/models`` listing as a table (a header alone when none)."""
    rows = [("NAME", "KIND", "WORKERS", "SIZE", "UNTIL")]
    for model in models:
        if model.get("state", "loaded") != "loaded":
            continue
        rows.append(
            (
                str(model["id"]),
                str(model.get("kind", "chat")),
                str(model.get("workers", "")),
                _size(model.get("bytes")),
                _until(model.get("unload_in_s")),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def ps(url: str, api_key: str | None = None) -> int:
    """Print the table; 1 (and why, on stderr) when the server cannot be asked."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(url.rstrip("/") + "/v1/models", headers=headers, timeout=10)
        response.raise_for_status()
        models = response.json()["data"]
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        print(f"llmtrio ps: cannot list the models of {url}: {exc}", file=sys.stderr)
        return 1
    print(table(models))
    return 0
