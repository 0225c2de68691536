"""The worker: joins a ring to an engine. Each ring link is served by one loop
(:func:`serve_link`), whether its model is pinned (an engine loaded at start) or loaded on
demand (:class:`OnDemand`, a model of a :class:`ModelHost`); it answers every route the
ingress sends it (OpenAI's chat and text completions, Responses API and embeddings,
Anthropic's Messages API, reranking in Jina's, Cohere's and vLLM's shapes, llama.cpp's
tokenizer routes, the models' load and unload) with the endpoint of the route."""

from ..api import RequestLimits as RequestLimits
from ._host import ModelHost as ModelHost
from ._hosted import HostConfig as HostConfig
from ._hosted import HostedModel as HostedModel
from ._hosted import ModelLoadFailed as ModelLoadFailed
from ._link import HEARTBEAT_INTERVAL_S as HEARTBEAT_INTERVAL_S
from ._link import serve_link as serve_link
from ._metrics import EngineCollector as EngineCollector
from ._metrics import WorkerMetrics as WorkerMetrics
from ._on_demand import LOAD_WAITERS as LOAD_WAITERS
from ._on_demand import OnDemand as OnDemand

__all__ = [
    "HEARTBEAT_INTERVAL_S",
    "LOAD_WAITERS",
    "EngineCollector",
    "HostConfig",
    "HostedModel",
    "ModelHost",
    "ModelLoadFailed",
    "OnDemand",
    "RequestLimits",
    "WorkerMetrics",
    "serve_link",
]
