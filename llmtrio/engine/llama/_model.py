"""The thin layer over llama-cpp-python's low-level bindings: model and context (the batch is
``_batch.py``'s).

Everything here runs on the thread that owns the context (the loader, then the decode loop);
nothing here knows of Trio.
"""

from __future__ import annotations

import codecs
import ctypes
from pathlib import Path

import llama_cpp
import numpy as np
import numpy.typing as npt

from .._errors import ModelLoadError
from ._batch import Batch
from ._constrained import VocabIndex
from ._grammar_cache import GrammarCache
from ._log import recent_log
from ._projector import Projector

__all__ = ["LlamaModel"]

#: ``EngineConfig.cache_type_k``/``_v`` as ggml's types.
_GGML_TYPES = {
    "f16": llama_cpp.GGML_TYPE_F16,
    "q8_0": llama_cpp.GGML_TYPE_Q8_0,
    "q4_0": llama_cpp.GGML_TYPE_Q4_0,
}
_FLASH_ATTN = {
    "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}


def _load_mode(mmap: bool | None, mlock: bool) -> int:
    """llama.cpp's load mode: ``mmap`` None is its own choice (mapped, where it can)."""
    if mlock:
        return (
            llama_cpp.LLAMA_LOAD_MODE_MLOCK
            if mmap is False
            else llama_cpp.LLAMA_LOAD_MODE_MMAP_MLOCK
        )
    if mmap is None:
        return llama_cpp.LLAMA_LOAD_MODE_AUTO
    return llama_cpp.LLAMA_LOAD_MODE_MMAP if mmap else llama_cpp.LLAMA_LOAD_MODE_NONE


class LlamaModel:
    """One loaded model and its context: ``n_seq_max = slots``, ``ctx_size`` tokens per slot.

    Resource handling: :meth:`close` frees the context and the model; call it from the thread
    that last used them, once nothing decodes.
    """

    def __init__(
        self,
        path: Path,
        *,
        slots: int,
        ctx_size: int,
        threads: int,
        n_batch: int,
        swa_full: bool = True,
        kv_unified: bool = False,
        n_rs_seq: int = 0,
        embeddings: bool = False,
        cache_type_k: str = "f16",
        cache_type_v: str = "f16",
        flash_attn: str = "auto",
        n_gpu_layers: int = -1,
        mmap: bool | None = None,
        mlock: bool = False,
    ) -> None:
        recent_log()
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        params.load_mode = _load_mode(mmap, mlock)
        self._model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self._model:
            why = recent_log() or "llama.cpp could not load it"
            raise ModelLoadError(f"cannot load model {path}: {why}")
        try:
            #: The sliding window's size (0: no sliding-window attention).
            self.n_swa: int = llama_cpp.llama_model_n_swa(self._model)
            if embeddings:  # a sentence never outgrows the window the model was trained on
                ctx_size = min(ctx_size, llama_cpp.llama_model_n_ctx_train(self._model))
            self._init_context(
                embeddings=embeddings,
                slots=slots,
                ctx_size=ctx_size,
                threads=threads,
                n_batch=n_batch,
                swa_full=swa_full,
                kv_unified=kv_unified,
                n_rs_seq=n_rs_seq,
                cache_types=(_GGML_TYPES[cache_type_k], _GGML_TYPES[cache_type_v]),
                flash_attn=_FLASH_ATTN[flash_attn],
            )
        except BaseException:
            llama_cpp.llama_model_free(self._model)
            raise
        self.path = path
        self.ctx_size = ctx_size
        self.slots = slots
        self.n_batch = n_batch
        self.vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab: int = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.bos: int = llama_cpp.llama_vocab_bos(self.vocab)
        self.eos: int = llama_cpp.llama_vocab_eos(self.vocab)
        self.add_bos: bool = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))
        #: The SEP token (-1: none), and whether the vocabulary adds an EOS and a SEP to a
        #: prompt (what llama.cpp's server puts between a query and a document).
        self.sep: int = llama_cpp.llama_vocab_sep(self.vocab)
        self.add_eos: bool = bool(llama_cpp.llama_vocab_get_add_eos(self.vocab))
        self.add_sep: bool = bool(llama_cpp.llama_vocab_get_add_sep(self.vocab))
        self.is_recurrent = bool(llama_cpp.llama_model_is_recurrent(self._model))
        self.is_hybrid = bool(llama_cpp.llama_model_is_hybrid(self._model))
        self.eog: frozenset[int] = frozenset(
            t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(self.vocab, t)
        )
        self.architecture = self.meta("general.architecture") or "unknown"
        self.chat_template = self.named_template(None)
        self._piece_buf = ctypes.create_string_buffer(256)
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        #: The most bytes of text one token stands for (special tokens included): a prompt
        #: of N bytes has at least N / max_piece_bytes tokens.
        pieces = [self.special_piece(token) for token in range(self.n_vocab)]
        self.max_piece_bytes = max(map(len, pieces), default=1)
        #: For each byte, a token whose text is that byte alone (to feed a grammar text).
        self.byte_tokens: dict[int, int] = {}
        for token, piece in enumerate(pieces):
            if len(piece) == 1 and token not in self.eog:
                self.byte_tokens.setdefault(piece[0], token)
        #: Each token's first bytes, to rule tokens out before a grammar is asked.
        self.vocab_index = VocabIndex(pieces, self.eog)
        #: The tokens whose text ends inside a UTF-8 character (a reasoning budget lets the
        #: tokens that finish it through before it closes the think block).
        self.unfinished_utf8: frozenset[int] = frozenset(
            token
            for token, piece in enumerate(pieces)
            if piece[-1:] >= b"\x80" and _ends_inside_character(piece)
        )
        self.grammars = GrammarCache(self.vocab)
        #: The projector (images, audio), once loaded (:meth:`load_projector`).
        self.projector: Projector | None = None

    def _init_context(
        self,
        *,
        slots: int,
        ctx_size: int,
        threads: int,
        n_batch: int,
        swa_full: bool,
        kv_unified: bool,
        n_rs_seq: int,
        embeddings: bool,
        cache_types: tuple[int, int] = (llama_cpp.GGML_TYPE_F16, llama_cpp.GGML_TYPE_F16),
        flash_attn: int = llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
    ) -> None:
        cparams = llama_cpp.llama_context_default_params()
        cparams.type_k, cparams.type_v = cache_types
        cparams.flash_attn_type = flash_attn
        # An embedding context pools each sequence as its GGUF says (unspecified: the
        # model's own pooling type); a generating one outputs logits.
        cparams.embeddings = embeddings
        cparams.n_ctx = ctx_size * slots
        cparams.n_seq_max = slots
        cparams.n_batch = n_batch
        cparams.n_ubatch = n_batch
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        # Per slot (the default), each sequence gets its own ctx_size cells: one long
        # sequence cannot starve the others. Unified, all share one pool of slots x ctx_size
        # cells (llama.cpp then attends over the whole pool, masked, for every sequence).
        cparams.kv_unified = kv_unified
        self.kv_unified = kv_unified
        # Recurrent-state snapshots per sequence (llama.cpp's n_rs_seq, for the
        # architectures that support it; clamped to 0 for the others): a recurrent state can
        # then be rolled back by up to that many tokens once, which speculative decoding's
        # rejected drafts need.
        cparams.n_rs_seq = n_rs_seq
        if embeddings:
            # Every batch starts from empty memory, so one batch's worth of cells, shared,
            # is all a decoder-based embedding model needs (BERT needs none).
            cparams.n_ctx = n_batch
            cparams.kv_unified = True
        # A full-size sliding-window cache (llama.cpp's default for a context; llama-server's
        # is off) keeps every cell, so a sequence can be cut back to any position (prompt
        # reuse); a window-size one drops cells older than the window.
        cparams.swa_full = swa_full
        self.swa_full = swa_full
        cparams.no_perf = True
        self.ctx = llama_cpp.llama_init_from_model(self._model, cparams)
        if not self.ctx:
            why = recent_log() or "llama.cpp could not create the context"
            raise ModelLoadError(
                f"cannot create a context of {slots} slots x {ctx_size} tokens: {why}"
            )
        #: How many tokens a recurrent state can be rolled back by (0: not at all).
        self.n_rs_seq: int = int(llama_cpp.llama_n_rs_seq(self.ctx))
        #: Cells in the whole context (the pool, when unified).
        self.n_ctx: int = int(llama_cpp.llama_n_ctx(self.ctx))
        n_ctx_seq = llama_cpp.llama_n_ctx_seq(self.ctx)
        if n_ctx_seq < ctx_size:
            llama_cpp.llama_free(self.ctx)
            raise ModelLoadError(
                f"llama.cpp gives each slot {n_ctx_seq} tokens of context, less than the "
                f"{ctx_size} asked for (the model was trained for "
                f"{llama_cpp.llama_model_n_ctx_train(self._model)})"
            )

    def named_template(self, name: str | None) -> str | None:
        """The GGUF's chat template ``name`` (``tokenizer.chat_template.<name>``; ``None``:
        the default one), or ``None`` when it has none."""
        key = None if name is None else name.encode()
        template = llama_cpp.llama_model_chat_template(self._model, key)
        return template.decode("utf-8", "replace") if template else None

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(512)
        n = llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def close(self) -> None:
        self.grammars.clear()
        self.unload_projector()
        if self.ctx:
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    # -- text ---------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        tokens = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(
            self.vocab, data, len(data), tokens, capacity, add_special, parse_special
        )
        if n < 0:
            capacity = -n
            tokens = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(
                self.vocab, data, len(data), tokens, capacity, add_special, parse_special
            )
        return list(tokens[:n])

    def detokenize(self, tokens: list[int]) -> str:
        """``tokens`` as text (special tokens rendered as nothing; a character left
        unfinished becomes U+FFFD)."""
        if not tokens:
            return ""
        array = (llama_cpp.llama_token * len(tokens))(*tokens)
        capacity = 8 * len(tokens) + 16
        while True:
            buf = ctypes.create_string_buffer(capacity)
            n = llama_cpp.llama_detokenize(
                self.vocab, array, len(tokens), buf, capacity, False, False
            )
            if n >= 0:
                return buf.raw[:n].decode("utf-8", "replace")
            capacity = -n

    def piece(self, token: int) -> bytes:
        """The bytes of one token, as generated text (control tokens render empty)."""
        return self._render(token, special=False)

    def special_piece(self, token: int) -> bytes:
        """The bytes of one token with special tokens rendered (``<think>``, ``<bos>``)."""
        return self._render(token, special=True)

    def _render(self, token: int, *, special: bool) -> bytes:
        buf = self._piece_buf
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def apply_builtin_template(
        self, name: str, messages: list[tuple[str, str]], *, add_assistant: bool = True
    ) -> str:
        """Render ``messages`` with llama.cpp's built-in template ``name`` (e.g. "gemma"),
        with the assistant's turn opened at the end when ``add_assistant``."""
        keep = [(role.encode(), content.encode()) for role, content in messages]
        chat = (llama_cpp.llama_chat_message * len(keep))()
        for i, (role, content) in enumerate(keep):
            chat[i].role = role
            chat[i].content = content
        size = 256 + 2 * sum(len(c) for _, c in keep)
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_chat_apply_template(
            name.encode(), chat, len(keep), add_assistant, buf, size
        )
        if n > size:
            buf = ctypes.create_string_buffer(n)
            n = llama_cpp.llama_chat_apply_template(
                name.encode(), chat, len(keep), add_assistant, buf, n
            )
        if n < 0:
            raise ValueError(f"llama.cpp has no built-in chat template {name!r}")
        return buf.raw[:n].decode("utf-8", "replace")

    # -- decoding -----------------------------------------------------------------------

    def decode(self, batch: Batch) -> int:
        return int(llama_cpp.llama_decode(self.ctx, batch.struct))

    def load_projector(self, path: Path, *, threads: int, marker: str) -> Projector:
        """Load the projector at ``path`` for this model as :attr:`projector` (freed by
        :meth:`close`).

        Error handling: :class:`ModelLoadError` (see :class:`Projector`)."""
        self.projector = Projector(self._model, path, threads=threads, marker=marker)
        return self.projector

    def unload_projector(self) -> None:
        """Free :attr:`projector` (the model then takes no images or audio)."""
        if self.projector is not None:
            self.projector.close()
            self.projector = None

    def decode_embeddings(
        self,
        embd: npt.NDArray[np.float32],
        start_pos: int,
        seq: int,
        *,
        causal: bool,
        positions: npt.NDArray[np.int32] | None = None,
    ) -> int:
        """Decode ``embd`` (rows of ``n_embd``: a media chunk's embeddings, or a part of
        them) into ``seq`` at positions ``start_pos...`` (or at M-RoPE ``positions``: four
        per row, see :meth:`Projector.decoder_positions`), alone in one ``llama_decode``
        (``causal=False``: with causal attention off for it, and on again after). Outputs
        no logits. Returns llama_decode's code."""
        n_embd = self.n_embd
        n = len(embd) // n_embd
        batch = llama_cpp.llama_batch_init(n, n_embd, 1)
        # The address, not the pointer object: a pointer read from a ctypes structure lives
        # in the structure's memory, and would follow the assignment below.
        own_pos = ctypes.cast(batch.pos, ctypes.c_void_p).value or 0
        try:
            ctypes.memmove(batch.embd, embd.ctypes.data, n * n_embd * 4)
            for i in range(n):
                batch.pos[i] = start_pos + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = seq
                batch.logits[i] = 0
            if positions is not None:
                batch.pos = positions.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_pos))
            batch.n_tokens = n
            if not causal:
                llama_cpp.llama_set_causal_attn(self.ctx, False)
            try:
                return int(llama_cpp.llama_decode(self.ctx, batch))
            finally:
                if not causal:
                    llama_cpp.llama_set_causal_attn(self.ctx, True)
        finally:
            # llama_batch_free frees the batch's own arrays (never ``positions``)
            batch.pos = ctypes.cast(own_pos, ctypes.POINTER(llama_cpp.llama_pos))
            llama_cpp.llama_batch_free(batch)

    def set_threads(self, threads: int) -> None:
        """Run the next decodes on ``threads`` compute threads (llama.cpp's
        ``llama_set_n_threads``; the context starts with the ``threads`` it was made with)."""
        llama_cpp.llama_set_n_threads(self.ctx, threads, threads)

    def forget(self, seq: int, start: int = -1) -> bool:
        """Drop ``seq``'s memory from position ``start`` on (all of it by default). Returns
        false when the memory cannot be cut there (recurrent state: only all of it, or back
        by up to ``n_rs_seq`` tokens once between two decodes of the sequence)."""
        return bool(llama_cpp.llama_memory_seq_rm(self.memory, seq, start, -1))

    def save_state(self, seq: int) -> ctypes.Array[ctypes.c_uint8] | None:
        """A copy of ``seq``'s whole memory (cells and recurrent state) in host memory, or
        ``None`` when llama.cpp could not write it."""
        size = llama_cpp.llama_state_seq_get_size(self.ctx, seq)
        if size <= 0:
            return None
        buf = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(self.ctx, buf, size, seq)
        return buf if written == size else None

    def restore_state(self, seq: int, data: ctypes.Array[ctypes.c_uint8]) -> bool:
        """Replace ``seq``'s memory with a copy :meth:`save_state` made (of any sequence).
        False when it did not fit; ``seq``'s memory is then cleared."""
        if llama_cpp.llama_state_seq_set_data(self.ctx, data, len(data), seq) == len(data):
            return True
        self.forget(seq)
        return False

    def clear_memory(self) -> None:
        """Forget every sequence (an embedding batch starts from nothing)."""
        if self.memory:
            llama_cpp.llama_memory_clear(self.memory, True)

    @property
    def pooling(self) -> int:
        """The context's ``llama_pooling_type`` (0: none, 1 mean, 2 CLS, 3 last, 4 rank)."""
        return int(llama_cpp.llama_pooling_type(self.ctx))

    @property
    def n_embd(self) -> int:
        return int(llama_cpp.llama_model_n_embd(self._model))

    @property
    def n_cls_out(self) -> int:
        """The classification head's outputs (a cross-encoder's labels: 1, or ``yes`` and
        ``no``)."""
        return int(llama_cpp.llama_model_n_cls_out(self._model))

    @property
    def pooled_size(self) -> int:
        """The floats one pooled sequence has: ``n_embd``, or under rank pooling the head's
        ``n_cls_out`` scores."""
        if self.pooling == llama_cpp.LLAMA_POOLING_TYPE_RANK:
            return self.n_cls_out
        return self.n_embd

    def pooled(self, seq: int) -> npt.NDArray[np.float32] | None:
        """A copy of sequence ``seq``'s pooled output after the last decode: its embedding
        (``n_embd`` floats), or under rank pooling its ``n_cls_out`` scores (``None`` when
        llama.cpp has none for it)."""
        ptr = llama_cpp.llama_get_embeddings_seq(self.ctx, seq)
        if not ptr:
            return None
        return np.ctypeslib.as_array(ptr, shape=(self.pooled_size,)).copy()

    def logits(self, index: int) -> npt.NDArray[np.float32]:
        ptr = llama_cpp.llama_get_logits_ith(self.ctx, index)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))


def _ends_inside_character(piece: bytes) -> bool:
    """Whether ``piece`` ends inside a UTF-8 character: an incremental decode leaves its last
    bytes for more to come (llama.cpp's ``common_utf8_is_complete``, negated; bytes that are
    not UTF-8 count as whole)."""
    return codecs.utf_8_decode(piece, "replace", False)[1] < len(piece)
