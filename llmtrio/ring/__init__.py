"""The upload-response ring: requests park as streams, workers claim them and respond.

The ring knows nothing of llama.cpp, OpenAI or HTTP servers. ``Ring`` is the in-process
ring; ``RingCore`` and the messages with ``encode``/``FrameDecoder`` are its sans-IO core and
wire protocol, shared with any transport for remote workers.
"""

from ._errors import ProtocolError as ProtocolError
from ._errors import RingError as RingError
from ._errors import RingFullError as RingFullError
from ._errors import StreamCancelledError as StreamCancelledError
from ._errors import WorkerFailedError as WorkerFailedError
from ._protocol import MAX_FRAME_SIZE as MAX_FRAME_SIZE
from ._protocol import Assign as Assign
from ._protocol import Attach as Attach
from ._protocol import Cancel as Cancel
from ._protocol import Claim as Claim
from ._protocol import Detach as Detach
from ._protocol import Effect as Effect
from ._protocol import FrameDecoder as FrameDecoder
from ._protocol import Headers as Headers
from ._protocol import Heartbeat as Heartbeat
from ._protocol import Message as Message
from ._protocol import RequestHead as RequestHead
from ._protocol import ResponseData as ResponseData
from ._protocol import ResponseEnd as ResponseEnd
from ._protocol import ResponseError as ResponseError
from ._protocol import ResponseHead as ResponseHead
from ._protocol import ResponseMessage as ResponseMessage
from ._protocol import RingCore as RingCore
from ._protocol import RingStats as RingStats
from ._protocol import StreamState as StreamState
from ._protocol import ToClient as ToClient
from ._protocol import ToWorker as ToWorker
from ._protocol import WorkerStats as WorkerStats
from ._protocol import encode as encode
from ._ring import Claimed as Claimed
from ._ring import Ring as Ring
from ._ring import RingStream as RingStream
from ._ring import WorkerLink as WorkerLink

__all__ = [
    "MAX_FRAME_SIZE",
    "Assign",
    "Attach",
    "Cancel",
    "Claim",
    "Claimed",
    "Detach",
    "Effect",
    "FrameDecoder",
    "Headers",
    "Heartbeat",
    "Message",
    "ProtocolError",
    "RequestHead",
    "ResponseData",
    "ResponseEnd",
    "ResponseError",
    "ResponseHead",
    "ResponseMessage",
    "Ring",
    "RingCore",
    "RingError",
    "RingFullError",
    "RingStats",
    "RingStream",
    "StreamCancelledError",
    "StreamState",
    "ToClient",
    "ToWorker",
    "WorkerFailedError",
    "WorkerLink",
    "WorkerStats",
    "encode",
]
