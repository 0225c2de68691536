"""The web layer: Quart-Trio on hypercorn, the OpenAI-compatible ingress in front of a ring,
and the chat page. A pure ingress: it imports neither the engine nor the worker."""

from ._app import create_app as create_app
from ._auth import ApiKeys as ApiKeys
from ._auth import read_key_file as read_key_file
from ._checks import Gate as Gate
from ._metrics import IngressMetrics as IngressMetrics
from ._ratelimit import RateLimiter as RateLimiter
from ._serve import ServeConfig as ServeConfig
from ._serve import serve_ingress as serve_ingress

__all__ = [
    "ApiKeys",
    "Gate",
    "IngressMetrics",
    "RateLimiter",
    "ServeConfig",
    "create_app",
    "read_key_file",
    "serve_ingress",
]
