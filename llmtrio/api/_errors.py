"""OpenAI's error shapes, shared by the ingress (``llmtrio.web``) and the worker.

Pure: no I/O. Every refusal is an :class:`ApiError` that knows its HTTP status and renders
its own body. The kinds of refusal, each a status, a ``type`` and a ``code``, are one table,
:data:`ERRORS` (the constructors below build from it and ``/openapi.json`` documents it):

    ApiError                 an error in OpenAI's shape, with its HTTP status
      400 invalid_request_error a body, field or message this server cannot use (``code`` says
                                how: ``invalid_type``, ``missing_required_parameter``, ...)
      400 context_length_exceeded (code) the prompt does not fit a slot's context
      400 model_not_supported (code) the model is of another kind (chat / embedding /
                                rerank)
      401 invalid_api_key (code) a missing or wrong API key
      403 host_not_allowed / origin_not_allowed (code) a host or browser origin not served
      404 model_not_found (code) no worker serves the model named, and no default is set
      404 / 405 unknown_url / method_not_allowed (code) unknown path / wrong method
      408 request_timeout (code) the body did not arrive in time
      413 request_too_large     the body is over the size limit
      429 rate_limit_exceeded (code) over the requests-per-minute limit (Retry-After)
      500 server_error          a failure on our side
      502 worker_failed (code)  the worker serving the request failed or went away
      503 server_error          every slot is taken (code ring_full), no worker took it (code
                                no_worker), the model is closing, or the server is shutting
                                down (code shutting_down)
      504 timeout (code)        the request ran past the server's per-request deadline

A route of Anthropic's family (``llmtrio.api.error_family``: ``/v1/messages*``) tells the
same errors in Anthropic's shape, ``{"type": "error", "error": {"type", "message"}}``, its
``type`` by status (:data:`ANTHROPIC_TYPES`: ``invalid_request_error`` 400/405,
``authentication_error`` 401, ``permission_error`` 403, ``not_found_error`` 404,
``timeout_error`` 408/504, ``request_too_large`` 413, ``rate_limit_error`` 429, ``api_error``
500/502); every 503 (a full ring, a park timeout, a draining server, a model that failed or
could not load) is Anthropic's 529 ``overloaded_error``. The ``code`` stays what logs and
metrics count, whatever the shape. :class:`ErrorFamily` renders both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from ._json import dumps, sse

__all__ = [
    "ANTHROPIC_ERRORS",
    "ANTHROPIC_TYPES",
    "DEFAULT_MAX_BODY_BYTES",
    "ERRORS",
    "HOST_NOT_ALLOWED",
    "OPENAI_ERRORS",
    "ORIGIN_NOT_ALLOWED",
    "ApiError",
    "ErrorFamily",
    "ErrorKind",
    "body_timeout",
    "dumps",
    "invalid_api_key",
    "invalid_request",
    "method_not_allowed",
    "missing_model",
    "model_load_failed",
    "model_not_found",
    "model_unavailable",
    "no_worker",
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

#: Anthropic's error ``type`` for each status of this server's refusals.
ANTHROPIC_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


class ApiError(Exception):
    """A refusal: its HTTP ``status``, ``message``, and OpenAI's ``type``, ``param`` and
    ``code``. How it is told depends on the route that answers it: its route's
    :class:`ErrorFamily` renders it (``llmtrio.api.error_family(path)``).

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

    def __repr__(self) -> str:
        return (
            f"ApiError({self.status}, {self.message!r}, type={self.type!r}, "
            f"param={self.param!r}, code={self.code!r})"
        )


Headers = tuple[tuple[str, str], ...]


