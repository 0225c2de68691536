"""The embedding engine (:class:`EmbeddingEngine`): many callers' inputs packed into shared
``llama_decode`` calls, pooled and L2-normalized.
"""

from ._engine import EMBEDDING_SEQUENCES as EMBEDDING_SEQUENCES
from ._engine import EmbeddingEngine as EmbeddingEngine
from ._engine import Embeddings as Embeddings

__all__ = [
    "EMBEDDING_SEQUENCES",
    "EmbeddingEngine",
    "Embeddings",
]
