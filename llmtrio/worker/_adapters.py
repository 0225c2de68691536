"""A model's LoRA adapters as its worker keeps them (:class:`AdapterBook`), and vLLM's routes
that change them at run time: ``POST /v1/load_lora_adapter`` and
``/v1/unload_lora_adapter`` (the link serves them: ``_link.serve_link``).

The book holds what the model is served with: the adapters of its catalog entry
(``--lora``, ``lora = [...]`` in the models file; the engine loads them with the model) and
those loaded at run time. A model on demand that unloads keeps its book: the next load opens
the engine with the catalog's adapters and loads the others again (one that can no longer be
loaded is dropped, and logged). The link's heartbeats state the book's names, so the ring
routes each adapter's name to the link as it routes the model's.

The rules of a load, as ``/models/load``'s: a client names things, it never gives a path.
``lora_path`` is the name of a file in ``--lora-dir`` (``NAME`` or ``NAME.gguf``); anything
with a separator, ``..`` or a leading dot is refused, and without ``--lora-dir`` no adapter is
loaded at run time. The adapter's name must be new to the model; its file must be a LoRA
adapter of the model's architecture (the error names both). Its bytes (its file's size) are
asked of the memory budget of the worker's models (``--memory-budget``) before it loads;
an adapter that does not fit is refused (503), nothing evicted for it. An adapter with
requests in flight is never unloaded (400, naming how many).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import attrs

from ..api import (
    ApiError,
    Body,
    RequestLimits,
    dumps,
    invalid_request,
    invalid_value,
    model_load_failed,
    read,
)
from ..engine import Engine, InvalidRequestError, LoraSpec, ModelLoadError
from ..ring import ClaimedStream
from ._manage import respond_error
from ._pipeline import JSON_HEADERS
from ._requests import json_body
from ._shapes import ModelEngine

__all__ = ["AdapterBook", "AdapterLoad", "load_adapter", "unload_adapter"]

logger = logging.getLogger("llmtrio.worker")


def _fits(nbytes: int) -> str | None:
    return None


def _freed(nbytes: int) -> None:
    pass


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


@attrs.define(eq=False)
class AdapterBook:
    """The LoRA adapters ``model`` is served with (see the module): ``configured`` from its
    catalog entry, and those loaded at run time from ``lora_dir``. ``reserve(nbytes)`` asks
    the memory budget for an adapter's bytes (``None``: granted; else why not) and
    ``release(nbytes)`` gives them back."""

    model: str
    configured: tuple[LoraSpec, ...] = ()
    lora_dir: Path | None = None
    reserve: Callable[[int], str | None] = _fits
    release: Callable[[int], None] = _freed
    _added: dict[str, LoraSpec] = attrs.field(factory=dict)
    _dropped: set[str] = attrs.field(factory=set)

    @property
    def at_load(self) -> tuple[LoraSpec, ...]:
        """What the engine opens with: the catalog's adapters (those not unloaded since)."""
        return tuple(spec for spec in self.configured if spec.name not in self._dropped)

    @property
    def added(self) -> tuple[LoraSpec, ...]:
        """The adapters loaded at run time, in the order they were."""
        return tuple(self._added.values())

    def names(self) -> tuple[str, ...]:
        """Every adapter the model is served with."""
        return tuple(spec.name for spec in (*self.at_load, *self.added))

    @property
    def extra_bytes(self) -> int:
        """What the adapters loaded at run time add to the model's estimated cost, less what
        the catalog's unloaded since take off it."""
        added = sum(_size(spec.path) for spec in self.added)
        dropped = sum(_size(spec.path) for spec in self.configured if spec.name in self._dropped)
        return added - dropped

    def loaded(self, spec: LoraSpec) -> None:
        self._added[spec.name] = spec

    def unloaded(self, name: str) -> None:
        """``name`` is served no more (from the catalog or loaded at run time)."""
        if self._added.pop(name, None) is None:
            self._dropped.add(name)

    def path_of(self, name: str) -> Path:
        """The file ``name`` names in ``lora_dir`` (``NAME`` or ``NAME.gguf``).

        Error handling: :class:`ApiError` (400, ``lora_path``) without ``lora_dir``, for a
        name that is a path, or one no file has."""
        if self.lora_dir is None:
            raise invalid_request(
                "This server loads no LoRA adapter at run time: start it with --lora-dir.",
                param="lora_path",
            )
        if "/" in name or "\\" in name or "\0" in name or name.startswith(".") or ".." in name:
            raise invalid_value(
                "lora_path", "it must be the name of a file in the server's --lora-dir, not a path."
            )
        for candidate in (name, f"{name}.gguf"):
            path = self.lora_dir / candidate
            if path.is_file():
                return path
        raise invalid_value(
            "lora_path", f"no adapter named {name!r} is in the server's --lora-dir."
        )


