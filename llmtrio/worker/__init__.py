"""The worker: joins a ring to an engine, speaking OpenAI chat completions on the lanes."""

from .._fields import RequestLimits as RequestLimits
from ._metrics import EngineCollector as EngineCollector
from ._metrics import WorkerMetrics as WorkerMetrics
from ._worker import HEARTBEAT_INTERVAL_S as HEARTBEAT_INTERVAL_S
from ._worker import serve_link as serve_link

__all__ = [
    "HEARTBEAT_INTERVAL_S",
    "EngineCollector",
    "RequestLimits",
    "WorkerMetrics",
    "serve_link",
]