@attrs.frozen
class ErrorFamily:
    """The shape a route's refusals are told in, and the one place they are rendered:
    OpenAI's ``{"error": {"message", "type", "param", "code"}}`` (:data:`OPENAI_ERRORS`), or
    Anthropic's ``{"type": "error", "error": {"type", "message"}}`` with its types and
    statuses (:data:`ANTHROPIC_ERRORS`: the ``type`` by status, and 529 for an overloaded
    server). A route names its family (``llmtrio.api.Route.errors``)."""

    name: str

    @property
    def anthropic(self) -> bool:
        return self.name == "anthropic"

    def status(self, error: ApiError) -> int:
        """The HTTP status ``error`` is answered with: its own, but on Anthropic's routes a 503
        (a full ring, no worker, a draining server, a model that failed or could not load)
        is Anthropic's 529 ``overloaded_error``, which Anthropic's clients retry."""
        if self.anthropic and error.status == 503:
            return 529
        return error.status

    def to_dict(self, error: ApiError) -> dict[str, Any]:
        """The body, as data."""
        if self.anthropic:
            kind = ANTHROPIC_TYPES.get(self.status(error), "api_error")
            return {"type": "error", "error": {"type": kind, "message": error.message}}
        return {
            "error": {
                "message": error.message,
                "type": error.type,
                "param": error.param,
                "code": error.code,
            }
        }

    def body(self, error: ApiError) -> bytes:
        """The JSON response body (``Content-Type: application/json``)."""
        return dumps(self.to_dict(error))

    def response(self, error: ApiError) -> tuple[int, Headers, bytes]:
        """The whole response: its status, headers (the JSON content type and the error's
        own) and body."""
        headers = (("content-type", "application/json"), *error.headers)
        return self.status(error), headers, self.body(error)

    def event(self, error: ApiError) -> bytes:
        """The error as one server-sent event, for a failure after a stream has started (the
        status line is gone by then): ``data: {"error": {...}}\n\n``, or Anthropic's
        ``event: error\ndata: {"type": "error", ...}\n\n``."""
        return sse(self.body(error), "error" if self.anthropic else None)


#: The error families: OpenAI's, and Anthropic's (``/v1/messages*``).
OPENAI_ERRORS: Final = ErrorFamily("openai")
ANTHROPIC_ERRORS: Final = ErrorFamily("anthropic")


@attrs.frozen
class ErrorKind:
    """One kind of refusal: its HTTP ``status``, ``type`` and ``code``, and what it means (in
    the API's document). ``url`` kinds answer a path or method this server does not serve; the
    others can answer any request to a ring route. ``retry_after``: it may come with a
    ``Retry-After`` header."""

    status: int
    code: str | None
    meaning: str
    type: str = "invalid_request_error"
    retry_after: bool = False
    url: bool = False

    def error(
        self, message: str, *, param: str | None = None, headers: Sequence[tuple[str, str]] = ()
    ) -> ApiError:
        return ApiError(
            self.status, message, type=self.type, param=param, code=self.code, headers=headers
        )


def _field(code: str, meaning: str) -> ErrorKind:
    return ErrorKind(400, code, f"{meaning} (``param`` names the field)")


INVALID_REQUEST = ErrorKind(400, None, "the body is not JSON, or HTTP framing is wrong")
CONTEXT_LENGTH_EXCEEDED = ErrorKind(400, "context_length_exceeded", "the prompt does not fit")
MODEL_NOT_SUPPORTED = ErrorKind(400, "model_not_supported", "the model serves other routes")
MISSING_PARAMETER = _field("missing_required_parameter", "a required field is missing")
INVALID_API_KEY = ErrorKind(401, "invalid_api_key", "an API key is required: missing or wrong")
HOST_NOT_ALLOWED = ErrorKind(403, "host_not_allowed", "a host name this listener does not serve")
ORIGIN_NOT_ALLOWED = ErrorKind(403, "origin_not_allowed", "a browser origin not allowed")
MODEL_NOT_FOUND = ErrorKind(404, "model_not_found", "no worker serves the model named")
UNKNOWN_URL = ErrorKind(404, "unknown_url", "a path this server does not serve", url=True)
METHOD_NOT_ALLOWED = ErrorKind(405, "method_not_allowed", "a wrong method", url=True)
BODY_TIMEOUT = ErrorKind(408, "request_timeout", "the body did not arrive in time")
REQUEST_TOO_LARGE = ErrorKind(413, "request_too_large", "the body is over the size limit")
RATE_LIMITED = ErrorKind(
    429, "rate_limit_exceeded", "too many requests for this key", type="requests", retry_after=True
)
SERVER_ERROR = ErrorKind(500, None, "a failure on the server's side", type="server_error")
WORKER_FAILED = ErrorKind(
    502, "worker_failed", "the worker serving the request failed", type="server_error"
)
RING_FULL = ErrorKind(503, "ring_full", "every slot is busy", type="server_error", retry_after=True)
NO_WORKER = ErrorKind(
    503, "no_worker", "no worker took the request in time", type="server_error", retry_after=True
)
SHUTTING_DOWN = ErrorKind(
    503, "shutting_down", "the server is shutting down", type="server_error", retry_after=True
)
MODEL_UNAVAILABLE = ErrorKind(503, None, "the model failed or is closing", type="server_error")
MODEL_LOAD_FAILED = ErrorKind(
    503, "model_load_failed", "the model could not be loaded", type="server_error", retry_after=True
)
REQUEST_TIMEOUT = ErrorKind(
    504, "timeout", "the request ran past the server's deadline", type="server_error"
)

