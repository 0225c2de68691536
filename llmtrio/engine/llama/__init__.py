"""The binding to llama.cpp: the only part of llmtrio that imports ``llama_cpp``. The model,
its context and batch (:class:`LlamaModel`, :class:`Batch`), a slot's sampler with its
extras (penalties, log-probabilities, a grammar) and the verification of drafts beside it,
the parsed-grammar cache, llama.cpp's log, the name of its state format, and a projector
for images and audio (:class:`Projector`, llama.cpp's multimodal library).

Everything here runs on the thread that owns the context (the loader, then the decode loop);
nothing here knows of Trio.
"""

from ._batch import Batch as Batch
from ._logits import Penalties as Penalties
from ._logits import RawLogprob as RawLogprob
from ._model import LlamaModel as LlamaModel
from ._projector import MediaChunk as MediaChunk
from ._projector import Projector as Projector
from ._sampler import SlotSampler as SlotSampler
from ._state import STATE_FORMAT as STATE_FORMAT
from ._verify import verify as verify

__all__ = [
    "STATE_FORMAT",
    "Batch",
    "LlamaModel",
    "MediaChunk",
    "Penalties",
    "Projector",
    "RawLogprob",
    "SlotSampler",
    "verify",
]
