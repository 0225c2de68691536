"""The decode thread's lifecycle, one piece for both engines (``Engine`` and
``EmbeddingEngine``): open (resolve and load the model, abandonably), start the thread,
count capacity, close it, record how it died.

Each engine's work runs in one ``trio.to_thread`` worker (the subclass's ``_loop``), fed
through a ``threading.Condition`` and posting results back with ``run_sync_soon``. This
class holds what is the same in both: the model's load and release, the thread's start and
stop, the closing flags the loop waits on, the capacity counters and the parking lot their
waiters park in, the failure a dying loop leaves and the event the owner waits for it on.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Self

import trio

from ._config import EngineConfig
from ._errors import EngineFailedError
from ._stats import EngineStats
from ._types import Capacity
from .llama import LlamaModel
from .models import ResolvedModel, resolve_model

__all__ = ["DecodeLoop"]

logger = logging.getLogger("llmtrio.engine")


class DecodeLoop:
    """An engine's decode thread. A subclass writes ``_loop`` (the thread's body: it waits on
    ``_cond`` until there is work or ``_closing`` is set, and returns once it is) and may
    write ``_after_loop`` (the Trio side, once the thread has stopped, however) and ``_aside``
    (a task beside the thread: ready before it starts, awaited once it has stopped).

    ``_closed`` is set once the engine takes no more work (closing, or the loop gone);
    ``_closing`` (under ``_cond``) asks the loop to stop.
    """

    #: How logs, errors and the thread's name call the loop.
    _loop_name = "decode loop"

    def __init__(self, config: EngineConfig, model: LlamaModel, resolved: ResolvedModel) -> None:
        self.config = config
        self.model_name = resolved.name
        self.model_path = resolved.path
        self._model = model
        self.stats = EngineStats()
        #: Keys of requests cancelled since the loop last looked (under ``_cond``).
        self._cancels: set[int] = set()
        self._next_key = 0
        #: Sequences in the decode thread's last step (written by the thread).
        self._decoding = 0
        #: Waiters on a change of capacity (``capacity_changed``, ``wait_idle``).
        self._capacity_lot = trio.lowlevel.ParkingLot()
        self._trio_token = trio.lowlevel.current_trio_token()
        self._cond = threading.Condition()
        self._closing = False
        self._closed = False
        self._failure: EngineFailedError | None = None
        self._stopped = trio.Event()

    @classmethod
    @asynccontextmanager
    async def _open(
        cls, config: EngineConfig, load: Callable[[ResolvedModel], LlamaModel]
    ) -> AsyncIterator[Self]:
        """Resolve the model and ``load`` it (in threads), build the engine, run its decode
        loop while the block runs.

        A download or a load can take minutes: cancelling (Ctrl-C) must not wait for it. An
        abandoned download finishes into the cache in its thread (or dies with the process);
        an abandoned load is closed by its thread (:func:`_abandonable_load`).

        Error handling: :class:`ModelLoadError` when the model cannot be found or loaded (or
        the engine refuses it). Resource handling: on exit the decode thread stops and the
        model is freed.
        """
        resolved = await trio.to_thread.run_sync(resolve_model, config, abandon_on_cancel=True)
        model = await _abandonable_load(lambda: load(resolved))
        try:
            engine = cls(config, model, resolved)
            logger.info("loaded %s (%s), %s", resolved.name, model.architecture, engine._shape())
            async with engine._running():
                yield engine
        finally:
            model.close()

    def _shape(self) -> str:
        """What the load's log line says of the engine after its model's name."""
        raise NotImplementedError

    @asynccontextmanager
    async def _running(self) -> AsyncIterator[None]:
        """Run the decode thread while the block runs.

        Resource handling: leaving the block (however) closes the loop, which stops within
        one decode, and waits for the thread. The block's exception or cancellation leaves
        as it was raised, not in an exception group.
        """
        error: BaseException | None = None
        async with trio.open_nursery() as nursery:
            await nursery.start(self._aside)
            await nursery.start(self._run_loop)
            try:
                yield
            except BaseException as exc:
                error = exc
            finally:
                self._close()
        if error is not None:
            raise error

    async def _run_loop(self, *, task_status: trio.TaskStatus[None]) -> None:
        """Run ``_loop`` in a worker thread until it returns; a loop that dies is recorded
        (``failure``), not raised: the engine's owner decides what to do."""
        task_status.started()
        try:
            await trio.to_thread.run_sync(self._loop, thread_name=f"llmtrio {self._loop_name}")
        except Exception as exc:
            logger.error("the %s failed", self._loop_name, exc_info=exc)
            self._failure = EngineFailedError(f"the {self._loop_name} failed: {exc!r}")
        finally:
            self._closed = True
            self._stopped.set()
            self._after_loop()

    def _loop(self) -> None:
        raise NotImplementedError

    async def _aside(self, *, task_status: trio.TaskStatus[None]) -> None:
        """A task beside the decode thread, started before it (``started``: ready) and
        awaited after it stops (the decode thread's work that must not wait in it)."""
        task_status.started()

    def _after_loop(self) -> None:
        """The Trio side, once the decode thread has stopped (normally or not)."""

    def _close(self) -> None:
        self._closed = True
        with self._cond:
            self._closing = True
            self._cond.notify()

    def _post_soon(self, deliver: Callable[[Any], None], results: Any) -> None:
        """From the decode thread: ``deliver(results)`` on the Trio side, soon (dropped once
        the Trio run has finished: nobody is waiting)."""
        with contextlib.suppress(trio.RunFinishedError):
            self._trio_token.run_sync_soon(deliver, results)

    def _requests_in_flight(self) -> int:
        """Requests in flight now (waiting ones included)."""
        raise NotImplementedError

    def _capacity_changed(self) -> None:
        """Wake whoever waits on a change of capacity (a request accepted or freed)."""
        self._capacity_lot.unpark_all()

    # -- public API ----------------------------------------------------------------------

    @property
    def max_inflight(self) -> int:
        """How many requests it takes at once (the ring's claims)."""
        return self.config.max_inflight

    @property
    def n_vocab(self) -> int:
        return self._model.n_vocab

    def tokenize_text(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """``text``'s token ids, as llama.cpp server's ``/tokenize`` gives them:
        ``add_special`` adds the special tokens the model adds to a prompt (its BOS);
        ``parse_special`` reads special-token text (``<|im_end|>``) as those tokens."""
        return self._model.tokenize(text, add_special=add_special, parse_special=parse_special)

    def token_bytes(self, token: int) -> bytes:
        """The text of token id ``token`` as bytes, special tokens rendered (llama.cpp
        server's pieces); a piece may be part of a UTF-8 character.

        Error handling: ``ValueError`` for an id outside the vocabulary."""
        if not 0 <= token < self._model.n_vocab:
            raise ValueError(f"token id {token} is outside the vocabulary")
        return self._model.special_piece(token)

    def capacity(self) -> Capacity:
        inflight = self._requests_in_flight()
        return Capacity(
            inflight=inflight,
            decoding=self._decoding,
            max_inflight=self.max_inflight,
            available_slots=max(0, self.max_inflight - inflight),
        )

    async def capacity_changed(self) -> None:
        """Return at the next change of :meth:`capacity`'s ``inflight`` (a request accepted
        or its slot freed)."""
        await self._capacity_lot.park()

    async def wait_idle(self) -> None:
        """Return once no request is in flight (waiting ones included)."""
        while self._requests_in_flight():
            await self._capacity_lot.park()

    @property
    def failure(self) -> EngineFailedError | None:
        """Why the decode loop died, once it has; ``None`` while it runs (or closed
        normally)."""
        return self._failure

    async def wait_failed(self) -> EngineFailedError:
        """Return the failure once the decode loop has died; waits forever on an engine
        that runs or closes normally."""
        await self._stopped.wait()
        if self._failure is None:
            await trio.sleep_forever()
        assert self._failure is not None
        return self._failure


async def _abandonable_load(load: Callable[[], LlamaModel]) -> LlamaModel:
    """``load()`` in a worker thread, which a cancellation does not wait for.

    Resource handling: a model whose load was abandoned is closed as soon as it exists, by
    whichever side sees the abandonment last (the thread once it finishes loading, or this
    task if the model was already there), so an abandoned load leaks nothing.
    """
    lock = threading.Lock()
    loaded: list[LlamaModel] = []
    abandoned = False

    def run() -> None:
        model = load()
        with lock:
            if abandoned:
                model.close()
            else:
                loaded.append(model)

    try:
        await trio.to_thread.run_sync(run, abandon_on_cancel=True)
    except BaseException:
        with lock:
            abandoned = True
            for model in loaded:
                model.close()
        raise
    return loaded[0]