@attrs.frozen
class AdapterLoad:
    """A parsed ``POST /v1/load_lora_adapter``: the adapter to load."""

    spec: LoraSpec

    @classmethod
    def parse(cls, body: bytes, book: AdapterBook, limits: RequestLimits) -> AdapterLoad:
        """The load's adapter, its file found in the book's ``lora_dir``.

        Error handling: :class:`ApiError` (400) naming the field."""
        data = json_body(body)
        name = read(data, Body.LOAD_LORA, "lora_name", limits)
        path = book.path_of(read(data, Body.LOAD_LORA, "lora_path", limits))
        scale = read(data, Body.LOAD_LORA, "scale", limits)
        if name in book.names():
            raise invalid_value("lora_name", f"the model {book.model!r} serves {name!r} already.")
        return cls(LoraSpec(name, path, 1.0 if scale is None else scale))


async def _respond(claimed: ClaimedStream, body: dict[str, object]) -> None:
    await claimed.respond(200, JSON_HEADERS, dumps({"success": True, **body}))


async def load_adapter(
    claimed: ClaimedStream, book: AdapterBook, engine: ModelEngine, load: AdapterLoad
) -> None:
    """Answer ``POST /v1/load_lora_adapter``: load ``load``'s adapter into the loaded
    ``engine`` (its bytes granted by the budget first) and serve it from now on.

    Error handling: the refusals are the response (400 in OpenAI's shape: a file that is no
    adapter of the model's architecture, a name served already; 503 when the budget has no
    room)."""
    spec = load.spec
    if not isinstance(engine, Engine):
        error = invalid_request(
            f"{book.model!r} is an embedding model: LoRA adapters are served on generating "
            "models only.",
            param="model",
        )
        await respond_error(claimed, error)
        return
    nbytes = _size(spec.path)
    refusal = book.reserve(nbytes)
    if refusal is not None:
        await respond_error(claimed, model_load_failed(f"{book.model}/{spec.name}", refusal))
        return
    try:
        served = await engine.load_adapter(spec)
    except (InvalidRequestError, ModelLoadError) as exc:
        book.release(nbytes)
        await respond_error(claimed, _refused(exc))
        return
    except BaseException:
        book.release(nbytes)
        raise
    book.loaded(spec)
    logger.info("%s: loaded the LoRA adapter %s (%s)", book.model, spec.name, spec.path.name)
    body = {"lora_name": spec.name, "model": book.model, "state": "loaded", "id": served.id}
    await _respond(claimed, body)


async def unload_adapter(
    claimed: ClaimedStream,
    book: AdapterBook,
    engine: ModelEngine | None,
    state: str,
    limits: RequestLimits,
) -> None:
    """Answer ``POST /v1/unload_lora_adapter``: the adapter is served no more and freed (on a
    model on demand that is not loaded, only its book forgets it).

    Error handling: the refusals are the response (400: an adapter the model does not serve,
    one with requests in flight, a model loading)."""
    try:
        name = read(json_body(claimed.body), Body.UNLOAD_LORA, "lora_name", limits)
        if name not in book.names():
            raise invalid_value("lora_name", f"the model {book.model!r} serves no {name!r}.")
        if state == "loading":
            raise invalid_request(
                f"The model {book.model!r} is loading: unload {name!r} once it has loaded.",
                param="lora_name",
            )
        if isinstance(engine, Engine):
            try:
                await engine.unload_adapter(name)
            except InvalidRequestError as exc:
                raise _refused(exc) from None
    except ApiError as refused:
        await respond_error(claimed, refused)
        return
    spec = next(s for s in (*book.at_load, *book.added) if s.name == name)
    book.unloaded(name)
    if engine is not None:
        book.release(_size(spec.path))
    logger.info("%s: unloaded the LoRA adapter %s", book.model, name)
    await _respond(claimed, {"lora_name": name, "model": book.model, "state": "unloaded"})


def _refused(exc: InvalidRequestError | ModelLoadError) -> ApiError:
    """An engine's refusal of a load or an unload, as the route's 400."""
    param = exc.param if isinstance(exc, InvalidRequestError) else "lora_path"
    text = str(exc)
    return invalid_request(
        text[:1].upper() + text[1:] + ("" if text.endswith(".") else "."),
        param=param or "lora_name",
    )
