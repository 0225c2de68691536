"""The binding to llama.cpp's multimodal library (``libmtmd``, llama-cpp-python's
``llama_cpp.mtmd_cpp``): a vision projector (an ``mmproj`` GGUF) beside a loaded model.

:meth:`Vision.tokenize` splits a templated prompt at its media markers into text tokens and
:class:`ImageChunk` values (``mtmd_tokenize``: the model's own begin/end-of-image tokens are
added around each image); :meth:`Vision.encode` runs the projector on one image
(``mtmd_encode_chunk``) and returns its embeddings, which the model decodes into a sequence
(:meth:`LlamaModel.decode_embeddings`). Images are decoded in Python (RGB, with their
content hash as id: ``mtmd_bitmap_set_id``), never by the helper's file loaders.

Tokenizing and encoding run in the input processor's threads (tokenizing touches no compute
context; encodes take turns under a lock), decoding the embeddings on the decode thread.
"""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from llama_cpp import mtmd_cpp as mtmd

from .._errors import InvalidRequestError, ModelLoadError
from .._media import Image
from ._log import recent_log

__all__ = ["EMBEDDINGS_CACHE_BYTES", "ImageChunk", "Vision"]

_CHUNK_TEXT = 0
_CHUNK_IMAGE = 1
#: The host memory kept for the embeddings of images encoded lately (a conversation's next
#: turn repeats its images: they are found here, by content hash, and not encoded again).
EMBEDDINGS_CACHE_BYTES = 256 * 2**20


class ImageChunk:
    """One image of a prompt as the projector will encode it: ``n_tokens`` embeddings taking
    ``n_pos`` positions in the sequence (the same, except on M-RoPE models), ``digest`` (its
    pixels' SHA-256), and whether the model decodes it with causal attention off
    (``non_causal``: Gemma 3).

    Resource handling: holds a copy of llama.cpp's chunk, freed with this object."""

    def __init__(self, handle: Any, *, non_causal: bool) -> None:
        self._handle = handle
        self.n_tokens: int = int(mtmd.mtmd_input_chunk_get_n_tokens(handle))
        self.n_pos: int = int(mtmd.mtmd_input_chunk_get_n_pos(handle))
        raw = mtmd.mtmd_input_chunk_get_id(handle)
        self.digest: str = raw.decode("ascii", "replace") if raw else ""
        self.non_causal = non_causal
        #: Its embeddings once encoded (the input processor encodes them in its thread).
        self.embd: npt.NDArray[np.float32] | None = None

    @property
    def handle(self) -> Any:
        return self._handle

    def __del__(self) -> None:
        handle, self._handle = self._handle, None
        if handle:
            mtmd.mtmd_input_chunk_free(handle)

    def __repr__(self) -> str:
        return f"ImageChunk({self.digest[:12]}, n_tokens={self.n_tokens}, n_pos={self.n_pos})"


