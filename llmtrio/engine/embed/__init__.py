"""The embedding engine (:class:`EmbeddingEngine`): many callers' inputs packed into shared
``llama_decode`` calls, pooled and L2-normalized; and on it the reranking engine
(:class:`RerankEngine`): query-document pairs scored by a cross-encoder's head.
"""

from ._engine import EMBEDDING_SEQUENCES as EMBEDDING_SEQUENCES
from ._engine import EmbeddingEngine as EmbeddingEngine
from ._engine import Embeddings as Embeddings
from ._pairs import Pair as Pair
from ._rerank import RerankEngine as RerankEngine
from ._rerank import Scores as Scores

__all__ = [
    "EMBEDDING_SEQUENCES",
    "EmbeddingEngine",
    "Embeddings",
    "Pair",
    "RerankEngine",
    "Scores",
]
