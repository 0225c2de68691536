"""The reference the media tests compare the engine with: greedy text straight on llama.cpp's
multimodal helper (``mtmd``), one token a step, as llama-server would ingest the prompt."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import llama_cpp
import numpy as np
from llama_cpp import mtmd_cpp as mtmd

from llmtrio.engine import MEDIA_MARKER

__all__ = ["llama_reference"]

Media = TypeVar("Media")


def llama_reference(
    model_path: Path,
    projector: Path,
    text: str,
    media: Sequence[Media],
    bitmap_of: Callable[[Any, Media], Any],
    *,
    steps: int,
    n_batch: int,
    n_ctx: int,
) -> tuple[str, int, list[float]]:
    """Greedy text straight on llama.cpp's multimodal helper: each of ``media`` made a bitmap
    by ``bitmap_of(projector context, item)``, ``text`` (with llama.cpp's default media
    marker per item) tokenized by ``mtmd_tokenize``, evaluated on sequence 0 by
    ``mtmd_helper_eval_chunks`` in batches of ``n_batch``, then one token a step (end of
    generation banned). Returns their text, the prompt's positions and each chosen token's
    log-probability."""
    model = llama_cpp.llama_model_load_from_file(
        str(model_path).encode(), llama_cpp.llama_model_default_params()
    )
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = cparams.n_ubatch = n_batch
    cparams.n_threads = cparams.n_threads_batch = 1
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    params = mtmd.mtmd_context_params_default()
    params.use_gpu, params.warmup, params.n_threads = False, False, 1
    projector_ctx = mtmd.mtmd_init_from_file(str(projector).encode(), model, params)
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    eog = [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)]
    bitmaps = []
    chunks = mtmd.mtmd_input_chunks_init()
    try:
        for item in media:
            bitmap = bitmap_of(projector_ctx, item)
            assert bitmap
            bitmaps.append(bitmap)
        encoded = text.replace(MEDIA_MARKER, mtmd.mtmd_default_marker().decode()).encode()
        inp = mtmd.mtmd_input_text()
        inp.text, inp.text_len, inp.add_special, inp.parse_special = (
            encoded, len(encoded), True, True
        )  # fmt: skip
        array = (mtmd.mtmd_bitmap_p_ctypes * len(bitmaps))(*bitmaps)
        rc = mtmd.mtmd_tokenize(projector_ctx, chunks, ctypes.byref(inp), array, len(bitmaps))
        assert rc == 0
        n_past = llama_cpp.llama_pos(0)
        rc = mtmd.mtmd_helper_eval_chunks(
            projector_ctx, ctx, chunks, 0, 0, n_batch, True, ctypes.byref(n_past)
        )
        assert rc == 0
        prompt_len = pos = n_past.value
        tokens: list[int] = []
        logprobs: list[float] = []
        batch = llama_cpp.llama_batch_init(1, 0, 1)
        for _ in range(steps):
            logits = np.ctypeslib.as_array(
                llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)
            ).copy()
            shifted = logits - logits.max()
            logprob = shifted - np.log(np.exp(shifted).sum())
            logits[eog] = -np.inf
            token = int(np.argmax(logits))
            logprobs.append(float(logprob[token]))
            tokens.append(token)
            batch.n_tokens = 1
            batch.token[0], batch.pos[0], batch.n_seq_id[0] = token, pos, 1
            batch.seq_id[0][0], batch.logits[0] = 0, 1
            assert llama_cpp.llama_decode(ctx, batch) == 0
            pos += 1
        llama_cpp.llama_batch_free(batch)
        piece = ctypes.create_string_buffer(256)
        pieces = []
        for token in tokens:
            n = llama_cpp.llama_token_to_piece(vocab, token, piece, len(piece), 0, False)
            pieces.append(piece.raw[:n])
        return b"".join(pieces).decode("utf-8", "replace"), prompt_len, logprobs
    finally:
        mtmd.mtmd_input_chunks_free(chunks)
        for bitmap in bitmaps:
            mtmd.mtmd_bitmap_free(bitmap)
        mtmd.mtmd_free(projector_ctx)
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
