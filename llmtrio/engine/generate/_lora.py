"""The LoRA adapters an engine serves (:class:`Adapters`) and the set one request runs under
(:class:`LoraSet`).

A request names its adapters by the model name it was made for (an adapter's own name: that
adapter at its own scale) and by llama.cpp's ``lora`` field (``[{"id": N, "scale": S}]``: the
scales of the ids listed win; 0 turns an adapter off). The set is what one ``llama_decode``
runs under (``LoraContext``), and its ``key`` is what the prompt cache files a sequence's
memory under: a prefix computed under one set is never reused under another.

The key of a set names its adapters' files (their resolved path, size and modification time)
and scales, hashed to 16 hex digits: the same adapters at the same scales have the same key
(across loads and engines), so a small string is all a cache of snapshots (on disk too)
needs to add to what it keys by.

Trio side: :class:`Adapters` is read and changed on the event loop only; the adapters
themselves are loaded and freed on the decode thread (``Engine.load_adapter``).
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import attrs

from .._config import LoraSpec
from .._errors import InvalidRequestError
from ..llama import LoraAdapter

__all__ = ["BASE", "Adapters", "LoraSet", "ServedAdapter", "adapter_identity"]


@attrs.frozen(eq=False)
class LoraSet:
    """The adapters a decode runs under: ``(adapter, scale)`` pairs (none at scale 0), by id;
    ``names`` are theirs, ``key`` names the set (``""``: no adapter, the base model)."""

    key: str = ""
    adapters: tuple[tuple[LoraAdapter, float], ...] = ()
    names: tuple[str, ...] = ()


#: The base model: no adapter.
BASE = LoraSet()


@attrs.frozen
class ServedAdapter:
    """One adapter an engine serves: its ``id`` (llama.cpp's ``lora`` field names it so), its
    spec, and its file's size (what it adds to the model's memory, about)."""

    id: int
    spec: LoraSpec
    nbytes: int

    @property
    def name(self) -> str:
        return self.spec.name


def adapter_identity(path: Path) -> str:
    """Who an adapter file is: its resolved path, size and modification time, hashed.

    Error handling: ``OSError`` when it cannot be read."""
    resolved = path.resolve()
    stat = resolved.stat()
    text = f"{resolved}\0{stat.st_size}\0{stat.st_mtime_ns}"
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


@attrs.define
class _Loaded:
    served: ServedAdapter
    adapter: LoraAdapter
    identity: str


@attrs.define
class Adapters:
    """The adapters an engine serves, by name and by id, and how many requests in flight run
    under each."""

    _by_name: dict[str, _Loaded] = attrs.field(factory=dict)
    _next_id: int = 0
    _users: Counter[str] = attrs.field(factory=Counter)

    @property
    def served(self) -> tuple[ServedAdapter, ...]:
        """Every adapter, by id."""
        return tuple(loaded.served for loaded in self._by_name.values())

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def add(
        self, spec: LoraSpec, adapter: LoraAdapter, identity: str, nbytes: int
    ) -> ServedAdapter:
        """Serve ``adapter`` as ``spec.name``, under the next id."""
        served = ServedAdapter(self._next_id, spec, nbytes)
        self._next_id += 1
        self._by_name[spec.name] = _Loaded(served, adapter, identity)
        return served

    def remove(self, name: str) -> LoraAdapter:
        """Serve ``name`` no more; its adapter, for the decode thread to free.

        Error handling: ``KeyError`` for a name it does not serve."""
        return self._by_name.pop(name).adapter

    def in_flight(self, name: str) -> int:
        """Requests accepted and not yet released that run under ``name``."""
        return self._users[name]

    def begin(self, lora: LoraSet) -> None:
        self._users.update(lora.names)

    def end(self, lora: LoraSet) -> None:
        self._users.subtract(lora.names)
        for name in lora.names:
            if self._users[name] <= 0:
                del self._users[name]

    def resolve(self, model_name: str | None, lora: Sequence[tuple[int, float]]) -> LoraSet:
        """The set a request for ``model_name`` with llama.cpp's ``lora`` list runs under.

        Error handling: :class:`InvalidRequestError` (``lora``) for an id no adapter has, or
        a scale that is not a finite number."""
        scales: dict[str, float] = {}
        if model_name is not None and model_name in self._by_name:
            scales[model_name] = self._by_name[model_name].served.spec.scale
        by_id = {loaded.served.id: name for name, loaded in self._by_name.items()}
        for adapter_id, scale in lora:
            name = by_id.get(adapter_id)
            if name is None:
                known = ", ".join(f"{i} ({n})" for i, n in by_id.items()) or "none"
                raise InvalidRequestError(
                    f"no LoRA adapter has the id {adapter_id} (this model's: {known})",
                    param="lora",
                )
            if not math.isfinite(scale):
                raise InvalidRequestError(
                    f"the scale of LoRA adapter {adapter_id} must be a number", param="lora"
                )
            scales[name] = scale
        chosen = sorted(
            ((self._by_name[name], scale) for name, scale in scales.items() if scale != 0.0),
            key=lambda pair: pair[0].served.id,
        )
        if not chosen:
            return BASE
        text = "\0".join(sorted(f"{loaded.identity}@{scale!r}" for loaded, scale in chosen))
        return LoraSet(
            hashlib.blake2b(text.encode(), digest_size=8).hexdigest(),
            tuple((loaded.adapter, scale) for loaded, scale in chosen),
            tuple(loaded.served.name for loaded, _ in chosen),
        )