class Vision:
    """A projector loaded for one model (``mtmd_init_from_file``).

    Error handling: :class:`ModelLoadError` when llama.cpp cannot load the projector or it
    does not fit the model (its output width is not the model's).
    Resource handling: :meth:`close` frees the projector's context."""

    def __init__(self, model_handle: Any, path: Path, *, threads: int, marker: str) -> None:
        recent_log()
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = False
        params.print_timings = False
        params.warmup = False
        params.n_threads = threads
        self._marker = marker.encode()
        params.media_marker = self._marker
        self._ctx = mtmd.mtmd_init_from_file(str(path).encode(), model_handle, params)
        if not self._ctx:
            why = recent_log() or "llama.cpp could not load it"
            raise ModelLoadError(f"cannot load the vision projector {path}: {why}")
        if not mtmd.mtmd_support_vision(self._ctx):
            mtmd.mtmd_free(self._ctx)
            self._ctx = None
            raise ModelLoadError(f"{path} is a projector without a vision encoder")
        self.path = path
        #: Whether image positions follow M-RoPE (a 2-D grid: n_pos differs from n_tokens).
        self.mrope: bool = bool(mtmd.mtmd_decode_use_mrope(self._ctx))
        #: Images the projector encoded (a cached image's embeddings are not counted).
        self.encodes = 0
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, npt.NDArray[np.float32]] = OrderedDict()
        self._cached_bytes = 0

    def close(self) -> None:
        """Free the projector, once an encode in flight (a prepare thread abandoned by a
        cancelled request) has finished."""
        with self._lock:
            if self._ctx:
                mtmd.mtmd_free(self._ctx)
                self._ctx = None
            self._cache.clear()

    def tokenize(
        self, text: str, images: Sequence[Image], *, add_special: bool
    ) -> list[list[int] | ImageChunk]:
        """``text`` (with one marker per image, in order) as text-token runs and image
        chunks, in prompt order.

        Error handling: :class:`InvalidRequestError` when an image cannot be decoded, the
        markers and ``images`` do not agree, or llama.cpp refuses an image."""
        if not self._ctx:
            raise InvalidRequestError("the model is closing", param="messages")
        bitmaps = []
        try:
            for image in images:
                rgb = image.pixels()
                pixels = (ctypes.c_uint8 * len(rgb)).from_buffer_copy(rgb)
                bitmap = mtmd.mtmd_bitmap_init(image.width, image.height, pixels)
                if not bitmap:
                    raise InvalidRequestError("llama.cpp could not take an image", param="image")
                bitmaps.append(bitmap)
                mtmd.mtmd_bitmap_set_id(bitmap, image.digest.encode())
            encoded = text.encode("utf-8")
            inp = mtmd.mtmd_input_text()
            inp.text = encoded
            inp.text_len = len(encoded)
            inp.add_special = add_special
            inp.parse_special = True
            array = (mtmd.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
            chunks = mtmd.mtmd_input_chunks_init()
            try:
                rc = mtmd.mtmd_tokenize(self._ctx, chunks, ctypes.byref(inp), array, len(bitmaps))
                if rc != 0:
                    why = {1: "the image markers and the images do not agree"}.get(
                        rc, f"llama.cpp could not preprocess an image ({rc})"
                    )
                    raise InvalidRequestError(why, param="messages")
                return self._chunks(chunks)
            finally:
                mtmd.mtmd_input_chunks_free(chunks)
        finally:
            for bitmap in bitmaps:
                mtmd.mtmd_bitmap_free(bitmap)

    def _chunks(self, chunks: Any) -> list[list[int] | ImageChunk]:
        out: list[list[int] | ImageChunk] = []
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            kind = mtmd.mtmd_input_chunk_get_type(chunk)
            if kind == _CHUNK_TEXT:
                n = ctypes.c_size_t()
                tokens = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                run = [int(tokens[j]) for j in range(n.value)]
                if out and isinstance(out[-1], list):
                    out[-1] += run
                elif run:
                    out.append(run)
            elif kind == _CHUNK_IMAGE:
                non_causal = bool(mtmd.mtmd_decode_use_non_causal(self._ctx, chunk))
                out.append(ImageChunk(mtmd.mtmd_input_chunk_copy(chunk), non_causal=non_causal))
            else:
                raise InvalidRequestError("only images are taken as media", param="messages")
        return out

    def decoder_positions(self, chunk: ImageChunk, pos0: int) -> npt.NDArray[np.int32] | None:
        """The M-RoPE positions of an image decoded from position ``pos0`` (llama.cpp's
        layout for an embedding batch: the ``n_tokens`` t, then y, x and z values), or
        ``None`` when the model's positions are one per token."""
        if not self.mrope:
            return None
        tokens = mtmd.mtmd_input_chunk_get_tokens_image(chunk.handle)
        n = chunk.n_tokens
        out = np.zeros(4 * n, dtype=np.int32)
        for i in range(n):
            pos = mtmd.mtmd_image_tokens_get_decoder_pos(tokens, pos0, i)
            out[i], out[i + n], out[i + 2 * n], out[i + 3 * n] = pos.t, pos.y, pos.x, pos.z
        return out

    def encode(self, chunk: ImageChunk, n_embd: int) -> npt.NDArray[np.float32] | None:
        """The image's embeddings (``n_tokens`` rows of ``n_embd``, flat); ``None`` when the
        projector failed. Safe from any thread: one encode runs at a time (the projector's
        context is one), and an image encoded lately is not encoded again (its embeddings
        are kept, by content hash, up to :data:`EMBEDDINGS_CACHE_BYTES`)."""
        with self._lock:
            cached = self._cache.get(chunk.digest) if chunk.digest else None
            if cached is not None and len(cached) == chunk.n_tokens * n_embd:
                self._cache.move_to_end(chunk.digest)
                return cached
            if not self._ctx or mtmd.mtmd_encode_chunk(self._ctx, chunk.handle) != 0:
                return None
            ptr = mtmd.mtmd_get_output_embd(self._ctx)
            if not ptr:
                return None
            embd = np.ctypeslib.as_array(ptr, shape=(chunk.n_tokens * n_embd,)).copy()
            self.encodes += 1
            if chunk.digest and embd.nbytes <= EMBEDDINGS_CACHE_BYTES:
                self._cache[chunk.digest] = embd
                self._cached_bytes += embd.nbytes
                while self._cached_bytes > EMBEDDINGS_CACHE_BYTES:
                    _, old = self._cache.popitem(last=False)
                    self._cached_bytes -= old.nbytes
            return embd
