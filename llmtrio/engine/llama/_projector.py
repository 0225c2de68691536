"""The binding to llama.cpp's multimodal library (``libmtmd``, llama-cpp-python's
``llama_cpp.mtmd_cpp``): a projector (an ``mmproj`` GGUF: a vision encoder, an audio encoder,
or both) beside a loaded model.

:meth:`Projector.tokenize` splits a templated prompt at its media markers into text tokens
and :class:`MediaChunk` values (``mtmd_tokenize``: the model's own begin/end-of-image or
-audio tokens are added around each): an image is one chunk (or a few, for models that tile
it), an audio file one chunk per 30 seconds (Whisper's window). :meth:`Projector.encode`
runs the projector on one chunk (``mtmd_encode_chunk``) and returns its embeddings, which the
model decodes into a sequence (:meth:`LlamaModel.decode_embeddings`). Images are decoded in
Python (RGB, with their content hash as id: ``mtmd_bitmap_set_id``); audio files by
llama.cpp's helper (``mtmd_helper_bitmap_init_from_buf``: miniaudio, resampled to the
encoder's rate, as llama.cpp's server reads them), their length checked against the one
their header gave.

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

from .._audio import Audio
from .._errors import InvalidRequestError, ModelLoadError
from .._media import Image
from ._log import recent_log

__all__ = ["EMBEDDINGS_CACHE_BYTES", "MediaChunk", "Projector"]

_CHUNK_TEXT = 0
_CHUNK_IMAGE = 1
_CHUNK_AUDIO = 2
#: The host memory kept for the embeddings of media encoded lately (a conversation's next
#: turn repeats its images and audio: they are found here, by content hash, and not encoded
#: again).
EMBEDDINGS_CACHE_BYTES = 256 * 2**20
#: How much longer than its header said an audio file may decode to (resampling rounds).
_AUDIO_SLACK_S = 1.0


class MediaChunk:
    """One chunk of a prompt's media as the projector will encode it: ``n_tokens``
    embeddings taking ``n_pos`` positions in the sequence (the same, except for images on
    M-RoPE models), ``digest`` (its file's or pixels' SHA-256), ``index`` (its place among
    the prompt's chunks of that digest: an audio file's 30-second windows in order),
    whether it is ``audio``,
    and whether the model decodes it with causal attention off (``non_causal``: Gemma 3's
    images), which keeps it whole in one decode.

    Resource handling: holds a copy of llama.cpp's chunk, freed with this object."""

    def __init__(self, handle: Any, *, non_causal: bool, index: int) -> None:
        self._handle = handle
        self.n_tokens: int = int(mtmd.mtmd_input_chunk_get_n_tokens(handle))
        self.n_pos: int = int(mtmd.mtmd_input_chunk_get_n_pos(handle))
        raw = mtmd.mtmd_input_chunk_get_id(handle)
        self.digest: str = raw.decode("ascii", "replace") if raw else ""
        self.audio = int(mtmd.mtmd_input_chunk_get_type(handle)) == _CHUNK_AUDIO
        self.index = index
        self.non_causal = non_causal
        #: Its embeddings once encoded (the input processor encodes them in its thread).
        self.embd: npt.NDArray[np.float32] | None = None

    @property
    def handle(self) -> Any:
        return self._handle

    @property
    def key(self) -> str:
        """What tells this chunk's embeddings apart: its file's digest and its place."""
        return f"{self.digest}:{self.index}" if self.digest else ""

    def __del__(self) -> None:
        handle, self._handle = self._handle, None
        if handle:
            mtmd.mtmd_input_chunk_free(handle)

    def __repr__(self) -> str:
        kind = "audio" if self.audio else "image"
        return (
            f"MediaChunk({kind} {self.digest[:12]}#{self.index}, n_tokens={self.n_tokens}, "
            f"n_pos={self.n_pos})"
        )


