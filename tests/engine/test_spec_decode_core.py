"""Speculative decoding in the decode-step core, without Trio, on both test models.

Every token emitted must be the one the sequence's sampler picks from the logits of its
own position: greedy, the argmax of the logits it was verified against (after biases,
penalties and grammar); sampled, a draw from the target distribution (tested
statistically). The tests run where drafts are mostly right (prompt lookup on text that is
being repeated, or drafts from the model itself) and where they are mostly wrong (random
drafts, forced into every step).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest

from llmtrio.engine import DecodeError, EngineStats, Sampling, StopReason
from llmtrio.engine.generate import _core as core_module
from llmtrio.engine.generate import _core_execute as execute_module
from llmtrio.engine.generate._jobs import Drafter
from llmtrio.engine.llama import Batch, LlamaModel, SlotSampler
from llmtrio.engine.spec_decode import NgramDrafter
from llmtrio.engine.spec_decode._ngram import AGREED_MATCH, POOL_MATCH

from .._core_helpers import (
    RandomDrafter,
    RecordingModel,
    core_request,
    draft_all,
    open_core,
    run_core,
)

REWRITE = (
    "The river town kept its bridge for three hundred years. Every spring the water rose, "
    "and every spring the people carried sandbags to the old stone arches, sang the same "
    "songs, and argued about whether the bridge would finally fall. It never did. When the "
    "engineers came with plans for a new steel crossing, the town voted to keep the old "
    "bridge and build the new one a mile downstream, where nobody would have to look at it."
)


def rewrite_prompt(model: LlamaModel) -> list[int]:
    text = f"Text:\n{REWRITE}\n\nThe same text, copied exactly:\nText:\n"
    return model.tokenize(text, add_special=model.add_bos)


def greedy_of(model: LlamaModel, seen: list[np.ndarray], bias: dict[int, float]) -> list[int]:
    tokens = []
    for row in seen:
        row = row.copy()
        for token, value in bias.items():
            row[token] += value
        tokens.append(int(np.argmax(row)))
    return tokens


def log_softmax(row: np.ndarray) -> np.ndarray:
    row = row.astype(np.float64)
    return row - row.max() - np.log(np.exp(row - row.max()).sum())


@pytest.mark.parametrize("drafts", ["ngram", "random"])
@pytest.mark.parametrize("which", ["gemma", "qwen35"])
def test_greedy_tokens_are_the_argmax_of_the_logits_they_were_verified_against(
    which: str, drafts: str, gemma_path: Path, qwen35_path: Path
) -> None:
    path = gemma_path if which == "gemma" else qwen35_path
    model = RecordingModel(path, slots=1, ctx_size=256, threads=2, n_batch=512, n_rs_seq=4)
    try:
        prompt = rewrite_prompt(model)
        max_tokens = 40
        bias = dict.fromkeys(model.eog, float("-inf"))
        request = core_request(0, prompt, max_tokens, ignore_eos=True)

        core, _ = open_core(model, spec=None)
        plain = run_core(core, [request]).tokens[0]
        plain_seen, model.seen = model.seen, []
        model.forget(0)

        extra = {}
        if drafts == "random":
            extra = {"drafter": lambda _: RandomDrafter(model.n_vocab), "plan": draft_all}
        core, stats = open_core(model, spec="ngram", spec_draft_max=4, **extra)
        spec = run_core(core, [request]).tokens[0]
    finally:
        model.close()

    assert len(spec) == len(plain) == max_tokens
    # Every emitted token went through the sampler, at its own position, in order.
    assert spec == greedy_of(model, model.seen, bias)
    assert stats.spec_draft_tokens > 0
    rate = stats.spec_accepted_tokens / stats.spec_draft_tokens
    if drafts == "ngram":
        assert rate > 0.5, rate  # the text being repeated: mostly right
        assert stats.steps < max_tokens  # fewer steps than tokens
    else:
        assert rate < 0.2, rate  # random tokens: mostly wrong
    # Against the run without drafts: the same, up to batch-shape numerics, where the
    # first divergence must be a near-tie that run's second choice won.
    if spec != plain:
        assert which == "gemma", "the hybrid model's numerics do not move"
        i = next(i for i, (a, b) in enumerate(zip(spec, plain, strict=True)) if a != b)
        logprobs = log_softmax(plain_seen[i])
        for token in bias:
            logprobs[token] = -np.inf
        first, second = np.argsort(-logprobs)[:2]
        assert (plain[i], spec[i]) == (first, second)
        assert logprobs[first] - logprobs[second] < 1.0


def test_rejected_drafts_roll_recurrent_memory_back(qwen35_path: Path) -> None:
    """Hybrid memory: llama.cpp's per-sequence recurrent snapshots (n_rs_seq) undo the
    rejected drafts; without them the model could not speculate at all."""
    model = LlamaModel(qwen35_path, slots=2, ctx_size=128, threads=2, n_batch=128, n_rs_seq=4)
    try:
        assert model.is_hybrid and model.n_rs_seq == 4
        prompts = [model.tokenize(t, add_special=False) for t in ("hello world", "a b c d e")]
        plain_core, _ = open_core(model, spec=None)
        plain = run_core(plain_core, [core_request(k, p, 24) for k, p in enumerate(prompts)])
        for seq in range(2):
            model.forget(seq)
        core, stats = open_core(
            model,
            spec="ngram",
            spec_draft_max=4,
            drafter=lambda _: RandomDrafter(model.n_vocab, seed=1),
            plan=draft_all,
        )
        spec = run_core(core, [core_request(k, p, 24) for k, p in enumerate(prompts)])
        assert spec.tokens == plain.tokens
        assert stats.spec_draft_tokens > stats.spec_accepted_tokens  # rollbacks happened

        # The slot's memory after rollbacks is what it held: the next turn reuses it whole
        # and continues as a fresh ingestion would.
        longer = [*prompts[0], *spec.tokens[0][:-1]]
        again = run_core(core, [core_request(5, [*longer, 7, 8], 8)])
        assert again.ended(5).cached == len(longer)
        for seq in range(2):
            model.forget(seq)
        fresh_core, _ = open_core(model, spec=None, prompt_cache=False)
        fresh = run_core(fresh_core, [core_request(6, [*longer, 7, 8], 8)])
        assert again.tokens[5] == fresh.tokens[6]
    finally:
        model.close()


def test_without_recurrent_snapshots_a_hybrid_model_does_not_draft(qwen35_path: Path) -> None:
    model = LlamaModel(qwen35_path, slots=1, ctx_size=128, threads=2, n_batch=128)
    try:
        core, stats = open_core(model, spec="ngram", plan=draft_all)
        run_core(core, [core_request(0, model.tokenize("a b a b a b", add_special=False), 12)])
        assert stats.spec_draft_tokens == 0
    finally:
        model.close()


def test_penalties_grammar_and_logprobs_under_speculation(qwen35_path: Path) -> None:
    """Penalties and the grammar advance token by token through accepted drafts; the
    log-probabilities are those of the logits each token was verified against."""
    model = LlamaModel(qwen35_path, slots=2, ctx_size=128, threads=2, n_batch=128, n_rs_seq=4)
    try:
        prompt = model.tokenize("hello world the cat sat on", add_special=False)
        vocab = [model.piece(t).decode("utf-8", "replace") for t in range(model.n_vocab)]
        words = sorted({w for w in vocab if w.strip() and w.isalpha()})[:3]
        grammar = "root ::= (" + " | ".join(f'"{w}"' for w in words) + ")+"
        kinds = {
            "penalties": {"sampling": Sampling(temperature=0, repeat_penalty=1.3)},
            "grammar": {"grammar": grammar},
            "logprobs": {"logprobs": 3},
        }
        requests = [core_request(k, prompt, 20, **v) for k, v in enumerate(kinds.values())]
        plain_core, _ = open_core(model, spec=None, max_inflight=2)
        plain = run_core(plain_core, requests)
        for seq in range(2):
            model.forget(seq)
        core, stats = open_core(
            model,
            spec="ngram",
            spec_draft_max=4,
            drafter=lambda history: Echo(plain.tokens, history[len(prompt) :]),
            plan=draft_all,
        )
        spec = run_core(core, requests)
    finally:
        model.close()
    assert stats.spec_accepted_tokens > 0
    # Each kind drafted and had drafts accepted, the grammar's too: the drafts are its own
    # output, which the grammar takes, so cutting them at a refused token left them whole.
    assert all(spec.ended(k).accepted > 0 for k in range(len(kinds)))
    assert spec.tokens == plain.tokens
    text = "".join(vocab[t] for t in spec.tokens[1])
    assert text and all(w in words for w in _split(text, words))
    got = [lp for o in spec.outputs[2] for lp in (o.logprobs or [])]
    want = [lp for o in plain.outputs[2] for lp in (o.logprobs or [])]
    assert [lp.token for lp in got] == spec.tokens[2]
    assert len(got) == len(want) == 20
    for a, b in zip(got, want, strict=True):
        assert a.token == b.token and abs(a.logprob - b.logprob) < 1e-3
        assert [t for t, _ in a.top] == [t for t, _ in b.top]


class Echo:
    """Drafts what a run without speculation produced (right until the run diverges)."""

    def __init__(self, streams: dict[int, list[int]], emitted: list[int]) -> None:
        self._streams = list(streams.values())
        self._seen = list(emitted)

    def extend(self, tokens: list[int]) -> None:
        self._seen += tokens

    def propose(self, limit: int) -> tuple[list[int], int]:
        n = len(self._seen)
        for stream in self._streams:
            if stream[:n] == self._seen:
                return stream[n : n + limit], 4
        return [], 0


def _split(text: str, words: list[str]) -> list[str]:
    """``text`` cut into ``words`` greedily (an unknown rest is returned as one piece)."""
    out = []
    while text:
        word = next((w for w in sorted(words, key=len, reverse=True) if text.startswith(w)), None)
        if word is None:
            return [*out, text]
        out.append(word)
        text = text[len(word) :]
    return out


def test_max_tokens_and_the_context_end_hold_with_drafts(qwen35_path: Path) -> None:
    model = LlamaModel(qwen35_path, slots=1, ctx_size=64, threads=2, n_batch=128, n_rs_seq=8)
    try:
        prompt = model.tokenize("a b a b a b a b", add_special=False)
        core, _ = open_core(model, spec="ngram", spec_draft_max=8, plan=draft_all)
        run = run_core(core, [core_request(0, prompt, 7)])
        assert len(run.tokens[0]) == 7 and run.stop(0) is StopReason.MAX_TOKENS
        # No max_tokens: the engine's budget is what the context holds.
        budget = 64 - len(prompt) + 1
        request = core_request(1, prompt, budget)
        request = attrs.evolve(request, request=attrs.evolve(request.request, max_tokens=None))
        long = run_core(core, [request])
        assert long.stop(1) is StopReason.CONTEXT_END
        assert len(long.tokens[1]) == budget
    finally:
        model.close()


class Oracle:
    """Drafts the model's own greedy continuation (mostly right at a low temperature)."""

    def __init__(self, model: LlamaModel, history: list[int]) -> None:
        self._model = model
        self._history = list(history)
        self._batch = Batch(model.n_batch)

    def extend(self, tokens: list[int]) -> None:
        self._history += tokens

    def propose(self, limit: int) -> tuple[list[int], int]:
        model, batch = self._model, self._batch
        draft: list[int] = []
        model.forget(0)
        batch.clear()
        batch.add(self._history, 0, 0, output_last=True)
        pos = len(self._history)
        while True:
            assert model.decode(batch) == 0
            draft.append(int(np.argmax(model.logits(batch.n - 1))))
            if len(draft) == limit:
                return draft, 4
            batch.clear()
            batch.add_one(draft[-1], pos, 0)
            pos += 1


