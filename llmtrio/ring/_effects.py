"""What the ring's core returns from each event (its *effects*): the messages its caller must
deliver, to one worker (:class:`ToWorker`) or to one stream's client (:class:`ToClient`)."""

from __future__ import annotations

from typing import TypeAlias

import attrs

from ._messages import Assign, Cancel, ResponseMessage

__all__ = ["Effect", "ToClient", "ToWorker"]


@attrs.frozen
class ToWorker:
    """Effect: deliver ``message`` (an ``Assign`` or a ``Cancel``) to worker ``worker_id``."""

    worker_id: str
    message: Assign | Cancel


@attrs.frozen
class ToClient:
    """Effect: deliver ``message`` to the client waiting on stream ``stream_id``.

    A ``ResponseEnd`` or ``ResponseError`` is the stream's last effect: the core has already
    forgotten it.
    """

    stream_id: int
    message: ResponseMessage


Effect: TypeAlias = ToWorker | ToClient
