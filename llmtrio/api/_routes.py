"""The public API's routes, named once: the path constants the ingress and the workers route by,
and :data:`ROUTES`, the table ``/openapi.json`` lists its operations from.

The ingress (``llmtrio.web``) forwards ``POST`` on :data:`RING_PATHS` through the ring and
answers everything else itself; the worker dispatches on the path it is given and trusts the
ingress's routing (it checks no methods, answers no 404/405). The ingress's other pages (``/``,
``/metrics``, the probes) are not part of the API and not in the table.

Each route belongs to an error family (:data:`OPENAI_ERRORS` or :data:`ANTHROPIC_ERRORS`):
every refusal on it, the ingress's and the worker's, is told in that family's shape
(:func:`error_family`, rendered by ``llmtrio.api.OpenAIError``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import attrs

__all__ = [
    "ANTHROPIC_ERRORS",
    "CHAT",
    "CHAT_MODEL",
    "CHAT_PATH",
    "COMPLETIONS",
    "COMPLETIONS_PATH",
    "COUNT_TOKENS",
    "COUNT_TOKENS_PATH",
    "DETOKENIZE",
    "DETOKENIZE_PATH",
    "EMBEDDINGS",
    "EMBEDDINGS_PATH",
    "EMBEDDING_MODEL",
    "HEALTH_PATH",
    "MANAGE_PATHS",
    "MESSAGES_API",
    "MESSAGES_PATH",
    "MODELS",
    "MODELS_LOAD_PATH",
    "MODELS_PATH",
    "MODELS_UNLOAD_PATH",
    "MODEL_KINDS",
    "OPENAI_ERRORS",
    "OPENAPI_PATH",
    "RERANK",
    "RERANK_ALIAS_PATH",
    "RERANK_MODEL",
    "RERANK_PATH",
    "RERANK_V2",
    "RERANK_V2_PATH",
    "RESPONSES",
    "RESPONSES_INPUT_TOKENS_PATH",
    "RESPONSES_PATH",
    "RING_PATHS",
    "ROUTES",
    "SCORE",
    "SCORE_PATH",
    "TOKENIZE",
    "TOKENIZE_PATH",
    "Route",
    "error_family",
]

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
EMBEDDINGS_PATH = "/v1/embeddings"
MODELS_PATH = "/v1/models"
HEALTH_PATH = "/health"
OPENAPI_PATH = "/openapi.json"
RESPONSES_PATH = "/v1/responses"
RESPONSES_INPUT_TOKENS_PATH = "/v1/responses/input_tokens"
MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
#: Reranking: Jina's and llama.cpp's shape (also llama.cpp's unversioned path), Cohere's v2,
#: and vLLM's scores of text pairs.
RERANK_PATH = "/v1/rerank"
RERANK_ALIAS_PATH = "/rerank"
RERANK_V2_PATH = "/v2/rerank"
SCORE_PATH = "/v1/score"

#: The error families: OpenAI's ``{"error": {"message", "type", "param", "code"}}`` and
#: Anthropic's ``{"type": "error", "error": {"type", "message"}}`` (its types and statuses).
OPENAI_ERRORS: Final = "openai"
ANTHROPIC_ERRORS: Final = "anthropic"
#: The field table's endpoints (``llmtrio.api._fields``): the body each route reads.
CHAT: Final = "chat"
COMPLETIONS: Final = "completions"
EMBEDDINGS: Final = "embeddings"
#: OpenAI's Responses API (``POST /v1/responses`` and ``/v1/responses/input_tokens``).
RESPONSES: Final = "responses"
#: Anthropic's Messages API: a message, and the count of a message request's input tokens
#: (the same body; ``max_tokens`` and ``stream`` mean nothing there).
MESSAGES_API: Final = "messages"
COUNT_TOKENS: Final = "count_tokens"
#: ``/models/load`` and ``/models/unload``.
MODELS: Final = "models"
TOKENIZE: Final = "tokenize"
DETOKENIZE: Final = "detokenize"
#: Reranking's three bodies: Jina's (and llama.cpp's), Cohere's v2, vLLM's ``/v1/score``.
RERANK: Final = "rerank"
RERANK_V2: Final = "rerank_v2"
SCORE: Final = "score"

#: The kinds of model a route needs (the ring's model kinds: ``llmtrio.ring.KINDS``).
CHAT_MODEL: Final = "chat"
EMBEDDING_MODEL: Final = "embedding"
RERANK_MODEL: Final = "rerank"

#: llama.cpp's router names: load or unload a catalog model, by name only.
MODELS_LOAD_PATH = "/models/load"
MODELS_UNLOAD_PATH = "/models/unload"
TOKENIZE_PATH = "/tokenize"
DETOKENIZE_PATH = "/detokenize"


@attrs.frozen
class Route:
    """One operation of the public API.

    ``endpoint`` names the field table's endpoint (``llmtrio.api._fields``) whose fields make a
    ring route's request body; a route without one is answered by the ingress itself.
    ``open`` routes are served without an API key. ``errors`` is the family of its error
    shape (the paths under it share it: see :func:`error_family`). ``model_kind`` is the
    kind of model a ring route needs (a kind of the ring's ``KINDS``; ``None``: a model of
    any kind, as every model has a tokenizer). A ``manage`` route names its model exactly
    (loads or unloads it), never through a default.
    """

    method: str
    path: str
    operation_id: str
    summary: str
    endpoint: str | None = None
    open: bool = False
    errors: str = OPENAI_ERRORS
    model_kind: str | None = CHAT_MODEL
    manage: bool = False

    @property
    def ring(self) -> bool:
        """Whether a worker serves it, through the ring."""
        return self.endpoint is not None


ROUTES: Final[tuple[Route, ...]] = (
    Route("POST", CHAT_PATH, "createChatCompletion", "Create a chat completion.", CHAT),
    Route("POST", COMPLETIONS_PATH, "createCompletion", "Create a text completion.",
          COMPLETIONS),
    Route("POST", EMBEDDINGS_PATH, "createEmbedding",
          "Create embeddings (on a worker serving an embedding model).", EMBEDDINGS,
          model_kind=EMBEDDING_MODEL),
    Route("POST", RESPONSES_PATH, "createResponse",
          "Create a response (OpenAI's Responses API, stateless).", RESPONSES),
    Route("POST", RESPONSES_INPUT_TOKENS_PATH, "countResponseInputTokens",
          "Count a response request's input tokens, templated as a generation.", RESPONSES),
    Route("POST", TOKENIZE_PATH, "tokenize",
          "Text to the model's token ids (llama.cpp server's /tokenize).", TOKENIZE,
          model_kind=None),
    Route("POST", DETOKENIZE_PATH, "detokenize",
          "Token ids to the model's text (llama.cpp server's /detokenize).", DETOKENIZE,
          model_kind=None),
    Route("POST", RERANK_PATH, "rerank",
          "Rank documents by their relevance to a query (Jina's and llama.cpp's shape; a "
          "reranking model).", RERANK, model_kind=RERANK_MODEL),
    Route("POST", RERANK_ALIAS_PATH, "rerankUnversioned",
          "The same as /v1/rerank (llama.cpp server's path).", RERANK,
          model_kind=RERANK_MODEL),
    Route("POST", RERANK_V2_PATH, "rerankV2",
          "Rank documents by their relevance to a query (Cohere's v2 shape; a reranking "
          "model).", RERANK_V2, model_kind=RERANK_MODEL),
    Route("POST", SCORE_PATH, "score",
          "Score text pairs, one to one or one to many (vLLM's shape; a reranking model).",
          SCORE, model_kind=RERANK_MODEL),
    Route("GET", MODELS_PATH, "listModels", "The models the attached workers serve.", open=True),
    Route("GET", HEALTH_PATH, "health", "Whether this ingress can serve, for load balancers.",
          open=True),
    Route("GET", OPENAPI_PATH, "openapi", "This document."),
    Route("POST", MESSAGES_PATH, "createMessage", "Create a message (Anthropic's Messages API).",
          MESSAGES_API, errors=ANTHROPIC_ERRORS),
    Route("POST", COUNT_TOKENS_PATH, "countMessageTokens",
          "Count a message request's input tokens (Anthropic's Messages API).", COUNT_TOKENS,
          errors=ANTHROPIC_ERRORS),
    Route("POST", MODELS_LOAD_PATH, "loadModel",
          "Load a catalog model now (by its name; never a path).", MODELS, model_kind=None,
          manage=True),
    Route("POST", MODELS_UNLOAD_PATH, "unloadModel",
          "Unload an idle catalog model now (never a pinned one).", MODELS, model_kind=None,
          manage=True),
)  # fmt: skip

#: Served by the workers through the ring, ``POST`` only.
RING_PATHS: Final = frozenset(route.path for route in ROUTES if route.ring)
#: The routes that manage a model, of any kind: they name it exactly, never by a default.
MANAGE_PATHS: Final = frozenset(route.path for route in ROUTES if route.manage)
#: The kind of model each ring route needs (``None``: any kind).
MODEL_KINDS: Final[Mapping[str, str | None]] = {
    route.path: route.model_kind for route in ROUTES if route.ring
}


def error_family(path: str) -> str:
    """The error family of every answer on ``path``: its route's, or for a path no route
    names, the family of the route it lies under (``/v1/messages/batches`` is refused in
    Anthropic's shape); OpenAI's otherwise."""
    for route in ROUTES:
        if route.errors != OPENAI_ERRORS and (
            path == route.path or path.startswith(route.path + "/")
        ):
            return route.errors
    return OPENAI_ERRORS