def always_accept(sample: Any, first: int, draft: list[int], ends: Any) -> list[int]:
    """A wrong verifier: samples every position (so the random state moves on as usual)
    but emits the drafts whatever the samples were."""
    for j in range(len(draft)):
        sample(first + j)
    return [*draft, sample(first + len(draft))]


def calibration(
    reference: LlamaModel, prompt: list[int], streams: list[list[int]], temperature: float
) -> float:
    """How far the emitted tokens' log-likelihood under the target distribution (softmax of
    the logits over ``temperature``) lies from its expectation, in standard deviations: a
    sum of per-token terms, each of mean 0 when every token is a draw from its target."""
    batch = Batch(reference.n_batch)
    total = mean = variance = 0.0
    for stream in streams:
        reference.forget(0)
        batch.clear()
        batch.add([*prompt, *stream[:-1]], 0, 0, output_last=True, output_all=True)
        assert reference.decode(batch) == 0
        for i, token in enumerate(stream):
            logp = log_softmax(reference.logits(len(prompt) - 1 + i) / temperature)
            p = np.exp(logp)
            e = float((p * logp).sum())
            total += float(logp[token])
            mean += e
            variance += float((p * logp**2).sum()) - e * e
    return (total - mean) / float(np.sqrt(variance))


@pytest.mark.parametrize(
    ("drafts", "temperature"), [("oracle", 0.02), ("random", 0.05)], ids=["right", "wrong"]
)
def test_sampled_tokens_are_draws_from_the_target_distribution(
    drafts: str, temperature: float, qwen35_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The qwen35 test model's 128-token vocabulary: the log-likelihood of what a sampled
    request emits under speculation matches the target's, and an implementation that
    accepts the drafts without comparing them to the samples is caught."""
    model = LlamaModel(qwen35_path, slots=4, ctx_size=64, threads=2, n_batch=128, n_rs_seq=4)
    reference = LlamaModel(qwen35_path, slots=1, ctx_size=64, threads=2, n_batch=64)
    try:
        prompt = model.tokenize("the cat sat on the", add_special=False)

        def drafter(history: list[int]) -> Drafter:
            if drafts == "oracle":
                return Oracle(reference, history)
            return RandomDrafter(model.n_vocab, seed=len(history))

        def sample(count: int, seed: int) -> tuple[list[list[int]], EngineStats]:
            core, stats = open_core(
                model, spec="ngram", spec_draft_max=3, drafter=drafter, plan=draft_all
            )
            sampling = Sampling(temperature=temperature, top_k=0, top_p=1.0, min_p=0.0)
            requests = [
                core_request(k, prompt, 8, sampling=attrs.evolve(sampling, seed=seed + k))
                for k in range(count)
            ]
            run = run_core(core, requests)
            return [run.tokens[k] for k in range(count)], stats

        streams, stats = sample(64, seed=0)
        rate = stats.spec_accepted_tokens / stats.spec_draft_tokens
        assert (rate > 0.5) if drafts == "oracle" else (rate < 0.2), rate
        z = calibration(reference, prompt, streams, temperature)
        assert abs(z) < 4.5, z

        monkeypatch.setattr(execute_module, "verify", always_accept)
        wrong, _ = sample(32, seed=1000)
        z_wrong = calibration(reference, prompt, wrong, temperature)
        assert abs(z_wrong) > 4.5, z_wrong
    finally:
        model.close()
        reference.close()


class NoRollback(LlamaModel):
    """A model whose memory refuses every partial cut (as if its snapshots were gone)."""

    def forget(self, seq: int, start: int = -1) -> bool:
        return start <= 0 and super().forget(seq, start)


def test_a_sequence_whose_drafts_cannot_be_cut_fails_alone(qwen35_path: Path) -> None:
    model = NoRollback(qwen35_path, slots=2, ctx_size=64, threads=2, n_batch=64, n_rs_seq=4)
    try:
        drafted = model.tokenize("a b c", add_special=False)
        plain = model.tokenize("x y z", add_special=False)

        def drafter(history: list[int]) -> Drafter:
            if history[: len(drafted)] == drafted:
                return RandomDrafter(model.n_vocab)
            return Echo({}, [])  # drafts nothing

        core, _ = open_core(model, spec="ngram", spec_draft_max=4, drafter=drafter, plan=draft_all)
        run = run_core(core, [core_request(0, drafted, 10), core_request(1, plain, 10)])
    finally:
        model.close()
    assert isinstance(run.ended(0).error, DecodeError)
    assert run.stop(1) is StopReason.MAX_TOKENS and len(run.tokens[1]) == 10


class SpyPooledDrafter(core_module.PooledDrafter):
    """The core's pooled drafter, keeping what it saw and each draft it made from the pool
    (at how many tokens it had then)."""

    made: list[SpyPooledDrafter] = []

    def __init__(
        self, own: Drafter, pool: core_module.NgramPool, tokens: list[int], *args: Any, **kw: Any
    ) -> None:
        super().__init__(own, pool, tokens, *args, **kw)
        self.history = list(tokens)
        self.pool_drafts: list[tuple[int, list[int]]] = []
        SpyPooledDrafter.made.append(self)

    def extend(self, tokens: Sequence[int]) -> None:
        super().extend(tokens)
        self.history += tokens

    def propose(self, limit: int) -> tuple[list[int], int]:
        draft, match = super().propose(limit)
        if match == POOL_MATCH:
            self.pool_drafts.append((len(self.history), draft))
        return draft, match

    def pool_accepted(self) -> int:
        """The pool's draft tokens that were right (every draft is verified: ``draft_all``)."""
        right = 0
        for at, draft in self.pool_drafts:
            for token, emitted in zip(draft, self.history[at:], strict=False):
                if token != emitted:
                    break
                right += 1
        return right


def test_a_request_drafts_from_the_pool_what_another_request_wrote(
    gemma_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second request's prompt does not hold the text the first one wrote (its own
    prompt lookup cannot find it); the core's pool of n-grams does, and the second request
    drafts it and has it accepted, its tokens still the argmax of their logits."""
    monkeypatch.setattr(core_module, "PooledDrafter", SpyPooledDrafter)
    SpyPooledDrafter.made = []
    model = RecordingModel(gemma_path, slots=1, ctx_size=256, threads=2, n_batch=512)
    try:
        prompt = model.tokenize(
            "A list of twelve fruits, one per line:\n", add_special=model.add_bos
        )
        bias = dict.fromkeys(model.eog, float("-inf"))
        core, _ = open_core(model, spec="ngram", spec_draft_max=8, spec_pool=65536, plan=draft_all)
        first = run_core(core, [core_request(0, prompt, 48, ignore_eos=True)]).tokens[0]
        model.seen = []
        second = run_core(core, [core_request(1, prompt, 48, ignore_eos=True)]).tokens[1]
    finally:
        model.close()

    writer, reader = SpyPooledDrafter.made

    def grams(tokens: list[int]) -> set[tuple[int, ...]]:
        return {tuple(tokens[i : i + 4]) for i in range(len(tokens) - 3)}

    assert grams(first).isdisjoint(grams(prompt))  # prompt lookup's 4-grams cannot find it
    assert second == greedy_of(model, model.seen, bias)
    assert len(reader.pool_drafts) > 0
    # Most of what the first request wrote is drafted and accepted from the pool, as far as
    # the two runs agree: they may part where batch-shape numerics tip a near-tie (on this
    # machine they agree on all 48 tokens; on another, a draft past the parting fails).
    common = next((i for i, (a, b) in enumerate(zip(first, second, strict=True)) if a != b), 48)
    assert reader.pool_accepted() >= min(24, common - 16), (first, second, reader.pool_drafts)
    if common >= 8:
        assert reader.pool_accepted() > writer.pool_accepted()


def test_without_the_pool_a_request_drafts_from_its_own_tokens_only(
    gemma_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(core_module, "PooledDrafter", SpyPooledDrafter)
    model = LlamaModel(gemma_path, slots=1, ctx_size=128, threads=2, n_batch=256)
    try:
        prompt = model.tokenize("one two three", add_special=model.add_bos)
        made = []
        for pool in (0, 1000):
            SpyPooledDrafter.made = []
            core, _ = open_core(model, spec="ngram", spec_pool=pool)
            run_core(core, [core_request(pool, prompt, 4, ignore_eos=True)])
            made.append(len(SpyPooledDrafter.made))
    finally:
        model.close()
    assert made == [0, 1]


class SpyNgramDrafter(NgramDrafter):
    """Prompt lookup that keeps what it proposed, and counts the grammar walks (``fits``)
    it made proposing."""

    made: list[SpyNgramDrafter] = []

    def __init__(self, tokens: Sequence[int], **kwargs: Any) -> None:
        fits = kwargs.get("fits")
        if fits is not None:
            kwargs["fits"] = self._counted(fits)
        super().__init__(tokens, **kwargs)
        self.proposed: list[tuple[list[int], int]] = []
        self.walks = 0
        SpyNgramDrafter.made.append(self)

    def _counted(self, fits: Any) -> Any:
        def counted(draft: Sequence[int]) -> int:
            self.walks += 1
            return int(fits(draft))

        return counted

    def propose(self, limit: int) -> tuple[list[int], int]:
        draft, match = super().propose(limit)
        self.proposed.append((draft, match))
        return draft, match


EXAMPLES = (
    'Record: Ann Berg lives in Oslo since 1999.\n{"name": "Ann Berg", "city": "Oslo", '
    '"year": "1999"}\n'
    'Record: Li Wei lives in Lyon since 2004.\n{"name": "Li Wei", "city": "Lyon", '
    '"year": "2004"}\n'
    "Record: Sara Kim lives in Porto since 2011.\n"
)
RECORD_GRAMMAR = (
    'root ::= "{\\"name\\": \\"" [A-Za-z ]{1,20} "\\", \\"city\\": \\"" [A-Za-z ]{1,20} '
    '"\\", \\"year\\": \\"" [0-9]{4} "\\"}"'
)


def test_a_grammar_held_request_drafts_the_key_its_grammar_wants_next(
    gemma_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a value, the worked examples go on with every key; the grammar picks the
    continuations that lead into the key it wants next, which the examples agree on."""
    monkeypatch.setattr(core_module, "NgramDrafter", SpyNgramDrafter)
    SpyNgramDrafter.made = []
    walks = 0
    allowed = SlotSampler.allowed

    def counted(sampler: SlotSampler, tokens: Sequence[int]) -> int:
        nonlocal walks
        walks += 1
        return allowed(sampler, tokens)

    monkeypatch.setattr(SlotSampler, "allowed", counted)
    model = LlamaModel(gemma_path, slots=1, ctx_size=512, threads=2, n_batch=512)
    try:
        prompt = model.tokenize(EXAMPLES, add_special=model.add_bos)
        core, stats = open_core(model, spec="ngram", spec_draft_max=8, plan=draft_all)
        sampling = Sampling(temperature=0)
        request = core_request(0, prompt, 48, grammar=RECORD_GRAMMAR, sampling=sampling)
        run = run_core(core, [request])
        # Rendered before the model (its vocabulary) is freed.
        text = b"".join(model.piece(t) for t in run.tokens[0]).decode()
        (drafter,) = SpyNgramDrafter.made
        agreed = [
            b"".join(map(model.piece, draft)).decode()
            for draft, match in drafter.proposed
            if match == AGREED_MATCH
        ]
    finally:
        model.close()
    assert text.startswith('{"name": "') and '", "year": "' in text, text
    # Drafted where the value before it ended: the key, as far as the examples agree.
    assert any('"city": "' in a for a in agreed), drafter.proposed
    assert any('"year": "' in a for a in agreed), drafter.proposed
    # The drafter cut its drafts where the grammar refuses a token: the draft budget did
    # not walk the grammar through them again.
    assert drafter.walks > 0 and walks == drafter.walks
    assert all('"name"' not in a for a in agreed)
    assert stats.spec_accepted_tokens > 0
