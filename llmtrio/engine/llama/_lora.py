"""LoRA adapters on llama.cpp: one adapter file loaded for a model
(``llama_adapter_lora_init``), and the set a context decodes with
(``llama_set_adapters_lora``).

llama.cpp applies adapters per context, not per sequence: every sequence of one
``llama_decode`` runs under the same set. Setting another set makes llama.cpp reserve its
compute graph again before the next decode (``sched_reserve``): that is what a switch costs
(PERFORMANCE.md, "LoRA adapters"). A set with the same adapters at the same scales is no
switch (llama.cpp compares them); an adapter at scale 0 is left out of the set, as llama.cpp
leaves it out.

Everything here runs on the thread that owns the context (the loader, then the decode loop):
loading or freeing an adapter changes the model's list of adapters, which a decode reads.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llama_cpp

from .._errors import ModelLoadError
from ._log import recent_log

__all__ = ["LoraAdapter", "LoraContext"]


class LoraAdapter:
    """One adapter file loaded for a model (its tensors in the model's buffers).

    Resource handling: :meth:`close` frees it (the model frees the ones left when it is
    freed); a context must not decode with it once it is closed.

    Error handling: :class:`ModelLoadError` when llama.cpp cannot load it (its reason from
    llama.cpp's log: a tensor the base model lacks, a shape that does not fit it)."""

    def __init__(self, model: Any, path: Path) -> None:
        recent_log()
        self._ptr: Any = llama_cpp.llama_adapter_lora_init(model, str(path).encode())
        if not self._ptr:
            why = recent_log() or "llama.cpp could not load it"
            raise ModelLoadError(f"cannot load the LoRA adapter {path}: {why}")
        self.path = path

    @property
    def handle(self) -> Any:
        return self._ptr

    @property
    def closed(self) -> bool:
        return not self._ptr

    def close(self) -> None:
        if self._ptr:
            llama_cpp.llama_adapter_lora_free(self._ptr)
            self._ptr = None


class LoraContext:
    """The adapters a context decodes with (``ctx``: a ``llama_context``); starts with none."""

    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx
        self._set: tuple[tuple[LoraAdapter, float], ...] = ()

    @property
    def current(self) -> tuple[tuple[LoraAdapter, float], ...]:
        return self._set

    def use(self, loras: Sequence[tuple[LoraAdapter, float]]) -> bool:
        """Decode with ``loras`` (adapter, scale) from the next decode on; whether the set
        changed (a switch: the next decode reserves its graph again)."""
        wanted = tuple((adapter, scale) for adapter, scale in loras if scale != 0.0)
        if wanted == self._set:
            return False
        n = len(wanted)
        adapters = (llama_cpp.llama_adapter_lora_p_ctypes * n)(*(a.handle for a, _ in wanted))
        scales = (ctypes.c_float * n)(*(scale for _, scale in wanted))
        llama_cpp.llama_set_adapters_lora(
            self._ctx, adapters if n else None, n, scales if n else None
        )
        self._set = wanted
        return True

    def drop(self, adapter: LoraAdapter) -> None:
        """Stop decoding with ``adapter`` (before it is freed)."""
        if any(held is adapter for held, _ in self._set):
            self.use([(held, scale) for held, scale in self._set if held is not adapter])
