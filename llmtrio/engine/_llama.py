"""The thin layer over llama-cpp-python's low-level bindings: model, context, batch, samplers.

Everything here runs on the thread that owns the context (the loader, then the decode loop);
nothing here knows of Trio.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any, cast

import llama_cpp
import numpy as np
import numpy.typing as npt

from ._errors import ModelLoadError
from ._grammar import Grammar
from ._grammar_cache import GrammarCache
from ._llama_log import recent_log
from ._sampling import Penalties, RawLogprob, logprob_of

__all__ = ["Batch", "LlamaModel", "SlotSampler"]


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
    ) -> None:
        recent_log()
        params = llama_cpp.llama_model_default_params()
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
        self.is_recurrent = bool(llama_cpp.llama_model_is_recurrent(self._model))
        self.is_hybrid = bool(llama_cpp.llama_model_is_hybrid(self._model))
        self.eog: frozenset[int] = frozenset(
            t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(self.vocab, t)
        )
        self.architecture = self.meta("general.architecture") or "unknown"
        template = llama_cpp.llama_model_chat_template(self._model, None)
        self.chat_template: str | None = template.decode("utf-8", "replace") if template else None
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
        self.grammars = GrammarCache(self.vocab)

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
    ) -> None:
        cparams = llama_cpp.llama_context_default_params()
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

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(512)
        n = llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def close(self) -> None:
        self.grammars.clear()
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

    def pooled(self, seq: int) -> npt.NDArray[np.float32] | None:
        """A copy of sequence ``seq``'s pooled embedding after the last decode (``None``
        when llama.cpp has none for it)."""
        ptr = llama_cpp.llama_get_embeddings_seq(self.ctx, seq)
        if not ptr:
            return None
        return np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).copy()

    def logits(self, index: int) -> npt.NDArray[np.float32]:
        ptr = llama_cpp.llama_get_logits_ith(self.ctx, index)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))


class Batch:
    """A ``llama_batch`` over numpy arrays, filled a slice at a time (no per-token objects).

    Every token belongs to one sequence; the ``seq_id`` pointers are set once to point into a
    flat array, so sequence ids are filled like the other columns.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.token = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.seq = np.zeros(capacity, dtype=np.int32)
        self.n_seq_id = np.ones(capacity, dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        item = ctypes.sizeof(ctypes.c_int32)
        base = self.seq.ctypes.data
        self._seq_ptrs = (ctypes.POINTER(llama_cpp.llama_seq_id) * capacity)(
            *(
                ctypes.cast(base + i * item, ctypes.POINTER(llama_cpp.llama_seq_id))
                for i in range(capacity)
            )
        )
        self.struct: Any = cast(Any, llama_cpp.llama_batch())
        self.struct.token = self.token.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token))
        self.struct.embd = None
        self.struct.pos = self.pos.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_pos))
        self.struct.n_seq_id = self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.struct.seq_id = self._seq_ptrs
        self.struct.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        self.n = 0

    def clear(self) -> None:
        self.n = 0

    def add(
        self,
        tokens: npt.NDArray[np.int32] | list[int],
        start_pos: int,
        seq: int,
        *,
        output_last: bool,
        output_all: bool = False,
    ) -> int:
        """Append ``tokens`` of ``seq`` at positions ``start_pos...``; returns the batch index
        of the last one (whose logits are output when ``output_last``; every token's are
        when ``output_all``)."""
        n = len(tokens)
        i = self.n
        self.token[i : i + n] = tokens
        self.pos[i : i + n] = np.arange(start_pos, start_pos + n, dtype=np.int32)
        self.seq[i : i + n] = seq
        self.logits[i : i + n] = 1 if output_all else 0
        if output_last:
            self.logits[i + n - 1] = 1
        self.n = i + n
        self.struct.n_tokens = self.n
        return i + n - 1

    def add_one(self, token: int, pos: int, seq: int) -> int:
        i = self.n
        self.token[i] = token
        self.pos[i] = pos
        self.seq[i] = seq
        self.logits[i] = 1
        self.n = i + 1
        self.struct.n_tokens = self.n
        return i


