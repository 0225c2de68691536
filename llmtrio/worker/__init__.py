"""The worker: joins a ring to an engine, speaking OpenAI chat completions on the lanes."""

from ..api import RequestLimits as RequestLimits
from ._host import LOAD_WAITERS as LOAD_WAITERS
from ._host import HostConfig as HostConfig
from ._host import HostedModel as HostedModel
from ._host import ModelHost as ModelHost
from ._host import ModelLoadFailed as ModelLoadFailed
from ._host import serve_hosted_link as serve_hosted_link
from ._metrics import EngineCollector as EngineCollector
from ._metrics import WorkerMetrics as WorkerMetrics
from ._link import HEARTBEAT_INTERVAL_S as HEARTBEAT_INTERVAL_S
from ._link import serve_link as serve_link

__all__ = [
    "HEARTBEAT_INTERVAL_S",
    "LOAD_WAITERS",
    "EngineCollector",
    "HostConfig",
    "HostedModel",
    "ModelHost",
    "ModelLoadFailed",
    "RequestLimits",
    "WorkerMetrics",
    "serve_hosted_link",
    "serve_link",
]
