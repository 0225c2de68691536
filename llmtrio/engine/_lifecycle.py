"""The decode thread's lifecycle, one piece for both engines (``Engine`` and
``EmbeddingEngine``): start the thread, close it, record how it died.

Each engine's work runs in one ``trio.to_thread`` worker (the subclass's ``_loop``), fed
through a ``threading.Condition`` and posting results back with ``run_sync_soon``. This
class holds what is the same in both: the thread's start and stop, the closing flags the
loop waits on, the failure a dying loop leaves and the event the owner waits for it on.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from ._errors import EngineFailedError

__all__ = ["DecodeLoop"]

logger = logging.getLogger("llmtrio.engine")


class DecodeLoop:
    """An engine's decode thread. A subclass writes ``_loop`` (the thread's body: it waits on
    ``_cond`` until there is work or ``_closing`` is set, and returns once it is) and may
    write ``_after_loop`` (the Trio side, once the thread has stopped, however).

    ``_closed`` is set once the engine takes no more work (closing, or the loop gone);
    ``_closing`` (under ``_cond``) asks the loop to stop.
    """

    #: How logs, errors and the thread's name call the loop.
    _loop_name = "decode loop"

    def __init__(self) -> None:
        self._trio_token = trio.lowlevel.current_trio_token()
        self._cond = threading.Condition()
        self._closing = False
        self._closed = False
        self._failure: EngineFailedError | None = None
        self._stopped = trio.Event()

    @asynccontextmanager
    async def _running(self) -> AsyncIterator[None]:
        """Run the decode thread while the block runs.

        Resource handling: leaving the block (however) closes the loop, which stops within
        one decode, and waits for the thread. The block's exception or cancellation leaves
        as it was raised, not in an exception group.
        """
        error: BaseException | None = None
        async with trio.open_nursery() as nursery:
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

    # -- public API ----------------------------------------------------------------------

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
