"""The request fields of reranking: Jina's and llama.cpp's ``/v1/rerank`` (and ``/rerank``),
Cohere's ``/v2/rerank`` and vLLM's ``/v1/score``. Pure; a part of the field table
(``llmtrio.api._fields``).

``documents`` (and ``/v1/score``'s ``text_1`` and ``text_2``) are the endpoint's to tell apart
(a text, or an object with its ``text``); their items are checked with :data:`DOCUMENT` and
:data:`DOCUMENT_TEXT`, and their count is bounded by ``max_rerank_documents``.
"""

from __future__ import annotations

from typing import Final

from ._field_spec import INT32_MAX, Field, RequestLimits, Schema, custom, part, ref
from ._routes import Body

__all__ = ["DOCUMENT", "DOCUMENT_TEXT", "RERANK_FIELDS", "rerank_components"]

#: A document as a text.
DOCUMENT_TEXT: Final = part("", "string", nullable=False, text=True)
#: A document as an object (Jina's ``{"text": ...}``).
DOCUMENT: Final = part("", "object", nullable=False, component="RerankDocument", properties=(
    part("text", "string", required=True, nullable=False, text=True),
))  # fmt: skip


def _documents(limits: RequestLimits) -> Schema:
    return {
        "type": "array",
        "minItems": 1,
        "maxItems": limits.max_rerank_documents,
        "items": {"anyOf": [{"type": "string"}, ref("RerankDocument")]},
    }


def _texts(limits: RequestLimits) -> Schema:
    many = {"type": "array", "items": {"type": "string"}, "minItems": 1}
    return {"anyOf": [{"type": "string"}, {**many, "maxItems": limits.max_rerank_documents}]}


def rerank_components(limits: RequestLimits) -> dict[str, Schema]:
    """The reranking endpoints' schemas that the request schemas refer to."""
    return {"RerankDocument": DOCUMENT.body(limits)}


_TOP_N = "The best this many results, best first (default: all)."
_TRUNCATION = (
    "Cut the end of a document whose pair with the query is longer than the model's "
    "context, so that it fits; false (default): such a document is a 400 naming it."
)

#: The fields of the three reranking endpoints.
RERANK_FIELDS: Final[tuple[Field, ...]] = (
    Field("model", "string", frozenset({Body.RERANK, Body.RERANK_V2, Body.SCORE}),
          "The reranking model's name."),
    Field("query", "string", frozenset({Body.RERANK, Body.RERANK_V2}),
          "What the documents are ranked for.", required=True),
    Field("documents", "custom", frozenset({Body.RERANK, Body.RERANK_V2}), required=True,
          shape=_documents, limit="max_rerank_documents",
          description="The documents to rank: texts, or objects with their ``text``."),
    Field("top_n", "integer", frozenset({Body.RERANK, Body.RERANK_V2}), _TOP_N, minimum=1,
          maximum=INT32_MAX),
    Field("return_documents", "boolean", frozenset({Body.RERANK}),
          "Each result carries its ``document`` (``{\"text\": ...}``); default true."),
    Field("truncation", "boolean", frozenset({Body.RERANK, Body.SCORE}), _TRUNCATION),
    Field("max_tokens_per_doc", "integer", frozenset({Body.RERANK_V2}),
          "A document is cut to this many tokens (default 4096, Cohere's), then, as "
          "Cohere's API does, its end as far as its pair with the query must be to fit the "
          "model's context.", minimum=1, maximum=INT32_MAX),
    custom("text_1", {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1,
                                                      "items": {"type": "string"}}]},
           Body.SCORE, required=True,
           description="The first text of every pair, or one per pair (as many as "
           "``text_2``)."),
    Field("text_2", "custom", frozenset({Body.SCORE}), required=True, shape=_texts,
          limit="max_rerank_documents",
          description="The second texts: one pair each, with ``text_1`` or its item of the "
          "same index."),
)  # fmt: skip
