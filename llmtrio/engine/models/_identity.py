"""A model file's identity for what is kept of it across processes (the prompt cache's
snapshots on disk): a digest of its size, its GGUF header (every metadata key and tensor
info, RoPE settings and tokenizer included) and samples of its tensor data.

Hashing all of a file of gigabytes would cost a load seconds; the header tells apart models
of different architectures, shapes, quantizations and tokenizers, and the samples (evenly
spread over the tensor data) tell apart two fine-tunes whose headers agree.
"""

from __future__ import annotations

import hashlib
import mmap
from pathlib import Path

from ._gguf import GGUFFormatError, parse_gguf

__all__ = ["SAMPLES", "SAMPLE_BYTES", "file_identity"]

#: How many samples of the tensor data are hashed, and how long each is.
SAMPLES = 16
SAMPLE_BYTES = 64 * 1024
#: What is hashed as the "header" of a file that is no GGUF.
HEADLESS_BYTES = 1 << 20


def file_identity(path: Path) -> str:
    """A hex digest naming the content of the model file at ``path`` (see the module).

    Error handling: ``OSError`` when the file cannot be read. A file that is no GGUF (or a
    truncated one) gets a digest of its size and samples alone; llama.cpp refuses to load it
    anyway."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        size = f.seek(0, 2)
        digest.update(f"size {size}\n".encode())
        data_offset = 0
        if size:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                try:
                    data_offset = parse_gguf(mapped, size).data_offset
                except GGUFFormatError:
                    data_offset = min(size, HEADLESS_BYTES)
                digest.update(mapped[:data_offset])
        span = max(0, size - data_offset - SAMPLE_BYTES)
        for i in range(SAMPLES):
            f.seek(data_offset + span * i // (SAMPLES - 1))
            digest.update(f.read(SAMPLE_BYTES))
    return digest.hexdigest()
