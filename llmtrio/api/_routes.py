"""The public API's routes, named once: the path constants the ingress and the workers route by,
and :data:`ROUTES`, the table ``/openapi.json`` lists its operations from.

The ingress (``llmtrio.web``) forwards ``POST`` on :data:`RING_PATHS` through the ring and
answers everything else itself; the worker dispatches on the path it is given and trusts the
ingress's routing (it checks no methods, answers no 404/405). The ingress's other pages (``/``,
``/metrics``, the probes) are not part of the API and not in the table.

Each route belongs to an error family (:data:`OPENAI_ERRORS` or :data:`ANTHROPIC_ERRORS`):
every refusal on it, the ingress's and the worker's, is told in that family's shape
(:func:`error_family`: an ``llmtrio.api.ErrorFamily`` renders them).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final

import attrs

from ._errors import ANTHROPIC_ERRORS, OPENAI_ERRORS, ErrorFamily

__all__ = [
    "AUDIO_PARTS",
    "CHAT_MODEL",
    "CHAT_PATH",
    "COMPLETIONS_PATH",
    "COUNT_TOKENS_PATH",
    "DETOKENIZE_PATH",
    "EMBEDDINGS_PATH",
    "EMBEDDING_MODEL",
    "FORM_PATHS",
    "HEALTH_PATH",
    "IMAGE_PARTS",
    "MANAGE_PATHS",
    "MESSAGES_PATH",
    "MODELS_LOAD_PATH",
    "MODELS_PATH",
    "MODELS_UNLOAD_PATH",
    "MODEL_KINDS",
    "OPENAPI_PATH",
    "RERANK_ALIAS_PATH",
    "RERANK_MODEL",
    "RERANK_PATH",
    "RERANK_V2_PATH",
    "RESPONSES_INPUT_TOKENS_PATH",
    "RESPONSES_PATH",
    "RING_PATHS",
    "ROUTES",
    "SCORE_PATH",
    "TOKENIZE_PATH",
    "TRANSCRIPTIONS_PATH",
    "TRANSLATIONS_PATH",
    "Body",
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
TRANSCRIPTIONS_PATH = "/v1/audio/transcriptions"
TRANSLATIONS_PATH = "/v1/audio/translations"
#: Reranking: Jina's and llama.cpp's shape (also llama.cpp's unversioned path), Cohere's v2,
#: and vLLM's scores of text pairs.
RERANK_PATH = "/v1/rerank"
RERANK_ALIAS_PATH = "/rerank"
RERANK_V2_PATH = "/v2/rerank"
SCORE_PATH = "/v1/score"


class Body(enum.StrEnum):
    """The field table's endpoints (``llmtrio.api._fields``): which request body a route
    reads."""

    CHAT = "chat"
    COMPLETIONS = "completions"
    EMBEDDINGS = "embeddings"
    #: OpenAI's Responses API (``POST /v1/responses`` and ``/v1/responses/input_tokens``).
    RESPONSES = "responses"
    #: Anthropic's Messages API.
    MESSAGES = "messages"
    #: The count of a message request's input tokens (the same body as ``MESSAGES``;
    #: ``max_tokens`` and ``stream`` mean nothing there).
    COUNT_TOKENS = "count_tokens"
    #: ``/models/load`` and ``/models/unload``.
    MODELS = "models"
    TOKENIZE = "tokenize"
    DETOKENIZE = "detokenize"
    #: OpenAI's audio transcriptions and translations (a ``multipart/form-data`` body).
    TRANSCRIPTIONS = "transcriptions"
    TRANSLATIONS = "translations"
    #: Reranking's three bodies: Jina's (and llama.cpp's), Cohere's v2, vLLM's ``/v1/score``.
    RERANK = "rerank"
    RERANK_V2 = "rerank_v2"
    SCORE = "score"


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
    (loads or unloads it), never through a default. ``image_part`` and ``audio_part`` are
    the ``type`` of its body's image and audio parts (a projector's input), if it takes any;
    a ``form`` route's body is ``multipart/form-data`` (an uploaded file beside its fields),
    not JSON.
    """

    method: str
    path: str
    operation_id: str
    summary: str
    endpoint: Body | None = None
    open: bool = False
    errors: ErrorFamily = OPENAI_ERRORS
    model_kind: str | None = CHAT_MODEL
    manage: bool = False
    image_part: str | None = None
    audio_part: str | None = None
    form: bool = False

    @property
    def ring(self) -> bool:
        """Whether a worker serves it, through the ring."""
        return self.endpoint is not None