#: Every kind of refusal, by status. The field table's codes (``llmtrio.api._fields``) are the
#: 400s that name a ``param``.
ERRORS: Final[tuple[ErrorKind, ...]] = (
    INVALID_REQUEST,
    _field("invalid_type", "a field of the wrong type"),
    _field("invalid_value", "a field's value cannot be used"),
    MISSING_PARAMETER,
    _field("unsupported_parameter", "a field this server does not implement"),
    _field("integer_below_min_value", "an integer below its minimum"),
    _field("integer_above_max_value", "an integer above its maximum"),
    _field("decimal_below_min_value", "a number below its minimum"),
    _field("decimal_above_max_value", "a number above its maximum"),
    _field("empty_array", "an array that must not be empty is"),
    _field("array_above_max_length", "an array over its limit"),
    _field("string_above_max_length", "a string over its limit"),
    CONTEXT_LENGTH_EXCEEDED,
    MODEL_NOT_SUPPORTED,
    INVALID_API_KEY,
    HOST_NOT_ALLOWED,
    ORIGIN_NOT_ALLOWED,
    MODEL_NOT_FOUND,
    UNKNOWN_URL,
    METHOD_NOT_ALLOWED,
    BODY_TIMEOUT,
    REQUEST_TOO_LARGE,
    RATE_LIMITED,
    SERVER_ERROR,
    WORKER_FAILED,
    RING_FULL,
    NO_WORKER,
    SHUTTING_DOWN,
    MODEL_UNAVAILABLE,
    MODEL_LOAD_FAILED,
    REQUEST_TIMEOUT,
)


def invalid_request(message: str, *, param: str | None = None, code: str | None = None) -> ApiError:
    """400 ``invalid_request_error``; ``code`` one of :data:`ERRORS`' 400 codes."""
    return ApiError(400, message, param=param, code=code)


def model_not_found(model: str) -> ApiError:
    """404 ``model_not_found``: no worker serves ``model`` and no default model is set
    (OpenAI's words, as vLLM and Ollama answer)."""
    return MODEL_NOT_FOUND.error(
        f"The model `{model}` does not exist or you do not have access to it.", param="model"
    )


#: How the refusals below name a kind of model (the ring's kinds, as the route table's
#: ``CHAT_MODEL``, ``EMBEDDING_MODEL`` and ``RERANK_MODEL`` name them): what it is, the routes
#: it serves, and the work it serves. A kind of a newer worker that this ingress does not know
#: is named by its name.
_KIND_WORDS: Final = {
    "chat": (
        "a chat and completion model",
        "/v1/chat/completions and /v1/completions",
        "chat and completion",
    ),
    "embedding": ("an embedding model", "/v1/embeddings", "embedding"),
    "rerank": (
        "a reranking model",
        "/v1/rerank, /rerank, /v2/rerank and /v1/score",
        "reranking",
    ),
}


def _kind_words(kind: str) -> tuple[str, str, str]:
    return _KIND_WORDS.get(kind, (f"a model of kind '{kind}'", f"{kind} requests", kind))


def missing_model(
    served: Sequence[str], others: Mapping[str, str] | None = None, path: str = ""
) -> ApiError:
    """400 ``missing_required_parameter``: the request names no model, and there is no
    single model (nor a default) to route it to; ``served`` are the models it may name,
    ``others`` the models attached that serve other kinds of endpoint than ``path``, each
    with its kind."""
    others = others or {}
    if served:
        choices = "this server serves " + ", ".join(f"'{name}'" for name in served)
    elif others:
        by_kind: dict[str, list[str]] = {}
        for name, kind in others.items():
            by_kind.setdefault(kind, []).append(name)
        parts = []
        for kind, names in by_kind.items():
            listed = ", ".join(f"'{name}'" for name in names)
            verb = "serve" if len(names) > 1 else "serves"
            parts.append(f"{listed} {verb} {_kind_words(kind)[2]} only")
        choices = f"none serves {path}: " + "; ".join(parts)
    else:
        choices = "none is attached now"
    return MISSING_PARAMETER.error(f"you must provide a model parameter ({choices})", param="model")


def wrong_model_kind(model: str, kind: str, path: str) -> ApiError:
    """400: ``model`` is of ``kind`` (``"chat"``, ``"embedding"`` or ``"rerank"``) and
    cannot serve ``path`` (an embedding model asked for a chat or a text completion, a chat
    model asked for embeddings, a reranking model asked for either)."""
    what, serves, _ = _kind_words(kind)
    return MODEL_NOT_SUPPORTED.error(
        f"The model '{model}' is {what}: it serves {serves}, not {path}.", param="model"
    )


