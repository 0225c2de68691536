"""``llmtrio pull``: fetch a model into the Hugging Face cache ahead of time (the init
container's job in ``deploy/kubernetes``, or a user's before going offline), where ``llmtrio
serve`` and ``llmtrio worker`` find it, with ``HF_HUB_OFFLINE=1`` too."""

from __future__ import annotations

import sys
from pathlib import Path

from ..engine import DEFAULT_QUANT, DEFAULT_REPO, EngineConfig, resolve_model

__all__ = ["pull"]


def pull(model: str | None, *, hf_file: str | None = None, quant: str | None = None) -> Path:
    """Fetch ``model`` (``REPO[:QUANT]``; the default model's repo when ``None``) into the
    Hugging Face cache (``HF_HOME``/``HF_HUB_CACHE``), with a progress bar on a terminal, and
    say where it is: a line for people on stderr, the file's path alone on stdout. The repo's
    vision projector (an ``mmproj-*.gguf``: F16 before F32) comes with it, named on stderr.

    Blocking. Error handling: :class:`~llmtrio.engine.ModelLoadError` naming the repo, the
    file or quant, the cache searched and why (never the demo model instead).
    """
    repo, _, named_quant = (model or DEFAULT_REPO).partition(":")
    config = EngineConfig(
        hf_repo=repo,
        hf_file=hf_file,
        quant=named_quant or quant or DEFAULT_QUANT,
        allow_fallback=False,
    )
    resolved = resolve_model(config, progress=True)
    how = "downloaded" if resolved.source == "hub-download" else "already in the cache"
    print(f"{resolved.name}: {how}: {resolved.path}", file=sys.stderr)
    if resolved.mmproj is not None:
        print(f"{resolved.name}: its vision projector: {resolved.mmproj}", file=sys.stderr)
    print(resolved.path)
    return resolved.path