ROUTES: Final[tuple[Route, ...]] = (
    Route("POST", CHAT_PATH, "createChatCompletion", "Create a chat completion.", Body.CHAT,
          image_part="image_url", audio_part="input_audio"),
    Route("POST", COMPLETIONS_PATH, "createCompletion", "Create a text completion.",
          Body.COMPLETIONS),
    Route("POST", EMBEDDINGS_PATH, "createEmbedding",
          "Create embeddings (on a worker serving an embedding model).", Body.EMBEDDINGS,
          model_kind=EMBEDDING_MODEL),
    Route("POST", RESPONSES_PATH, "createResponse",
          "Create a response (OpenAI's Responses API, stateless).", Body.RESPONSES,
          image_part="input_image", audio_part="input_audio"),
    Route("POST", RESPONSES_INPUT_TOKENS_PATH, "countResponseInputTokens",
          "Count a response request's input tokens, templated as a generation.", Body.RESPONSES,
          image_part="input_image", audio_part="input_audio"),
    Route("POST", TOKENIZE_PATH, "tokenize",
          "Text to the model's token ids (llama.cpp server's /tokenize).", Body.TOKENIZE,
          model_kind=None),
    Route("POST", DETOKENIZE_PATH, "detokenize",
          "Token ids to the model's text (llama.cpp server's /detokenize).", Body.DETOKENIZE,
          model_kind=None),
    Route("POST", RERANK_PATH, "rerank",
          "Rank documents by their relevance to a query (Jina's and llama.cpp's shape; a "
          "reranking model).", Body.RERANK, model_kind=RERANK_MODEL),
    Route("POST", RERANK_ALIAS_PATH, "rerankUnversioned",
          "The same as /v1/rerank (llama.cpp server's path).", Body.RERANK,
          model_kind=RERANK_MODEL),
    Route("POST", RERANK_V2_PATH, "rerankV2",
          "Rank documents by their relevance to a query (Cohere's v2 shape; a reranking "
          "model).", Body.RERANK_V2, model_kind=RERANK_MODEL),
    Route("POST", SCORE_PATH, "score",
          "Score text pairs, one to one or one to many (vLLM's shape; a reranking model).",
          Body.SCORE, model_kind=RERANK_MODEL),
    Route("GET", MODELS_PATH, "listModels", "The models the attached workers serve.", open=True),
    Route("GET", HEALTH_PATH, "health", "Whether this ingress can serve, for load balancers.",
          open=True),
    Route("GET", OPENAPI_PATH, "openapi", "This document."),
    Route("POST", MESSAGES_PATH, "createMessage", "Create a message (Anthropic's Messages API).",
          Body.MESSAGES, errors=ANTHROPIC_ERRORS, image_part="image"),
    Route("POST", COUNT_TOKENS_PATH, "countMessageTokens",
          "Count a message request's input tokens (Anthropic's Messages API).", Body.COUNT_TOKENS,
          errors=ANTHROPIC_ERRORS, image_part="image"),
    Route("POST", MODELS_LOAD_PATH, "loadModel",
          "Load a catalog model now (by its name; never a path).", Body.MODELS, model_kind=None,
          manage=True),
    Route("POST", MODELS_UNLOAD_PATH, "unloadModel",
          "Unload an idle catalog model now (never a pinned one).", Body.MODELS, model_kind=None,
          manage=True),
    Route("POST", TRANSCRIPTIONS_PATH, "createTranscription",
          "Transcribe an audio file (a model with an audio projector).", Body.TRANSCRIPTIONS,
          form=True),
    Route("POST", TRANSLATIONS_PATH, "createTranslation",
          "Translate an audio file into English text (a model with an audio projector).",
          Body.TRANSLATIONS, form=True),
)  # fmt: skip

#: Served by the workers through the ring, ``POST`` only.
RING_PATHS: Final = frozenset(route.path for route in ROUTES if route.ring)
#: The routes that manage a model, of any kind: they name it exactly, never by a default.
MANAGE_PATHS: Final = frozenset(route.path for route in ROUTES if route.manage)
#: The ``type`` of each field-table endpoint's image parts.
IMAGE_PARTS: Final[Mapping[Body, str]] = {
    route.endpoint: route.image_part
    for route in ROUTES
    if route.endpoint is not None and route.image_part is not None
}
#: The ``type`` of each field-table endpoint's audio parts.
AUDIO_PARTS: Final[Mapping[Body, str]] = {
    route.endpoint: route.audio_part
    for route in ROUTES
    if route.endpoint is not None and route.audio_part is not None
}
#: The routes whose body is ``multipart/form-data``.
FORM_PATHS: Final = frozenset(route.path for route in ROUTES if route.form)
#: The kind of model each ring route needs (``None``: any kind).
MODEL_KINDS: Final[Mapping[str, str | None]] = {
    route.path: route.model_kind for route in ROUTES if route.ring
}


def error_family(path: str) -> ErrorFamily:
    """The error family of every answer on ``path``: its route's, or for a path no route
    names, the family of the route it lies under (``/v1/messages/batches`` is refused in
    Anthropic's shape); OpenAI's otherwise."""
    for route in ROUTES:
        if route.errors != OPENAI_ERRORS and (
            path == route.path or path.startswith(route.path + "/")
        ):
            return route.errors
    return OPENAI_ERRORS
