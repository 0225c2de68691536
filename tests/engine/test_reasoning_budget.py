"""The reasoning budget: once a generation has spent its ``reasoning_budget`` tokens inside its
think block, the engine closes the block itself with the model's ``</think>`` token, and the
answer follows.

The budget's state is pure (:class:`ThinkBudget`); the engine's part runs on the default
model's own tokenizer and template (``qwen35_real_path``: ``<think>`` and ``</think>`` are
single tokens, the template opens a think block), with speculation off and on. The model's
weights are random: biases keep it from closing the block itself or ending early, so every
close seen is the one the budget forced.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from llmtrio.engine import (
    Engine,
    EngineStats,
    GenerateRequest,
    StopReason,
    Token,
    ToolCallArguments,
    ToolCallStart,
    ToolCallStream,
)
from llmtrio.engine.generate._think_budget import ThinkBudget, ThinkMarkers, think_markers
from llmtrio.engine.llama import LlamaModel

from .._core_helpers import Run, core_request, draft_all, open_core, run_core
from .._helpers import engine_config, events_of
from .._qwen35_real import ADDED_TOKENS
from .test_qwen35_real import WEATHER
from .test_spec_decode_core import Echo

IDS = {text: token for token, text in ADDED_TOKENS.items()}
OPEN, CLOSE = IDS["<think>"], IDS["</think>"]
CALL_OPEN = IDS["<tool_call>"]
MARKERS = ThinkMarkers(OPEN, CLOSE)
#: The Qwen3.5 template's prompt for one user turn, thinking on: it ends inside ``<think>``.
PROMPT = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"
#: Neither marker by the model's own choice: every close is the budget's.
NO_MARKERS = ((OPEN, float("-inf")), (CLOSE, float("-inf")))


# -- the budget's state (pure) ----------------------------------------------------------------


def feed_all(budget: ThinkBudget, tokens: list[int]) -> list[int]:
    """The tokens a generation emits when it would write ``tokens``: each position the budget
    forces takes the marker instead (and the rest moves on by one)."""
    out: list[int] = []
    pending = iter(tokens)
    while len(out) < len(tokens) + budget.forced_count + 1:
        forced = budget.forced()
        token = forced if forced is not None else next(pending, None)
        if token is None:
            break
        budget.feed(token, forced=forced is not None)
        out.append(token)
    return out


def test_the_marker_is_forced_after_budget_tokens_of_reasoning() -> None:
    budget = ThinkBudget(3, MARKERS, thinking=True)
    assert budget.room() == 3
    assert feed_all(budget, [1, 2, 3, 4, 5]) == [1, 2, 3, CLOSE, 4, 5]
    assert (budget.spent, budget.thinking, budget.forced_count) == (3, False, 1)
    assert budget.room() is None and budget.forced() is None


def test_a_budget_of_zero_closes_at_once_and_a_block_the_model_opens_is_counted() -> None:
    assert feed_all(ThinkBudget(0, MARKERS, thinking=True), [1, 2]) == [CLOSE, 1, 2]
    # Not thinking yet: counting starts at <think>.
    assert feed_all(ThinkBudget(2, MARKERS), [7, OPEN, 1, 2, 3]) == [7, OPEN, 1, 2, CLOSE, 3]


def test_the_model_closing_the_block_itself_forces_nothing() -> None:
    budget = ThinkBudget(4, MARKERS, thinking=True)
    assert feed_all(budget, [1, CLOSE, 2, 3, 4, 5]) == [1, CLOSE, 2, 3, 4, 5]
    assert budget.forced_count == 0 and budget.spent == 1


def test_the_budget_is_one_for_the_whole_generation() -> None:
    """A second block gets what the first left: 2 + 1 tokens for a budget of 3."""
    budget = ThinkBudget(3, MARKERS, thinking=True)
    emitted = feed_all(budget, [1, 2, CLOSE, 9, OPEN, 3, 4, 5])
    assert emitted == [1, 2, CLOSE, 9, OPEN, 3, CLOSE, 4, 5]
    assert budget.forced_count == 1


def test_a_character_left_unfinished_is_finished_before_the_marker() -> None:
    """Tokens 10 and 11 end inside a UTF-8 character: the budget lets the tokens that finish
    it through (llama.cpp's waiting state)."""
    budget = ThinkBudget(2, MARKERS, thinking=True, unfinished={10, 11}.__contains__)
    assert feed_all(budget, [1, 10, 11, 12, 13]) == [1, 10, 11, 12, CLOSE, 13]
    assert budget.spent == 4


def test_a_draft_is_cut_at_the_forced_marker() -> None:
    budget = ThinkBudget(3, MARKERS, thinking=True)
    budget.feed(1)
    assert budget.cut([2, 3, 4, 5]) == [2, 3, CLOSE]
    assert budget.cut([2, CLOSE, 4]) == [2, CLOSE, 4]  # closed by the draft itself
    assert budget.cut([2]) == [2]
    assert budget.spent == 1  # cutting changes nothing
    budget.feed(2)
    budget.feed(3)
    assert budget.cut([CLOSE, 7, 8]) == [CLOSE, 7, 8]  # the marker drafted where it is forced
    assert budget.cut([6, 7]) == [CLOSE]


def test_a_cut_draft_is_what_the_budget_lets_through_of_it() -> None:
    """Against the budget fed token by token: random states (in a block or not, the budget
    spent or not, a character left open) and drafts (markers in them or not)."""
    rng = random.Random(7)
    for _ in range(2000):
        budget = ThinkBudget(
            rng.randrange(4), MARKERS, thinking=rng.random() < 0.7, unfinished={10}.__contains__
        )
        for token in rng.choices([1, 10, OPEN, CLOSE], k=rng.randrange(4)):
            budget.feed(token)
        draft = rng.choices([1, 2, 10, OPEN, CLOSE], weights=[5, 5, 2, 1, 1], k=rng.randrange(8))
        state, want = attrs.evolve(budget), []
        for token in draft:
            forced = state.forced()
            if forced is not None and token != forced:
                want.append(forced)
                break
            state.feed(token)
            want.append(token)
        assert budget.cut(draft) == want, (budget, draft)


def test_markers_are_single_tokens_or_none() -> None:
    vocab = {"<think>": [5], "</think>": [6]}
    assert think_markers(vocab.__getitem__) == ThinkMarkers(5, 6)
    split = {"<think>": [5], "</think>": [1, 2, 3]}
    assert think_markers(split.__getitem__) is None


# -- the decode-step core: token ids, speculation off and on -----------------------------------


@pytest.fixture(scope="module")
def model(qwen35_real_path: Path) -> Iterator[LlamaModel]:
    model = LlamaModel(qwen35_real_path, slots=1, ctx_size=256, threads=1, n_batch=64, n_rs_seq=4)
    yield model
    model.close()


def marker_at(model: LlamaModel, tokens: list[int], budget: int) -> int:
    """Where the budget forces the marker into a generation that would write ``tokens``:
    after ``budget`` tokens, and after the tokens that finish a character left unfinished."""
    at = budget
    while at > 0 and tokens[at - 1] in model.unfinished_utf8:
        at += 1
    return at


def generate(
    model: LlamaModel, budget: int | None, max_tokens: int, **config: Any
) -> tuple[Run, EngineStats]:
    prompt = model.tokenize(PROMPT, add_special=False)
    request = core_request(
        0, prompt, max_tokens, reasoning_budget=budget, logit_bias=NO_MARKERS, ignore_eos=True
    )
    model.forget(0)
    core, stats = open_core(model, **config)
    return run_core(core, [attrs.evolve(request, opens_think=True)]), stats


@pytest.mark.parametrize("budget", [0, 1, 6])
def test_the_core_forces_the_marker_once_at_the_budget(model: LlamaModel, budget: int) -> None:
    free, _ = generate(model, None, 16, spec=None)
    cut, _ = generate(model, budget, 16, spec=None)
    tokens = free.tokens[0]
    assert CLOSE not in tokens
    at = marker_at(model, tokens, budget)
    # The same tokens up to the budget, the marker once, then the answer, counted.
    assert cut.tokens[0] == [*tokens[:at], CLOSE, *cut.tokens[0][at + 1 :]]
    assert cut.tokens[0].count(CLOSE) == 1 and len(cut.tokens[0]) == 16
    assert cut.stop(0) is StopReason.MAX_TOKENS


def test_drafts_that_would_cross_the_budget_are_cut_at_the_marker(model: LlamaModel) -> None:
    """The drafter offers what the model writes without a budget (right until the budget
    forces the marker): the draft that crosses it is cut there, the marker drafted in its
    place and accepted, so the position after the marker is sampled in the same step. The
    tokens are those of the run without speculation."""
    budget, prompt_len = 6, len(model.tokenize(PROMPT, add_special=False))
    free, _ = generate(model, None, 20, spec=None)
    plain, _ = generate(model, budget, 20, spec=None)
    streams = free.tokens
    spec, stats = generate(
        model,
        budget,
        20,
        spec="ngram",
        spec_draft_max=4,
        drafter=lambda history: Echo(streams, history[prompt_len:]),
        plan=draft_all,
    )
    assert spec.tokens == plain.tokens
    assert stats.spec_accepted_tokens > 0
    (step,) = [o for o in spec.outputs[0] if CLOSE in o.tokens]
    assert step.tokens[-1] != CLOSE, "the marker was accepted as a draft, not sampled last"


def test_a_model_without_think_markers_ignores_the_budget(qwen35_path: Path) -> None:
    """The qwen35 test model's 128-token vocabulary has no ``</think>`` token: a budget of 0
    with the generation inside a think block changes nothing."""
    model = LlamaModel(qwen35_path, slots=1, ctx_size=64, threads=1, n_batch=32)
    try:
        assert think_markers(lambda text: model.tokenize(text, add_special=False)) is None
        prompt = model.tokenize("a b c", add_special=False)
        runs = []
        for budget in (None, 0):
            core, _ = open_core(model, spec=None)
            request = core_request(0, prompt, 8, reasoning_budget=budget, ignore_eos=True)
            model.forget(0)
            runs.append(run_core(core, [attrs.evolve(request, opens_think=True)]).tokens[0])
    finally:
        model.close()
    assert runs[0] == runs[1] and len(runs[0]) == 8


# -- through the engine: the think splitter, the lazy tool grammar, stop strings ---------------


def reasoning_and_answer(events: list[Token]) -> tuple[str, str]:
    return (
        "".join(e.text for e in events if e.reasoning),
        "".join(e.text for e in events if not e.reasoning),
    )


@pytest.mark.parametrize("spec", [None, "ngram"])
async def test_the_reasoning_is_cut_and_the_answer_follows(
    qwen35_real_path: Path, spec: str | None
) -> None:
    config = engine_config(qwen35_real_path, max_inflight=1, ctx_size=512, threads=1, spec=spec)
    budget = 5
    request = GenerateRequest.user(
        "Hi", max_tokens=24, reasoning_budget=budget, logit_bias=NO_MARKERS, ignore_eos=True
    )
    async with Engine.open(config) as engine:
        free, _ = await events_of(
            engine, attrs.evolve(request, reasoning_budget=None, logprobs=0, max_tokens=12)
        )
        events, done = await events_of(engine, attrs.evolve(request, logprobs=0))
        zero, zero_done = await events_of(engine, attrs.evolve(request, reasoning_budget=0))
    pieces = [lp.token for e in events for lp in e.logprobs]
    free_pieces = [lp.token for e in free for lp in e.logprobs]
    assert pieces.count("</think>") == 1
    at = pieces.index("</think>")
    # The free run's tokens up to the budget (and those finishing a character), the marker.
    assert at >= budget and pieces[:at] == free_pieces[:at]
    assert done.completion_tokens == 24 and done.stop is StopReason.MAX_TOKENS
    reasoning, answer = reasoning_and_answer(events)
    # The tag is dropped; the reasoning is what came before it, the answer follows.
    assert reasoning and answer and "</think>" not in reasoning + answer
    assert reasoning.strip() == "".join(pieces[:at]).strip()
    # A budget of 0: no reasoning at all, the whole reply is answer.
    zero_reasoning, zero_answer = reasoning_and_answer(zero)
    assert zero_reasoning == "" and zero_answer and zero_done.completion_tokens == 24


async def test_the_forced_marker_starts_the_lazy_tool_grammar_and_meets_stop_strings(
    qwen35_real_path: Path,
) -> None:
    """The lazy tool-call grammar reads nothing before ``</think>``: after the forced marker, a
    call the model opens follows the tool's schema and parses. A stop string that the marker's
    text completes ends the generation there."""
    config = engine_config(qwen35_real_path, max_inflight=1, ctx_size=1024, threads=1)
    bias = (*NO_MARKERS, (CALL_OPEN, 15.0))
    call = GenerateRequest.user(
        "Weather in Paris?", tools=(WEATHER,), reasoning_budget=3, max_tokens=120, logit_bias=bias
    )
    stop = GenerateRequest.user(
        "Hi", reasoning_budget=2, max_tokens=20, logit_bias=NO_MARKERS, stop=("</think>",)
    )
    async with Engine.open(config) as engine:
        events, _ = await events_of(engine, call)
        stopped, stop_done = await events_of(engine, stop)
    reasoning, answer = reasoning_and_answer(events)
    assert reasoning and "<tool_call>" in answer
    stream = ToolCallStream((WEATHER,))
    parsed = [e for t in events if not t.reasoning for e in stream.feed(t.text)]
    parsed += stream.finish()
    starts = [e for e in parsed if isinstance(e, ToolCallStart)]
    assert [s.name for s in starts] == ["get_weather"]
    arguments = json.loads("".join(e.text for e in parsed if isinstance(e, ToolCallArguments)))
    assert set(arguments) == {"city", "days"}
    assert stop_done.stop is StopReason.STOP_STRING and stop_done.completion_tokens >= 3
    assert reasoning_and_answer(stopped)[1] == ""
