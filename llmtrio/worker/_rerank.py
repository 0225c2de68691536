"""Reranking's endpoints: ``POST /v1/rerank`` and ``/rerank`` (Jina's and llama.cpp's shape),
``/v2/rerank`` (Cohere's) and ``/v1/score`` (vLLM's), one endpoint value each on the
:class:`~._shapes.Endpoint` shape and one ``run`` for all.

The work: each document's pair with its query is tokenized as the model reads a pair
(``RerankEngine.pair``; in a worker thread when the texts are long), a pair over the model's
context is cut (the request asks for it) or refused naming the document, and the pairs are
scored by the engine in batches with other requests' pairs. The answer (:class:`Ranked`)
holds a score a pair, in the request's order; each shape's encoder writes it: Jina's and
Cohere's sorted best first (ties by index) and cut to ``top_n``, vLLM's in the pairs' order.
Usage counts the pairs' tokens.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import attrs
import numpy as np
import numpy.typing as npt

from ..api import (
    RERANK_ALIAS_PATH,
    RERANK_PATH,
    RERANK_V2_PATH,
    SCORE_PATH,
    ApiError,
    RequestLimits,
    dumps,
    invalid_request,
    json_string,
)
from ..engine import Pair, RerankEngine
from ._encoding import Answer, ResponseMeta, WholeBody
from ._rerank_request import (
    RerankRequest,
    parse_cohere_rerank_request,
    parse_rerank_request,
    parse_score_request,
)
from ._shapes import Encoder, Endpoint, Finished, run_tokenizer

__all__ = [
    "RERANK_ALIAS_ENDPOINT",
    "RERANK_ENDPOINT",
    "RERANK_V2_ENDPOINT",
    "SCORE_ENDPOINT",
    "CohereRerankBody",
    "JinaRerankBody",
    "Ranked",
    "ScoreBody",
    "ranking",
]


@attrs.frozen(kw_only=True)
class Ranked(Answer):
    """The answer of a reranking request: each pair's score, in the request's order
    (``scores[i]`` for document ``i``), and the ``prompt_tokens`` of all its pairs."""

    kind: ClassVar[str] = "rerank"
    scores: npt.NDArray[np.float32] = attrs.field(eq=False)

    @property
    def inputs(self) -> int:
        return len(self.scores)


def ranking(scores: npt.NDArray[np.float32], top_n: int | None) -> list[int]:
    """The documents' indices best first (a tie in the lower index first), the best
    ``top_n`` of them (``None``: all)."""
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    return order if top_n is None else order[:top_n]


def _score(value: np.floating[Any]) -> bytes:
    """A score as JSON (refused when it is not finite: the caller's 500)."""
    return dumps(float(value))


@attrs.define
class JinaRerankBody(WholeBody):
    """``{"id", "object": "list", "model", "usage", "results": [{"index",
    "relevance_score", "document"}]}``: Jina's results (llama.cpp's, with the documents)."""

    request: RerankRequest
    meta: ResponseMeta

    def finish(self, answer: Ranked) -> bytes:
        results = []
        for index in ranking(answer.scores, self.request.top_n):
            result = b'{"index":%d,"relevance_score":%s' % (index, _score(answer.scores[index]))
            if self.request.return_documents:
                text = json_string(self.request.documents[index])
                result += b',"document":{"text":' + text + b"}"
            results.append(result + b"}")
        usage = {"prompt_tokens": answer.prompt_tokens, "total_tokens": answer.prompt_tokens}
        head = dumps(
            {"id": self.meta.id, "object": "list", "model": self.meta.model, "usage": usage}
        )
        return head[:-1] + b',"results":[' + b",".join(results) + b"]}"


@attrs.define
class CohereRerankBody(WholeBody):
    """``{"id", "results": [{"index", "relevance_score"}], "meta"}``: Cohere's v2 answer."""

    request: RerankRequest
    meta: ResponseMeta

    def finish(self, answer: Ranked) -> bytes:
        results = b",".join(
            b'{"index":%d,"relevance_score":%s}' % (index, _score(answer.scores[index]))
            for index in ranking(answer.scores, self.request.top_n)
        )
        meta = {
            "api_version": {"version": "2"},
            "tokens": {"input_tokens": answer.prompt_tokens, "output_tokens": 0},
        }
        return (
            b'{"id":' + json_string(self.meta.id) + b',"results":[' + results + b'],"meta":'
            + dumps(meta) + b"}"
        )  # fmt: skip


@attrs.define
class ScoreBody(WholeBody):
    """``{"id", "object": "list", "created", "model", "data": [{"index", "object": "score",
    "score"}], "usage"}``: vLLM's scores, in the pairs' order."""

    request: RerankRequest
    meta: ResponseMeta

    def finish(self, answer: Ranked) -> bytes:
        data = b",".join(
            b'{"index":%d,"object":"score","score":%s}' % (i, _score(score))
            for i, score in enumerate(answer.scores)
        )
        usage = {
            "prompt_tokens": answer.prompt_tokens,
            "total_tokens": answer.prompt_tokens,
            "completion_tokens": 0,
        }
        head = dumps(
            {
                "id": self.meta.id,
                "object": "list",
                "created": self.meta.created,
                "model": self.meta.model,
            }
        )
        return head[:-1] + b',"data":[' + data + b'],"usage":' + dumps(usage) + b"}"


def _pairs(engine: RerankEngine, request: RerankRequest) -> list[Pair]:
    return [
        engine.pair(
            request.query(i),
            document,
            truncate=request.truncate,
            max_document_tokens=request.max_document_tokens,
        )
        for i, document in enumerate(request.documents)
    ]


def _too_long(request: RerankRequest, index: int, pair: Pair, ctx_size: int) -> ApiError:
    """400 ``context_length_exceeded`` naming the document whose pair is over the context
    (or the query, when its pair is over it with the document cut to nothing)."""
    if request.truncate:  # cut to nothing, and still over
        param = request.query_name(index)
        return invalid_request(
            f"This model's maximum context length is {ctx_size} tokens, however the "
            f"'{param}' alone (with the model's pair format) resulted in {len(pair.tokens)} "
            f"tokens. Please reduce the length of '{param}'.",
            param=param,
            code="context_length_exceeded",
        )
    param = f"{request.document_param}[{index}]"
    return invalid_request(
        f"This model's maximum context length is {ctx_size} tokens, however "
        f"'{param}' with its query resulted in {len(pair.tokens)} tokens. Please reduce the "
        f"length of '{param}', or set 'truncation' to true to cut its end.",
        param=param,
        code="context_length_exceeded",
    )


@attrs.frozen
class _Rerank:
    """One reranking route: its body's shape (``parse``) and answer's (``body``); the work
    is the same for all."""

    route: str
    parse_body: Callable[[bytes, RequestLimits], RerankRequest]
    body: Callable[[RerankRequest, ResponseMeta], Encoder[Any]]
    id_prefix: str = "rerank"
    model_kind: str = "rerank"

    def parse(self, body: bytes, limits: RequestLimits) -> RerankRequest:
        return self.parse_body(body, limits)

    @asynccontextmanager
    async def run(self, engine: RerankEngine, request: RerankRequest) -> AsyncIterator[Finished]:
        size = sum(map(len, request.documents)) + sum(map(len, request.queries))
        pairs = await run_tokenizer(size, _pairs, engine, request)
        for index, pair in enumerate(pairs):
            if len(pair.tokens) > engine.ctx_size:
                raise _too_long(request, index, pair, engine.ctx_size)
        result = await engine.score_tokens([pair.tokens for pair in pairs])
        yield Finished(Ranked(scores=result.scores, prompt_tokens=result.prompt_tokens))

    def encoder(self, request: RerankRequest, meta: ResponseMeta) -> Encoder[Any]:
        return self.body(request, meta)


RERANK_ENDPOINT: Endpoint[RerankRequest] = _Rerank(
    RERANK_PATH, parse_rerank_request, JinaRerankBody
)
RERANK_ALIAS_ENDPOINT: Endpoint[RerankRequest] = _Rerank(
    RERANK_ALIAS_PATH, parse_rerank_request, JinaRerankBody
)
RERANK_V2_ENDPOINT: Endpoint[RerankRequest] = _Rerank(
    RERANK_V2_PATH, parse_cohere_rerank_request, CohereRerankBody
)
SCORE_ENDPOINT: Endpoint[RerankRequest] = _Rerank(
    SCORE_PATH, parse_score_request, ScoreBody, id_prefix="score"
)
