"""The upload-response ring: requests park as streams, workers claim them and respond.

The ring knows nothing of llama.cpp, OpenAI or HTTP servers. ``Ring`` is the in-process
ring (``RingConfig``: the settings an ingress gives it); ``RingCore`` (the state machine),
the messages, and ``encode``/``FrameDecoder`` (the framing) are its sans-IO core and wire
protocol, and ``SessionCore`` the sans-IO core of one worker connection at an ingress.
``serve_control`` is the ingress's mutual-TLS listener for remote workers, ``connect_ring``
the worker's end of it (``DialConfig``: how it finds its ingresses and judges them);
``RingLink`` is what a worker needs from either kind of attachment, and ``Claimed`` the
stream it claims from either.
"""

from ._config import RingConfig as RingConfig
from ._control import ControlConfig as ControlConfig
from ._control import serve_control as serve_control
from ._core import RingCore as RingCore
from ._dial import DialConfig as DialConfig
from ._effects import Effect as Effect
from ._effects import ToClient as ToClient
from ._effects import ToWorker as ToWorker
from ._errors import ControlRefusedError as ControlRefusedError
from ._errors import ParkTimeoutError as ParkTimeoutError
from ._errors import ProtocolError as ProtocolError
from ._errors import RingError as RingError
from ._errors import RingFullError as RingFullError
from ._errors import StreamCancelledError as StreamCancelledError
from ._errors import WorkerFailedError as WorkerFailedError
from ._framing import MAX_FRAME_SIZE as MAX_FRAME_SIZE
from ._framing import FrameDecoder as FrameDecoder
from ._framing import encode as encode
from ._framing import encode_available as encode_available
from ._link import Claimed as Claimed
from ._link import ClaimedStream as ClaimedStream
from ._link import Lane as Lane
from ._link import RingLink as RingLink
from ._messages import CHAT_MODEL as CHAT_MODEL
from ._messages import EMBEDDING_MODEL as EMBEDDING_MODEL
from ._messages import KINDS as KINDS
from ._messages import MAX_HELD_PREFIXES as MAX_HELD_PREFIXES
from ._messages import MAX_PREFIX_CHARS as MAX_PREFIX_CHARS
from ._messages import PROTOCOL_VERSION as PROTOCOL_VERSION
from ._messages import RERANK_MODEL as RERANK_MODEL
from ._messages import Assign as Assign
from ._messages import Attach as Attach
from ._messages import Cancel as Cancel
from ._messages import Claim as Claim
from ._messages import Credit as Credit
from ._messages import Detach as Detach
from ._messages import Headers as Headers
from ._messages import Heartbeat as Heartbeat
from ._messages import Message as Message
from ._messages import Outcome as Outcome
from ._messages import Release as Release
from ._messages import RequestHead as RequestHead
from ._messages import ResponseData as ResponseData
from ._messages import ResponseEnd as ResponseEnd
from ._messages import ResponseError as ResponseError
from ._messages import ResponseHead as ResponseHead
from ._messages import ResponseMessage as ResponseMessage
from ._messages import Withdraw as Withdraw
from ._messages import Withdrawn as Withdrawn
from ._remote import RemoteLink as RemoteLink
from ._remote import connect_ring as connect_ring
from ._ring import Ring as Ring
from ._ring import WorkerLink as WorkerLink
from ._router import Relay as Relay
from ._session import SESSION_TRANSITIONS as SESSION_TRANSITIONS
from ._session import WORKER_HEADER as WORKER_HEADER
from ._session import SessionClosed as SessionClosed
from ._session import SessionCore as SessionCore
from ._session import SessionEffect as SessionEffect
from ._session import SessionState as SessionState
from ._session import StreamLost as StreamLost
from ._session import ToRing as ToRing
from ._session import ToWire as ToWire
from ._states import TRANSITIONS as TRANSITIONS
from ._states import StreamState as StreamState
from ._stats import ModelStats as ModelStats
from ._stats import RingStats as RingStats
from ._stats import WorkerStats as WorkerStats
from ._stream import RingStream as RingStream
from ._tls import client_ssl_context as client_ssl_context
from ._tls import server_ssl_context as server_ssl_context

__all__ = [
    "CHAT_MODEL",
    "EMBEDDING_MODEL",
    "KINDS",
    "MAX_FRAME_SIZE",
    "MAX_HELD_PREFIXES",
    "MAX_PREFIX_CHARS",
    "PROTOCOL_VERSION",
    "RERANK_MODEL",
    "SESSION_TRANSITIONS",
    "TRANSITIONS",
    "WORKER_HEADER",
    "Assign",
    "Attach",
    "Cancel",
    "Claim",
    "Claimed",
    "ClaimedStream",
    "ControlConfig",
    "ControlRefusedError",
    "Credit",
    "Detach",
    "DialConfig",
    "Effect",
    "FrameDecoder",
    "Headers",
    "Heartbeat",
    "Lane",
    "Message",
    "ModelStats",
    "Outcome",
    "ParkTimeoutError",
    "ProtocolError",
    "Relay",
    "Release",
    "RemoteLink",
    "RequestHead",
    "ResponseData",
    "ResponseEnd",
    "ResponseError",
    "ResponseHead",
    "ResponseMessage",
    "Ring",
    "RingConfig",
    "RingCore",
    "RingError",
    "RingFullError",
    "RingLink",
    "RingStats",
    "RingStream",
    "SessionClosed",
    "SessionCore",
    "SessionEffect",
    "SessionState",
    "StreamCancelledError",
    "StreamLost",
    "StreamState",
    "ToClient",
    "ToRing",
    "ToWire",
    "ToWorker",
    "Withdraw",
    "Withdrawn",
    "WorkerFailedError",
    "WorkerLink",
    "WorkerStats",
    "client_ssl_context",
    "connect_ring",
    "encode",
    "encode_available",
    "serve_control",
    "server_ssl_context",
]
