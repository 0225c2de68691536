"""OpenAI's error shapes, shared by the ingress (``llmtrio.web``) and the worker.

Pure: no I/O. Every refusal is an :class:`OpenAIError` that knows its HTTP status and renders
its own body.

    OpenAIError                 an error in OpenAI's shape, with its HTTP status
      400 invalid_request_error a body, field or message this server cannot use
      400 context_length_exceeded (code) the prompt does not fit a slot's context
      401 invalid_api_key (code) a missing or wrong API key
      403 forbidden             a browser origin or host this server does not serve
      400 model_not_supported (code) the model is of the other kind (chat / embedding)
      400 missing_required_parameter (code) no model named, and none to default to
      404 / 405                 unknown path / wrong method
      404 model_not_found (code) no worker serves the model named, and no default is set
      408 request_timeout (code) the body did not arrive in time
      413 request_too_large     the body is over the size limit
      429 rate_limit_exceeded (code) over the requests-per-minute limit (Retry-After)
      500 server_error          a failure on our side
      502 worker_failed (code)  the worker serving the request failed or went away
      503 server_error          every slot is taken (code ring_full), the model is closing,
                                or the server is shutting down (code shutting_down)
      504 timeout (code)        the request ran past the server's per-request deadline
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from ._routes import EMBEDDINGS_PATH

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "OpenAIError",
    "body_timeout",
    "dumps",
    "invalid_api_key",
    "invalid_request",
    "method_not_allowed",
    "missing_model",
    "model_not_found",
    "not_found",
    "rate_limited",
    "request_timeout",
    "request_too_large",
    "ring_full",
    "server_error",
    "shutting_down",
    "worker_failed",
    "wrong_model_kind",
]

DEFAULT_MAX_BODY_BYTES = 1 << 20
_SURROGATE = re.compile("[\ud800-\udfff]")


class OpenAIError(Exception):
    """An error as OpenAI's API reports it: an HTTP ``status`` and the body
    ``{"error": {"message", "type", "param", "code"}}``.

    ``headers`` are extra response headers the HTTP layer should send with it (``Allow`` for a
    405, ``Retry-After`` for a 503).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = tuple(headers)

    @property
    def error_code(self) -> str:
        """What logs and metrics name it by: its ``code``, else its ``type``."""
        return self.code or self.type

    def to_dict(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def body(self) -> bytes:
        """The JSON response body (``Content-Type: application/json``)."""
        return dumps(self.to_dict())

    def sse(self) -> bytes:
        """The error as one server-sent event, for a failure after a stream has started
        (the status line is gone by then): ``data: {"error": {...}}\\n\\n``."""
        return b"data: " + self.body() + b"\n\n"

    def __repr__(self) -> str:
        return (
            f"OpenAIError({self.status}, {self.message!r}, type={self.type!r}, "
            f"param={self.param!r}, code={self.code!r})"
        )


def invalid_request(
    message: str, *, param: str | None = None, code: str | None = None
) -> OpenAIError:
    """400 ``invalid_request_error``."""
    return OpenAIError(400, message, param=param, code=code)


def model_not_found(model: str) -> OpenAIError:
    """404 ``model_not_found``: no worker serves ``model`` and no default model is set
    (OpenAI's words, as vLLM and Ollama answer)."""
    return OpenAIError(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


def missing_model(served: Sequence[str], others: Sequence[str] = (), path: str = "") -> OpenAIError:
    """400 ``missing_required_parameter``: the request names no model, and there is no
    single model (nor a default) to route it to; ``served`` are the models it may name,
    ``others`` the models attached that serve only the other kind of endpoint than ``path``."""
    if served:
        choices = "this server serves " + ", ".join(f"'{name}'" for name in served)
    elif others:
        listed = ", ".join(f"'{name}'" for name in others)
        what = "chat and completion" if path == EMBEDDINGS_PATH else "embedding"
        plural = "s" if len(others) > 1 else ""
        choices = f"none serves {path}: {listed} serve{'' if plural else 's'} {what} only"
    else:
        choices = "none is attached now"
    return OpenAIError(
        400,
        f"you must provide a model parameter ({choices})",
        param="model",
        code="missing_required_parameter",
    )


def wrong_model_kind(model: str, kind: str, path: str) -> OpenAIError:
    """400: ``model`` is of ``kind`` (``"chat"`` or ``"embedding"``) and cannot serve
    ``path`` (an embedding model asked for a chat or a text completion, or a chat model
    asked for embeddings)."""
    serves = "/v1/embeddings" if kind == "embedding" else "/v1/chat/completions and /v1/completions"
    what = "an embedding model" if kind == "embedding" else "a chat and completion model"
    return OpenAIError(
        400,
        f"The model '{model}' is {what}: it serves {serves}, not {path}.",
        param="model",
        code="model_not_supported",
    )


def request_too_large(limit: int) -> OpenAIError:
    """413: the body is over ``limit`` bytes."""
    return OpenAIError(
        413,
        f"The request body is larger than this server accepts ({limit} bytes).",
        code="request_too_large",
    )


def not_found(method: str, path: str) -> OpenAIError:
    """404 for a path this server does not serve, worded as OpenAI words it."""
    return OpenAIError(404, f"Invalid URL ({method} {path})", code="unknown_url")


def method_not_allowed(method: str, path: str, allowed: Sequence[str] = ("POST",)) -> OpenAIError:
    """405, with the ``Allow`` header HTTP requires."""
    return OpenAIError(
        405,
        f"Invalid method for URL ({method} {path}); use {' or '.join(allowed)}.",
        code="method_not_allowed",
        headers=[("Allow", ", ".join(allowed))],
    )


def ring_full(retry_after_s: int | None = None) -> OpenAIError:
    """503: no worker has a free slot. ``type`` is ``server_error`` as in OpenAI's overload
    errors (llama.cpp's server says ``unavailable_error``; clients branch on the status)."""
    headers = [] if retry_after_s is None else [("Retry-After", str(retry_after_s))]
    return OpenAIError(
        503,
        "The server is overloaded: every slot is busy. Retry after a short wait.",
        type="server_error",
        code="ring_full",
        headers=headers,
    )


def no_worker(park_timeout: float, retry_after_s: int | None = None) -> OpenAIError:
    """503: no worker took the request within ``park_timeout`` seconds."""
    headers = [] if retry_after_s is None else [("Retry-After", str(retry_after_s))]
    return OpenAIError(
        503,
        f"No worker took the request within {park_timeout:g}s. Retry after a short wait.",
        type="server_error",
        code="no_worker",
        headers=headers,
    )


def shutting_down(retry_after_s: int = 1, *, cut: bool = False) -> OpenAIError:
    """503: the server is shutting down. Before a request is taken (``cut=False``) it is
    refused so that its client retries elsewhere; ``cut=True`` ends a request still running
    when the graceful timeout passed."""
    message = (
        "The server shut down before this request finished. Retry the request."
        if cut
        else "The server is shutting down and takes no new requests. Retry the request."
    )
    return OpenAIError(
        503,
        message,
        type="server_error",
        code="shutting_down",
        headers=[("Retry-After", str(retry_after_s))],
    )


def server_error(
    message: str = "The server had an error while processing your request.",
) -> OpenAIError:
    """500 ``server_error``."""
    return OpenAIError(500, message, type="server_error")


def dumps(value: object) -> bytes:
    """Compact JSON in UTF-8; lone surrogates in strings become U+FFFD."""
    literal = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    try:
        return literal.encode()
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", literal).encode()


def worker_failed() -> OpenAIError:
    """502: the worker serving the request failed or went away (its reason is logged at the
    ingress, not shown)."""
    return OpenAIError(
        502,
        "The worker serving this request failed. Retry the request.",
        type="server_error",
        code="worker_failed",
    )


def invalid_api_key() -> OpenAIError:
    """401, as OpenAI answers a missing or wrong key."""
    return OpenAIError(
        401,
        "Incorrect API key provided. Send it as 'Authorization: Bearer <key>' (or 'X-Api-Key').",
        code="invalid_api_key",
        headers=[("WWW-Authenticate", 'Bearer realm="llmtrio"')],
    )


def rate_limited(limit_per_minute: int, retry_after_s: int) -> OpenAIError:
    """429 with ``Retry-After``: over ``limit_per_minute`` requests a minute."""
    return OpenAIError(
        429,
        f"Rate limit reached: {limit_per_minute} requests per minute. "
        f"Retry after {retry_after_s}s.",
        type="requests",
        param="rate_limit",
        code="rate_limit_exceeded",
        headers=[("Retry-After", str(retry_after_s))],
    )


def request_timeout(limit_s: float) -> OpenAIError:
    """504: the request ran past the per-request deadline and was ended."""
    return OpenAIError(
        504,
        f"The request took longer than this server's limit of {limit_s:g}s and was stopped.",
        type="server_error",
        param="request_timeout",
        code="timeout",
    )


def body_timeout(limit_s: float) -> OpenAIError:
    """408: the request body did not arrive within ``limit_s`` seconds."""
    return OpenAIError(
        408,
        f"The request body did not arrive within {limit_s:g}s.",
        code="request_timeout",
    )
