"""A slot's sampler: the next token from the logits at a batch index, with the request's
extras (biases, penalties, log-probabilities, a grammar, lazy or not).

Everything here runs on the decode thread; nothing here knows of Trio.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import llama_cpp
import numpy as np
import numpy.typing as npt

from ..grammar import Grammar
from ._constrained import Candidates, GrammarSearch, OneToken
from ._logits import Penalties, RawLogprob, logprob_of

if TYPE_CHECKING:
    from ._model import LlamaModel

__all__ = ["SlotSampler"]


class SlotSampler:
    """Picks a slot's next token from the logits at a batch index.

    Greedy is an argmax over the logits, after adding any biases in place (numpy, no
    candidate array of the whole vocabulary); anything else runs llama.cpp's sampler chain:
    logit bias, top-k, top-p, min-p, temperature, then a seeded draw.

    A slot with a ``grammar`` (GBNF), ``penalties`` or ``logprobs`` takes a longer path, paid
    by that slot only: penalties are applied to the logits (numpy), a token is picked as
    above, and the grammar checks that one token. When it refuses, the token is picked again
    among the tokens the grammar allows (llama.cpp's common sampler does the same, applying
    the grammar to the whole vocabulary): greedy takes the best allowed token, and a chain
    with top-k draws from the k best allowed ones, both found by checking tokens most likely
    first (:class:`GrammarSearch`), which picks what the whole-vocabulary pass would; a chain
    without top-k (top-p or min-p alone, or nothing) still needs the whole vocabulary.

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
        self._top_k = top_k
        self._bias_ids = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
        self._bias_values = np.fromiter(bias.values(), dtype=np.float32, count=len(bias))
        self._penalties = penalties
        self._logprobs = logprobs
        self._plain = grammar is None and penalties is None and logprobs is None
        self.last_logprob: RawLogprob | None = None
        self._all: Candidates | None = None  # the whole vocabulary, made on first use
        if grammar is not None:
            self._one = OneToken()
            self._search = GrammarSearch(model.vocab_index)
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
            token = self._pick_allowed(logits)
            if token < 0:
                self.last_logprob = None
                return -1
        if self._grammar is not None and self._lazy is None:
            llama_cpp.llama_sampler_accept(self._grammar, token)
        if self._lazy == "":
            self._lazy = None  # started with this token, which it was fed
        if self._penalties is not None:
            self._penalties.accept(token)
        if raw is not None:
            self.last_logprob = logprob_of(raw, token, self._logprobs or 0)
        return token

    def force(self, index: int, token: int) -> int:
        """Take ``token`` at ``index`` whatever the logits say (a reasoning budget's
        end-of-thinking marker), as if it had been picked: a lazy grammar watching for its
        trigger reads its text, the penalties count it, and its log-probability is the one
        the logits at ``index`` give it. Not for a grammar held from the first token (the
        engine forces nothing under one). Returns ``token``."""
        if self._plain:
            return token
        assert self._grammar is None or self._lazy is not None, "forced under a grammar"
        if self._lazy is not None:
            self._watch(token, None)
            if self._lazy == "":
                self._lazy = None
        if self._penalties is not None:
            self._penalties.accept(token)
        if self._logprobs is not None:
            self.last_logprob = logprob_of(self._model.logits(index), token, self._logprobs)
        return token

    def _watch(self, token: int, logits: npt.NDArray[np.float32] | None) -> int:
        """A lazy grammar waits: start it if ``token`` completes the trigger (then ``token``
        must suit it, or the next best is picked; without ``logits``, a forced token, the
        grammar waits on when it does not); returns the token."""
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
            if logits is None:
                return token
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
        return candidates.selected

    def _candidates(self) -> Candidates:
        if self._all is None:
            self._all = Candidates(self._model.n_vocab)
        return self._all

    def _pick_allowed(self, logits: npt.NDArray[np.float32]) -> int:
        """The grammar refused the token picked: pick again among the tokens it allows, as
        if it had been applied to the whole vocabulary first; -1 when it allows none.

        Greedy: the best allowed token. A chain that starts with top-k keeps the k best
        allowed tokens and nothing else, so it is run on those alone (same tokens, same
        order, one draw from the same generator: the same pick). Any other chain sees the
        whole vocabulary with the refused tokens at -inf."""
        if self._argmax or self._top_k > 0:
            want = 1 if self._argmax else self._top_k
            best = self._search.best_allowed(self._grammar, logits, want)
            if not len(best):
                return -1
            if self._argmax:
                return int(best[0])
            candidates = self._candidates()
            candidates.fill_ids(best, logits)
        else:
            candidates = self._candidates()
            candidates.fill(logits)
            llama_cpp.llama_sampler_apply(self._grammar, candidates.ref)
            if not np.isfinite(candidates.data["logit"]).any():
                return -1
        llama_cpp.llama_sampler_apply(self._chain, candidates.ref)
        return candidates.selected

    def allowed(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens``, one after another from the sampler's state now, its
        grammar takes: a draft token past the first one it refuses can never be accepted,
        so it is not worth a position. All of them without a grammar, or while a lazy one
        waits for its trigger; an end-of-generation token the grammar takes is the last."""
        if self._grammar is None or self._lazy is not None:
            return len(tokens)
        return self._one.taken(self._grammar, tokens, self._model.eog)

    def _allows(self, token: int, grammar: Any = None) -> bool:
        return self._one.allowed(grammar or self._grammar, token)

    def close(self) -> None:
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None
        if self._grammar is not None:
            llama_cpp.llama_sampler_free(self._grammar)
            self._grammar = None


# Tokens tried for the one that starts a lazy grammar (each refused one is not picked).
_TRIGGER_TRIES = 8
