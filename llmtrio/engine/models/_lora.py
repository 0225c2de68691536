"""A LoRA adapter's GGUF header, checked before llama.cpp is asked to load it: that it is an
adapter (``general.type = adapter``, ``adapter.type = lora``) and of the base model's
architecture. llama.cpp says only "model arch and LoRA arch mismatch"; this names both."""

from __future__ import annotations

from pathlib import Path

import attrs

from .._errors import ModelLoadError
from ._gguf import check_gguf

__all__ = ["LoraHeader", "check_lora"]


@attrs.frozen
class LoraHeader:
    """What an adapter's header says: its architecture, ``adapter.lora.alpha`` (0: none, the
    scale is then applied as it is) and its file's size in bytes."""

    architecture: str
    alpha: float
    nbytes: int


def check_lora(path: Path, architecture: str | None = None) -> LoraHeader:
    """The header of the LoRA adapter at ``path``, for a base model of ``architecture`` (any,
    when ``None``).

    Error handling: :class:`ModelLoadError` naming the path when it is not a readable GGUF
    file, not a LoRA adapter, or made for another architecture than the base's (naming
    both)."""
    info = check_gguf(path)
    meta = info.metadata
    kind, adapter = meta.get("general.type"), meta.get("adapter.type")
    if kind != "adapter" or adapter != "lora":
        raise ModelLoadError(
            f"{path} is not a LoRA adapter (general.type {kind!r}, adapter.type {adapter!r}; "
            "an adapter has 'adapter' and 'lora')"
        )
    arch = info.architecture or ""
    if architecture is not None and arch != architecture:
        raise ModelLoadError(
            f"the LoRA adapter {path} is for the architecture {arch or 'none'!r}, but the base "
            f"model is {architecture!r}"
        )
    alpha = meta.get("adapter.lora.alpha", 0.0)
    return LoraHeader(arch, float(alpha) if isinstance(alpha, int | float) else 0.0, info.file_size)
