"""The engine's LoRA adapters (:class:`AdapterMethods`, a part of :class:`Engine`): those of its
config loaded with the model, others loaded and unloaded at run time, and the set each
request runs under (``_lora.py``). Files are read and freed on the decode thread, between two
steps (a decode reads the model's list of adapters)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import trio

from .._config import LoraSpec
from .._errors import InvalidRequestError, ModelLoadError
from .._types import GenerateRequest
from ..llama import LlamaModel
from ..models import check_lora
from ._lora import Adapters, LoraSet, ServedAdapter, adapter_identity

__all__ = ["AdapterMethods", "identity_of", "load_adapters"]

logger = logging.getLogger("llmtrio.engine")

T = TypeVar("T")


def identity_of(spec: LoraSpec) -> str:
    try:
        return adapter_identity(spec.path)
    except OSError as exc:
        raise ModelLoadError(f"cannot read the LoRA adapter {spec.path}: {exc}") from None


def load_adapters(model: LlamaModel, specs: tuple[LoraSpec, ...]) -> None:
    """Load the adapters of the config for ``model`` (in its list, in the config's order).

    Error handling: :class:`ModelLoadError` when one is not a LoRA adapter of the model's
    architecture (naming both) or llama.cpp cannot load it."""
    for spec in specs:
        check_lora(spec.path, model.architecture)
        model.load_lora(spec.path)


class AdapterMethods:
    """The adapter part of :class:`Engine` (which sets the attributes declared here)."""

    model_name: str
    _model: LlamaModel
    _adapters: Adapters
    _unloaded: set[str]

    if TYPE_CHECKING:

        async def _on_decode_thread(self, work: Callable[[], T]) -> T: ...

    @property
    def adapters(self) -> tuple[ServedAdapter, ...]:
        """The LoRA adapters it serves, by id."""
        return self._adapters.served

    def serves_adapter(self, name: str) -> bool:
        """Whether ``name`` is one of its adapters."""
        return name in self._adapters

    def adapter_in_flight(self, name: str) -> int:
        """Requests accepted and not yet released that run under adapter ``name``."""
        return self._adapters.in_flight(name)

    async def load_adapter(self, spec: LoraSpec) -> ServedAdapter:
        """Serve ``spec`` from now on, under the next id. Its file is read on the decode
        thread between two steps (the steps wait that long).

        Error handling: :class:`InvalidRequestError` (``lora_name``) when an adapter of that
        name is served already; :class:`ModelLoadError` when the file is not a LoRA adapter
        of the model's architecture (naming both) or llama.cpp cannot load it;
        :class:`EngineClosedError` once the engine is closed."""
        self._check_free(spec.name)
        architecture = self._model.architecture
        await trio.to_thread.run_sync(check_lora, spec.path, architecture)
        identity = await trio.to_thread.run_sync(identity_of, spec)
        model = self._model
        adapter = await self._on_decode_thread(lambda: model.load_lora(spec.path))
        try:
            self._check_free(spec.name)  # another load of the name may have won meanwhile
        except InvalidRequestError:
            await self._on_decode_thread(lambda: model.free_lora(adapter))
            raise
        self._unloaded.discard(spec.name)
        served = self._adapters.add(spec, adapter, identity, spec.path.stat().st_size)
        logger.info("%s: serving the LoRA adapter %s (%s)", self.model_name, spec.name, spec.path)
        return served

    def _check_free(self, name: str) -> None:
        if name in self._adapters or name == self.model_name:
            raise InvalidRequestError(f"the name {name!r} is served already", param="lora_name")

    async def unload_adapter(self, name: str) -> None:
        """Serve adapter ``name`` no more and free it (on the decode thread); a request for
        it from then on is refused, until one of that name is loaded again.

        Error handling: :class:`InvalidRequestError` (``lora_name``) when no adapter of that
        name is served, or requests run under it (an adapter in flight is never unloaded);
        :class:`EngineClosedError` once the engine is closed."""
        if name not in self._adapters:
            raise InvalidRequestError(
                f"no LoRA adapter named {name!r} is served", param="lora_name"
            )
        busy = self._adapters.in_flight(name)
        if busy:
            raise InvalidRequestError(
                f"the LoRA adapter {name!r} has {busy} requests in flight: it is not unloaded",
                param="lora_name",
            )
        adapter = self._adapters.remove(name)
        self._unloaded.add(name)
        model = self._model
        await self._on_decode_thread(lambda: model.free_lora(adapter))
        logger.info("%s: unloaded the LoRA adapter %s", self.model_name, name)

    def _lora_set(self, request: GenerateRequest) -> LoraSet:
        name = request.model_name
        if name is not None and name in self._unloaded:
            raise InvalidRequestError(
                f"the LoRA adapter {name!r} was unloaded: it is served no more", param="model"
            )
        return self._adapters.resolve(name, request.lora)