class SlotSampler:
    """Picks a slot's next token from the logits at a batch index.

    Greedy is an argmax over the logits, after adding any biases in place (numpy, no
    candidate array of the whole vocabulary); anything else runs llama.cpp's sampler chain:
    logit bias, top-k, top-p, min-p, temperature, then a seeded draw.

    A slot with a ``grammar`` (GBNF), ``penalties`` or ``logprobs`` takes a longer path, paid
    by that slot only: penalties are applied to the logits (numpy), a token is picked as
    above, and the grammar checks that one token; only when it refuses is the grammar applied
    to the whole vocabulary and the token picked again (llama.cpp's common sampler does the
    same). A greedy slot first tries the 64 most likely tokens: the best one the grammar allows
    there is the best it allows at all.

    A lazy grammar (:class:`Grammar` with a trigger) starts when the output holds the
    trigger (after ``after``, when given): the grammar is fed the trigger and the rest of
    that token's text byte by byte, and a token whose rest it refuses is not picked (the
    next best is). llama.cpp's own lazy grammar is not used: a token that completes its
    trigger pattern and carries text the grammar refuses aborts the process, and it searches
    all the output so far at every token. ``logprobs`` (a count of alternatives) records
    :attr:`last_logprob` from the raw logits. When the grammar allows no token at all,
    :meth:`sample` returns -1.

    Error handling: :class:`GrammarError` when the grammar does not parse.
    Resource handling: :meth:`close` frees the chain and the grammar.
    """

    def __init__(
        self,
        model: LlamaModel,
        *,
        temperature: float,
        top_k: int,
        top_p: float,
        min_p: float,
        seed: int,
        bias: dict[int, float],
        grammar: str | Grammar | None = None,
        penalties: Penalties | None = None,
        logprobs: int | None = None,
    ) -> None:
        self._model = model
        self._chain: Any = None
        self._grammar: Any = None
        self._lazy: str | None = None  # a grammar waiting for its trigger
        self._trigger = b""
        self._wait = b""  # text the trigger is looked for after (``after``)
        self._tail = b""  # the end of the output, where a trigger may be starting
        self._argmax = temperature <= 0
        self._bias_ids = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
        self._bias_values = np.fromiter(bias.values(), dtype=np.float32, count=len(bias))
        self._penalties = penalties
        self._logprobs = logprobs
        self._plain = grammar is None and penalties is None and logprobs is None
        self.last_logprob: RawLogprob | None = None
        self._all: _Candidates | None = None  # the whole vocabulary, made on first use
        if grammar is not None:
            self._one = _Candidates(1)
            self._shortlist = _Candidates(min(_SHORTLIST, model.n_vocab))
            if isinstance(grammar, str):
                grammar = Grammar(grammar)
            if grammar.trigger is None:
                self._grammar = model.grammars.new(grammar.text)
            else:
                self._lazy, self._trigger = grammar.text, grammar.trigger.encode()
                self._wait = (grammar.after or "").encode()
        if self._argmax:
            return
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        self._chain = chain
        if bias and self._plain:
            entries = (llama_cpp.llama_logit_bias * len(bias))()
            for i, (token, value) in enumerate(bias.items()):
                entries[i] = llama_cpp.llama_logit_bias(token, value)
            llama_cpp.llama_sampler_chain_add(
                chain, llama_cpp.llama_sampler_init_logit_bias(model.n_vocab, len(bias), entries)
            )
        if top_k > 0:
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_k(top_k))
        if top_p < 1.0:
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_p(top_p, 1))
        if min_p > 0.0:
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_min_p(min_p, 1))
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_temp(temperature))
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_dist(seed))

    def sample(self, index: int) -> int:
        if self._plain:
            if self._argmax:
                logits = self._model.logits(index)
                if len(self._bias_ids):
                    logits[self._bias_ids] += self._bias_values
                return int(np.argmax(logits))
            return int(llama_cpp.llama_sampler_sample(self._chain, self._model.ctx, index))
        return self._sample_extras(index)

    def _sample_extras(self, index: int) -> int:
        logits = self._model.logits(index)
        raw = logits.copy() if self._logprobs is not None else None
        if len(self._bias_ids):
            logits[self._bias_ids] += self._bias_values
        if self._penalties is not None:
            self._penalties.apply(logits)
        token = self._pick(logits)
        if self._lazy is not None:
            token = self._watch(token, logits)
        elif self._grammar is not None and not self._allows(token):
            token = self._best_allowed(logits) if self._argmax else -1
        if token < 0 and self._grammar is not None:
            candidates = self._candidates()
            candidates.fill(logits)
            llama_cpp.llama_sampler_apply(self._grammar, candidates.ref)
            if not np.isfinite(candidates.data["logit"]).any():
                self.last_logprob = None
                return -1
            logits = np.ascontiguousarray(candidates.data["logit"])
            token = self._pick(logits)
        if self._grammar is not None and self._lazy is None:
            llama_cpp.llama_sampler_accept(self._grammar, token)
        if self._lazy == "":
            self._lazy = None  # started with this token, which it was fed
        if self._penalties is not None:
            self._penalties.accept(token)
        if raw is not None:
            self.last_logprob = logprob_of(raw, token, self._logprobs or 0)
        return token

    def _watch(self, token: int, logits: npt.NDArray[np.float32]) -> int:
        """A lazy grammar waits: start it if ``token`` completes the trigger (then ``token``
        must suit it, or the next best is picked); returns the token."""
        for _ in range(_TRIGGER_TRIES):
            text = self._tail + self._model.special_piece(token)
            if self._wait:
                at = text.find(self._wait)
                if at < 0:
                    self._tail = text[-len(self._wait) :]
                    return token
                text = text[at + len(self._wait) :]
            at = text.find(self._trigger)
            if at < 0:
                if not self._wait:
                    self._tail = text[-len(self._trigger) :]
                else:
                    self._wait, self._tail = b"", text[-len(self._trigger) :]
                return token
            assert self._lazy is not None
            grammar = self._model.grammars.new(self._lazy)
            if self._feed(grammar, text[at:]):
                self._grammar, self._lazy = grammar, ""
                return token
            llama_cpp.llama_sampler_free(grammar)
            logits[token] = -np.inf
            token = self._pick(logits)
        return token

    def _feed(self, grammar: Any, data: bytes) -> bool:
        """Feed ``data`` to ``grammar`` byte by byte; false at the first byte it refuses."""
        for byte in data:
            token = self._model.byte_tokens.get(byte)
            if token is None or not self._allows(token, grammar):
                return False
            llama_cpp.llama_sampler_accept(grammar, token)
        return True

    def _pick(self, logits: npt.NDArray[np.float32]) -> int:
        if self._argmax:
            return int(np.argmax(logits))
        candidates = self._candidates()
        candidates.fill(logits)
        llama_cpp.llama_sampler_apply(self._chain, candidates.ref)
        return int(candidates.data["id"][candidates.array.selected])

    def _candidates(self) -> _Candidates:
        if self._all is None:
            self._all = _Candidates(self._model.n_vocab)
        return self._all

    def _best_allowed(self, logits: npt.NDArray[np.float32]) -> int:
        """Greedy under a grammar that refused the argmax: the best token the grammar allows
        among the most likely ``_SHORTLIST``, which is the best it allows at all; -1 when it
        allows none of them."""
        shortlist = self._shortlist
        size = len(shortlist.data)
        ids = np.argpartition(-logits, size - 1)[:size]
        shortlist.data["id"] = ids
        shortlist.data["logit"] = logits[ids]
        shortlist.data["p"] = 0.0
        shortlist.reset()
        llama_cpp.llama_sampler_apply(self._grammar, shortlist.ref)
        allowed = shortlist.data["logit"]
        if not np.isfinite(allowed).any():
            return -1
        return int(shortlist.data["id"][int(np.argmax(allowed))])

    def _allows(self, token: int, grammar: Any = None) -> bool:
        one = self._one
        one.data["id"][0] = token
        one.data["logit"][0] = 0.0
        one.data["p"][0] = 0.0
        one.reset()
        llama_cpp.llama_sampler_apply(grammar or self._grammar, one.ref)
        return bool(np.isfinite(one.data["logit"][0]))

    def close(self) -> None:
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None
        if self._grammar is not None:
            llama_cpp.llama_sampler_free(self._grammar)
            self._grammar = None


# Tokens a greedy slot's grammar looks at before it looks at the whole vocabulary.
_SHORTLIST = 64
# Tokens tried for the one that starts a lazy grammar (each refused one is not picked).
_TRIGGER_TRIES = 8
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


class _Candidates:
    """A ``llama_token_data_array`` over a numpy structured array, refilled in place."""

    def __init__(self, size: int) -> None:
        self.data = np.zeros(size, dtype=_TOKEN_DATA)
        self._ids = np.arange(size, dtype=np.int32)
        self.array: Any = llama_cpp.llama_token_data_array()
        self.array.data = cast(Any, self.data.ctypes.data_as(llama_cpp.llama_token_data_p))
        self.ref = ctypes.byref(self.array)
        self.reset()

    def reset(self) -> None:
        self.array.size = len(self.data)
        self.array.selected = -1
        self.array.sorted = False

    def fill(self, logits: npt.NDArray[np.float32]) -> None:
        self.data["id"] = self._ids
        self.data["logit"] = logits
        self.data["p"] = 0.0
        self.reset()
