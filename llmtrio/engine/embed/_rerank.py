"""The reranking engine: :class:`RerankEngine`, a cross-encoder on the batched embedding engine.

A GGUF with rank pooling (``LLAMA_POOLING_TYPE_RANK``) is a cross-encoder: each sequence (a
query and one document, :mod:`._pairs`) is pooled through the model's classification head,
inside llama.cpp's graph, into ``n_cls_out`` values. An encoder (BERT) pools its ``[CLS]``
state through ``cls`` (and tanh) and ``cls.output``: one logit. A decoder (Qwen3-Reranker)
pools its last token through ``cls.output``, the rows of its labels ``yes`` and ``no``, and
llama.cpp takes their softmax. The score is the first value, as llama.cpp's server gives it:
the logit, or the probability of ``yes``.

Everything else is the embedding engine's: many pairs of many callers packed into each
``llama_decode``, a cancelled caller dropped at the next batch, the thread count measured.
The outputs are not normalized, and a decode of fewer than ``FLASH_ATTN_TILE_ROWS`` tokens is
topped up with a filler sequence, so that a pair's score does not depend on what shared its
decode.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np
import numpy.typing as npt

from .._config import EngineConfig
from .._errors import ModelLoadError
from ..llama import LlamaModel
from ..models import RANK_POOLING, ResolvedModel
from ._engine import EmbeddingEngine
from ._pairs import Pair, PairFormat, pair_tokens

__all__ = ["FLASH_ATTN_TILE_ROWS", "RerankEngine", "Scores"]

#: ggml's CPU flash attention runs a batch of at least this many query rows through its tiled
#: kernel (F32 throughout: ``GGML_FA_TILE_Q``, ``ggml-cpu/common.h``), a smaller one through
#: its one-row kernel (F16 products and sums): the same pair's state differs between the two
#: (1.4% on the MiniLM cross-encoder's ``[CLS]`` state, a 0.007 change in its logit), so a
#: pair's score would depend on how many tokens shared its decode.
FLASH_ATTN_TILE_ROWS = 64


@attrs.frozen
class Scores:
    """What :meth:`RerankEngine.score_tokens` returns: each pair's head outputs (row ``i``
    for pair ``i``, ``n_cls_out`` values) and each pair's length in tokens."""

    values: npt.NDArray[np.float32] = attrs.field(eq=False)
    token_counts: tuple[int, ...]

    @property
    def scores(self) -> npt.NDArray[np.float32]:
        """Each pair's score: its first value (a logit, or the first label's probability)."""
        return self.values[:, 0]

    @property
    def prompt_tokens(self) -> int:
        return sum(self.token_counts)


class RerankEngine(EmbeddingEngine):
    """Batched scores of query-document pairs on one llama.cpp cross-encoder (a GGUF with
    rank pooling). Open it with :meth:`open`; make a pair's tokens with :meth:`pair` and
    score pairs with :meth:`score_tokens`.

    ``ctx_size`` is the longest pair in tokens; ``labels`` the head's labels as the GGUF
    names them (``("yes", "no")`` for Qwen3-Reranker); ``template`` whether pairs are written
    with the model's ``rerank`` template (a decoder) or between special tokens (an encoder).
    """

    kind = "rerank"
    _loop_name = "rerank loop"
    #: Every decode carries at least this many tokens (a filler sequence tops a smaller one
    #: up), so that every pair goes through the same flash-attention kernel: a pair's score
    #: is the same whatever else shares its decode (alone, or beside other requests' pairs).
    _min_decode_tokens = FLASH_ATTN_TILE_ROWS

    def __init__(self, config: EngineConfig, model: LlamaModel, resolved: ResolvedModel) -> None:
        super().__init__(config, model, resolved)
        template = model.named_template("rerank")
        self.form = PairFormat(
            template=template,
            bos=model.bos if model.add_bos and model.bos >= 0 else None,
            eos=model.eos if model.eos >= 0 else (model.sep if model.sep >= 0 else None),
            sep=model.sep if model.sep >= 0 else None,
            add_eos=model.add_eos,
            add_sep=model.add_sep,
        )
        self.template = template is not None

    @staticmethod
    def _pooling(model: LlamaModel, name: str) -> str:
        if model.pooling != RANK_POOLING:
            raise ModelLoadError(
                f"{name} is not a reranking model: its GGUF names no rank pooling (llama.cpp "
                f"pooling type {model.pooling})"
            )
        if model.n_cls_out < 1:
            raise ModelLoadError(f"{name} has rank pooling but no classification outputs")
        return "rank"

    def _shape(self) -> str:
        how = "its rerank template" if self.template else "query and document between tokens"
        return f"reranking: {self.dimensions} outputs a pair, {how}, {self.ctx_size} tokens a pair"

    @staticmethod
    def _finish(pooled: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        return pooled  # the head's outputs, as they are

    def pair(
        self,
        query: str,
        document: str,
        *,
        truncate: bool = False,
        max_document_tokens: int | None = None,
    ) -> Pair:
        """The tokens of ``query`` and ``document`` as this model reads a pair (see
        :mod:`._pairs`). ``max_document_tokens`` cuts the document to that many tokens;
        ``truncate`` cuts its end until the pair fits ``ctx_size``. Without ``truncate`` a pair
        may be longer than ``ctx_size``: the caller refuses it, naming the document. A thread's
        work for long texts (tokenizing)."""
        return pair_tokens(
            self.form,
            lambda text, special: self._model.tokenize(
                text, add_special=False, parse_special=special
            ),
            self._model.detokenize,
            query,
            document,
            limit=self.ctx_size if truncate else None,
            max_document_tokens=max_document_tokens,
        )

    async def score_tokens(self, pairs: Sequence[Sequence[int]]) -> Scores:
        """The scores of ``pairs`` (each a pair's token ids, :meth:`pair`'s), decoded in
        batches with any other caller's pairs.

        Error handling: :class:`InvalidRequestError` (``param`` ``pair[i]``) for an empty
        pair, a token id outside the vocabulary or a pair longer than ``ctx_size``, raised
        before anything is queued; otherwise as :meth:`embed_tokens`.
        Resource handling: as :meth:`embed_tokens`.
        """
        values, counts = await self._pool(pairs, "pair")
        return Scores(values, counts)
