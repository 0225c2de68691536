"""The web layer: Quart-Trio on hypercorn, the OpenAI-compatible ingress in front of a ring,
and the chat page. A pure ingress: it imports neither the engine nor the worker."""

from ._app import create_app as create_app
from ._serve import ServeConfig as ServeConfig
from ._serve import serve_ingress as serve_ingress

__all__ = ["ServeConfig", "create_app", "serve_ingress"]