class Projector:
    """A projector loaded for one model (``mtmd_init_from_file``): ``vision``, ``audio``
    or both say what it takes.

    Error handling: :class:`ModelLoadError` when llama.cpp cannot load the projector, it
    does not fit the model (its output width is not the model's), or it has no encoder
    for images or audio.
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
            raise ModelLoadError(f"cannot load the projector {path}: {why}")
        self.vision: bool = bool(mtmd.mtmd_support_vision(self._ctx))
        self.audio: bool = bool(mtmd.mtmd_support_audio(self._ctx))
        if not (self.vision or self.audio):
            mtmd.mtmd_free(self._ctx)
            self._ctx = None
            raise ModelLoadError(f"{path} is a projector without an image or audio encoder")
        self.path = path
        #: The audio encoder's sample rate (Hz), 0 without one.
        self.sample_rate = int(mtmd.mtmd_get_audio_sample_rate(self._ctx)) if self.audio else 0
        #: Whether media positions follow M-RoPE (an image's a 2-D grid: n_pos differs from
        #: n_tokens; audio's one position per token, the same in every section).
        self.mrope: bool = bool(mtmd.mtmd_decode_use_mrope(self._ctx))
        #: Chunks the projector encoded (a cached chunk's embeddings are not counted).
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
        self, text: str, media: Sequence[Image | Audio], *, add_special: bool
    ) -> list[list[int] | MediaChunk]:
        """``text`` (with one marker per item of ``media``, in order) as text-token runs and
        media chunks, in prompt order.

        Error handling: :class:`InvalidRequestError` naming the item when an image or an
        audio file cannot be decoded (or decodes to more audio than its header said), when
        the projector takes no such media, or the markers and ``media`` do not agree."""
        if not self._ctx:
            raise InvalidRequestError("the model is closing", param="messages")
        bitmaps = []
        try:
            for item in media:
                bitmaps.append(self._bitmap(item))
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
                    why = {1: "the media markers and the media do not agree"}.get(
                        rc, f"llama.cpp could not preprocess the media ({rc})"
                    )
                    raise InvalidRequestError(why, param="messages")
                return self._chunks(chunks)
            finally:
                mtmd.mtmd_input_chunks_free(chunks)
        finally:
            for bitmap in bitmaps:
                mtmd.mtmd_bitmap_free(bitmap)

    def _bitmap(self, item: Image | Audio) -> Any:
        """``item`` as llama.cpp's bitmap (the caller frees it), its id its digest."""
        if isinstance(item, Audio):
            return self._audio_bitmap(item)
        if not self.vision:
            raise InvalidRequestError(
                f"the media at '{item.param}' is an image, and this model's projector takes "
                "only audio",
                param=item.param,
            )
        rgb = item.pixels()
        pixels = (ctypes.c_uint8 * len(rgb)).from_buffer_copy(rgb)
        bitmap = mtmd.mtmd_bitmap_init(item.width, item.height, pixels)
        if not bitmap:
            raise InvalidRequestError("llama.cpp could not take an image", param=item.param)
        mtmd.mtmd_bitmap_set_id(bitmap, item.digest.encode())
        return bitmap

    def _audio_bitmap(self, audio: Audio) -> Any:
        if not self.audio:
            raise InvalidRequestError(
                f"the media at '{audio.param}' is audio, and this model's projector takes "
                "only images",
                param=audio.param,
            )
        data = audio.data
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(self._ctx, buf, len(data), False)
        if not bitmap:
            why = recent_log() or "no reason given"
            raise InvalidRequestError(
                f"the audio at '{audio.param}' could not be decoded ({why})", param=audio.param
            )
        samples = int(mtmd.mtmd_bitmap_get_nx(bitmap))
        most = (audio.seconds + _AUDIO_SLACK_S) * self.sample_rate
        if samples == 0 or samples > most:
            mtmd.mtmd_bitmap_free(bitmap)
            said = f"{audio.seconds:.1f} s"
            why = "no samples" if samples == 0 else f"{samples / self.sample_rate:.1f} s"
            raise InvalidRequestError(
                f"the audio at '{audio.param}' decodes to {why}, not the {said} its header says",
                param=audio.param,
            )
        mtmd.mtmd_bitmap_set_id(bitmap, audio.digest.encode())
        return bitmap

    def _chunks(self, chunks: Any) -> list[list[int] | MediaChunk]:
        out: list[list[int] | MediaChunk] = []
        seen: dict[str, int] = {}  # chunks of each digest so far: a file's windows, tiles
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
            elif kind in (_CHUNK_IMAGE, _CHUNK_AUDIO):
                non_causal = bool(mtmd.mtmd_decode_use_non_causal(self._ctx, chunk))
                media = MediaChunk(
                    mtmd.mtmd_input_chunk_copy(chunk), non_causal=non_causal, index=0
                )
                media.index = seen.get(media.digest, 0)
                seen[media.digest] = media.index + 1
                out.append(media)
            else:
                raise InvalidRequestError(
                    "only images and audio are taken as media", param="messages"
                )
        return out

    def decoder_positions(self, chunk: MediaChunk, pos0: int) -> npt.NDArray[np.int32] | None:
        """The M-RoPE positions of a chunk decoded from position ``pos0`` (llama.cpp's
        layout for an embedding batch: the ``n_tokens`` t, then y, x and z values), or
        ``None`` when the model's positions are one per token."""
        if not self.mrope:
            return None
        n = chunk.n_tokens
        if chunk.audio:  # one position per token, in every section (mtmd's mrope_1d)
            return np.tile(np.arange(pos0, pos0 + n, dtype=np.int32), 4)
        tokens = mtmd.mtmd_input_chunk_get_tokens_image(chunk.handle)
        out = np.zeros(4 * n, dtype=np.int32)
        for i in range(n):
            pos = mtmd.mtmd_image_tokens_get_decoder_pos(tokens, pos0, i)
            out[i], out[i + n], out[i + 2 * n], out[i + 3 * n] = pos.t, pos.y, pos.x, pos.z
        return out

    def encode(self, chunk: MediaChunk, n_embd: int) -> npt.NDArray[np.float32] | None:
        """The chunk's embeddings (``n_tokens`` rows of ``n_embd``, flat); ``None`` when the
        projector failed. Safe from any thread: one encode runs at a time (the projector's
        context is one), and a chunk encoded lately is not encoded again (its embeddings
        are kept, by content hash and place, up to :data:`EMBEDDINGS_CACHE_BYTES`)."""
        with self._lock:
            key = chunk.key
            cached = self._cache.get(key) if key else None
            if cached is not None and len(cached) == chunk.n_tokens * n_embd:
                self._cache.move_to_end(key)
                return cached
            if not self._ctx or mtmd.mtmd_encode_chunk(self._ctx, chunk.handle) != 0:
                return None
            ptr = mtmd.mtmd_get_output_embd(self._ctx)
            if not ptr:
                return None
            embd = np.ctypeslib.as_array(ptr, shape=(chunk.n_tokens * n_embd,)).copy()
            self.encodes += 1
            if key and embd.nbytes <= EMBEDDINGS_CACHE_BYTES:
                self._cache[key] = embd
                self._cached_bytes += embd.nbytes
                while self._cached_bytes > EMBEDDINGS_CACHE_BYTES:
                    _, old = self._cache.popitem(last=False)
                    self._cached_bytes -= old.nbytes
            return embd