def request_too_large(limit: int) -> ApiError:
    """413: the body is over ``limit`` bytes."""
    return REQUEST_TOO_LARGE.error(
        f"The request body is larger than this server accepts ({limit} bytes)."
    )


def not_found(method: str, path: str) -> ApiError:
    """404 for a path this server does not serve, worded as OpenAI words it."""
    return UNKNOWN_URL.error(f"Invalid URL ({method} {path})")


def method_not_allowed(method: str, path: str, allowed: Sequence[str] = ("POST",)) -> ApiError:
    """405, with the ``Allow`` header HTTP requires."""
    return METHOD_NOT_ALLOWED.error(
        f"Invalid method for URL ({method} {path}); use {' or '.join(allowed)}.",
        headers=[("Allow", ", ".join(allowed))],
    )


def _retry(retry_after_s: int | None) -> list[tuple[str, str]]:
    return [] if retry_after_s is None else [("Retry-After", str(retry_after_s))]


def ring_full(retry_after_s: int | None = None) -> ApiError:
    """503: no worker has a free slot. ``type`` is ``server_error`` as in OpenAI's overload
    errors (llama.cpp's server says ``unavailable_error``; clients branch on the status)."""
    return RING_FULL.error(
        "The server is overloaded: every slot is busy. Retry after a short wait.",
        headers=_retry(retry_after_s),
    )


def no_worker(park_timeout: float, retry_after_s: int | None = None) -> ApiError:
    """503: no worker took the request within ``park_timeout`` seconds."""
    return NO_WORKER.error(
        f"No worker took the request within {park_timeout:g}s. Retry after a short wait.",
        headers=_retry(retry_after_s),
    )


def shutting_down(retry_after_s: int = 1, *, cut: bool = False) -> ApiError:
    """503: the server is shutting down. Before a request is taken (``cut=False``) it is
    refused so that its client retries elsewhere; ``cut=True`` ends a request still running
    when the graceful timeout passed."""
    message = (
        "The server shut down before this request finished. Retry the request."
        if cut
        else "The server is shutting down and takes no new requests. Retry the request."
    )
    return SHUTTING_DOWN.error(message, headers=_retry(retry_after_s))


def server_error(
    message: str = "The server had an error while processing your request.",
) -> ApiError:
    """500 ``server_error``."""
    return SERVER_ERROR.error(message)


def model_unavailable(message: str) -> ApiError:
    """503 ``server_error``: the model failed or is closing."""
    return MODEL_UNAVAILABLE.error(message)


def model_load_failed(model: str, reason: str, retry_after_s: int | None = None) -> ApiError:
    """503 ``model_load_failed``: the catalog model ``model`` could not be loaded, and why
    (a corrupt file, a budget it cannot fit, a load past its timeout)."""
    return MODEL_LOAD_FAILED.error(
        f"The model {model!r} could not be loaded: {reason}", headers=_retry(retry_after_s)
    )


def worker_failed() -> ApiError:
    """502: the worker serving the request failed or went away (its reason is logged at the
    ingress, not shown)."""
    return WORKER_FAILED.error("The worker serving this request failed. Retry the request.")


def invalid_api_key() -> ApiError:
    """401, as OpenAI answers a missing or wrong key."""
    return INVALID_API_KEY.error(
        "Incorrect API key provided. Send it as 'Authorization: Bearer <key>' (or 'X-Api-Key').",
        headers=[("WWW-Authenticate", 'Bearer realm="llmtrio"')],
    )


def rate_limited(limit_per_minute: int, retry_after_s: int) -> ApiError:
    """429 with ``Retry-After``: over ``limit_per_minute`` requests a minute."""
    return RATE_LIMITED.error(
        f"Rate limit reached: {limit_per_minute} requests per minute. "
        f"Retry after {retry_after_s}s.",
        param="rate_limit",
        headers=_retry(retry_after_s),
    )


def request_timeout(limit_s: float) -> ApiError:
    """504: the request ran past the per-request deadline and was ended."""
    return REQUEST_TIMEOUT.error(
        f"The request took longer than this server's limit of {limit_s:g}s and was stopped.",
        param="request_timeout",
    )


def body_timeout(limit_s: float) -> ApiError:
    """408: the request body did not arrive within ``limit_s`` seconds."""
    return BODY_TIMEOUT.error(f"The request body did not arrive within {limit_s:g}s.")
