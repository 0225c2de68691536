"""The web layer: Quart-Trio on hypercorn, the OpenAI-compatible ingress and the chat page."""

from ._app import create_app as create_app
from ._serve import ServeConfig as ServeConfig
from ._serve import serve as serve
from ._serve import serve_until_signalled as serve_until_signalled

__all__ = ["ServeConfig", "create_app", "serve", "serve_until_signalled"]
