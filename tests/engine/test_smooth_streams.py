"""Smooth streams (issue 48): ``prefill_share`` bounds what prompts add to a running
stream's step, and prompts ingested while no stream runs start their streams together.
The policy is fed made-up step times; the core's test drives the real model."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from llmtrio.engine import EngineConfig
from llmtrio.engine.generate._core import EngineCore
from llmtrio.engine.generate._scheduler import Prefill, Scheduler, Start
from llmtrio.engine.llama import LlamaModel

from .._core_helpers import core_request, open_core


def test_beside_decoding_a_step_carries_what_the_share_allows() -> None:
    s = Scheduler(max_inflight=4, prefill_chunk=256, prefill_share=1.0)
    s.add(0, 10)
    assert s.schedule().prefill == (Prefill(0, 0, 10),)  # alone: the whole prompt
    s.measured(50, decode_only=False, prompt_tokens=10)  # 5 ms a prompt token
    assert s.schedule().decode == (0,)
    s.measured(100, decode_only=True)  # a decode step: 100 ms
    s.add(1, 200)
    plan = s.schedule()
    # One decode step's worth of prompt tokens (100 ms / 5 ms), not the whole chunk.
    assert plan.decode == (0,) and plan.prefill == (Prefill(1, 0, 20),)
    assert s.prompt_budget(1) == 20
    assert s.prompt_budget(0) == 256  # nothing decodes: nothing to protect


def test_prompts_outnumbering_the_streams_get_more() -> None:
    s = Scheduler(max_inflight=8, prefill_chunk=256, prefill_share=1.0)
    s.add(0, 10)
    s.schedule()
    s.measured(50, decode_only=False, prompt_tokens=10)  # 5 ms a prompt token
    s.schedule()
    s.measured(20, decode_only=True)  # one stream: 20 ms a step
    for key in range(1, 5):
        s.add(key, 100)
    plan = s.schedule()
    # Four prompts beside one stream: 4 x 20 ms of prompt tokens, not 20 ms.
    assert sum(p.count for p in plan.prefill) == 16
    assert s.prompt_budget(1, 4) == 16 and s.prompt_budget(2, 1) == 4


def test_the_price_of_a_prompt_token_follows_the_measured_steps() -> None:
    s = Scheduler(max_inflight=4, prefill_chunk=256, prefill_share=2.0)
    s.add(0, 4)
    s.schedule()
    s.measured(40, decode_only=False, prompt_tokens=4)  # 10 ms a token
    s.schedule()
    s.measured(50, decode_only=True)
    s.add(1, 500)
    s.schedule()
    assert s.prompt_budget(1) == 10  # 2 x 50 ms / 10 ms
    # A step with 10 prompt tokens beside decoding took 50 + 10 x 30 ms: the price moves,
    # the recent step weighing most.
    s.measured(350, decode_only=False, prompt_tokens=10)
    price = (0.75 * 40 + 300) / (0.75 * 4 + 10)
    assert s.token_ms == pytest.approx(price)
    assert s.prompt_budget(1) == int(2 * 50 / price)


def test_a_slow_step_with_one_prompt_token_does_not_starve_the_prompts() -> None:
    s = Scheduler(max_inflight=4, prefill_chunk=256, prefill_share=1.0)
    s.add(0, 4)
    s.schedule()
    s.measured(400, decode_only=False, prompt_tokens=200)  # 2 ms a token
    s.schedule()
    s.measured(100, decode_only=True)
    s.add(1, 500)
    assert s.schedule().prefill == (Prefill(1, 0, 50),)
    # One prompt token in a step that another process slowed by 300 ms: priced by every
    # token measured, it leaves the budget a few tokens smaller, not one token a step
    # (which every later step would price the same way: a crawl that never ends).
    s.measured(100 + 300, decode_only=False, prompt_tokens=1)
    assert s.prompt_budget(1) >= 20
    s.measured(100 + 2 * 20, decode_only=False, prompt_tokens=20)
    assert s.prompt_budget(1) >= 25  # and it grows back as steps go as before


def test_a_prompt_token_is_priced_beside_a_decode_step_of_as_many_sequences() -> None:
    s = Scheduler(max_inflight=8, prefill_chunk=256, prefill_share=1.0)
    s.add(0, 4)
    s.schedule()
    s.measured(40, decode_only=False, prompt_tokens=4)  # 10 ms a token, nothing decoding
    s.schedule()
    s.measured(50, decode_only=True)  # one sequence: 50 ms
    for key in range(1, 4):
        s.add(key, 4)
    s.schedule()
    s.measured(70, decode_only=False, prompt_tokens=12)
    s.schedule()
    s.measured(200, decode_only=True)  # four sequences: 200 ms
    s.add(4, 500)
    plan = s.schedule()
    assert plan.decode == (0, 1, 2, 3)
    # The step of one decoding sequence was not the base for the mixed one (its 20 ms
    # beyond 50 ms are the prompt's; a decode step of one does not price those of four).
    assert s.token_ms == pytest.approx((0.75 * 40 + 20) / (0.75 * 4 + 12))
    # Four sequences: the budget is one decode step of four (200 ms) of prompt tokens.
    assert sum(p.count for p in plan.prefill) == int(200 / s.token_ms)
    s.measured(200 + 10 * 60, decode_only=False, prompt_tokens=60)
    assert s.token_ms == pytest.approx((0.75 * (0.75 * 40 + 20) + 600) / (0.75 * 15 + 60))


def test_a_decode_step_of_other_sequences_does_not_price_a_prompt_token() -> None:
    s = Scheduler(max_inflight=8, prefill_chunk=256, prefill_share=1.0)
    for key in range(3):
        s.add(key, 4)
    s.schedule()
    s.measured(120, decode_only=False, prompt_tokens=12)  # nothing decoding: 10 ms a token
    assert s.schedule().decode == (0, 1, 2)
    s.measured(150, decode_only=True)  # three sequences: 150 ms
    s.remove(2)
    s.add(3, 10)
    plan = s.schedule()
    assert plan.decode == (0, 1)
    assert plan.prefill == (Prefill(3, 0, 10),)
    # Two sequences decoding beside 10 prompt tokens: no decode step of two was measured,
    # and the one of three (150 ms) would leave the prompt 5 ms a token where it took more.
    # The step does not price the tokens (what the AIPerf run's crawl came from).
    s.measured(200, decode_only=False, prompt_tokens=10)
    assert s.token_ms == pytest.approx(10.0)


def test_a_prompt_is_never_starved() -> None:
    s = Scheduler(max_inflight=2, prefill_chunk=64, prefill_share=0.0)
    s.add(0, 1)
    s.schedule()
    s.measured(10, decode_only=False, prompt_tokens=1)
    s.schedule()
    s.measured(10, decode_only=True)
    s.add(1, 3)
    counts = [s.schedule().prefill for _ in range(3)]
    assert counts == [(Prefill(1, 0, 1),), (Prefill(1, 1, 1),), (Prefill(1, 2, 1),)]
    assert s.schedule().decode == (0, 1)


def test_before_any_measurement_a_step_carries_a_chunk() -> None:
    s = Scheduler(max_inflight=2, prefill_chunk=64, prefill_share=0.5)
    assert s.prompt_budget(3) == 64


def test_prompts_ingested_together_start_together() -> None:
    s = Scheduler(max_inflight=4, prefill_chunk=64, prefill_share=4.0)
    for key, length in enumerate((30, 100, 50)):
        s.add(key, length)
    plans = []
    while not (plan := s.schedule()).decode:
        plans.append(plan)
    # No prompt reaches its end before the others: each holds its last token back, then
    # all end in one step, and the next step decodes all three.
    ends = {p.key: p.start + p.count for plan in plans for p in plan.prefill}
    assert ends == {0: 30, 1: 100, 2: 50}
    last = plans[-1].prefill
    assert {p.key for p in last if p.start + p.count == (30, 100, 50)[p.key]} == {0, 1, 2}
    assert all(
        p.start + p.count < (30, 100, 50)[p.key] for plan in plans[:-1] for p in plan.prefill
    )
    assert sum(p.count for plan in plans for p in plan.prefill) == 180
    assert plan.decode == (0, 1, 2)


def test_prompts_first_starts_each_prompt_as_soon_as_it_is_in() -> None:
    s = Scheduler(max_inflight=4, prefill_chunk=64, prefill_share=math.inf)
    s.add(0, 30)
    s.add(1, 100)
    assert s.schedule().prefill == (Prefill(0, 0, 30), Prefill(1, 0, 34))
    plan = s.schedule()
    assert plan.decode == (0,) and plan.prefill == (Prefill(1, 34, 64),)


def test_a_wave_longer_than_a_chunk_a_slot_is_not_held() -> None:
    s = Scheduler(max_inflight=2, prefill_chunk=10, prefill_share=4.0)
    s.add(0, 8)
    s.add(1, 30)  # 38 tokens > 2 slots x 10: the first starts as soon as it is in
    assert s.schedule().prefill == (Prefill(0, 0, 8), Prefill(1, 0, 2))
    assert s.schedule().decode == (0,)


def test_a_wave_of_last_tokens_wider_than_the_budget_goes_on() -> None:
    s = Scheduler(max_inflight=4, prefill_chunk=2, prefill_share=4.0)
    for key in range(3):
        s.add(key, 1)
    # Three last tokens, two a step: holding them all would never end.
    assert s.schedule().prefill == (Prefill(0, 0, 1), Prefill(1, 0, 1))
    plan = s.schedule()
    assert plan.decode == (0, 1) and plan.prefill == (Prefill(2, 0, 1),)


def test_a_wave_never_splits_an_image() -> None:
    s = Scheduler(max_inflight=2, prefill_chunk=8, prefill_share=4.0)
    s.add(0, 12)
    s.add(1, 4)
    spans = {0: Start(spans=((2, 12),)), 1: Start()}  # an image that ends its prompt
    plans = [s.schedule(lambda key: spans[key]) for _ in range(3)]
    ingested = [p for plan in plans for p in plan.prefill]
    assert Prefill(0, 0, 2) in ingested
    assert Prefill(0, 2, 10) in ingested  # whole, in a chunk of its own, never held back
    assert sum(p.count for p in ingested) == 16


def test_the_config_checks_the_share() -> None:
    assert EngineConfig(prefill_share=math.inf).prefill_share == math.inf
    for bad in (-1.0, math.nan):
        with pytest.raises(ValueError, match="prefill_share"):
            EngineConfig(prefill_share=bad)


def first_token_steps(core: EngineCore, prompts: list[list[int]]) -> dict[int, int]:
    """Add ``prompts`` (keys 0, 1, ...), step until each is released; the step each got its
    first token in."""
    for key, prompt in enumerate(prompts):
        core.add(core_request(key, prompt, 3))
    firsts: dict[int, int] = {}
    released = 0
    for step in range(100):
        for output in core.step():
            if output.tokens and output.key not in firsts:
                firsts[output.key] = step
            released += output.released
        if released == len(prompts):
            return firsts
    raise AssertionError("not finished")


def test_the_core_gives_prompts_sent_together_their_first_tokens_in_one_step(
    qwen35_path: Path,
) -> None:
    prompts = [list(range(10, 10 + n)) for n in (12, 20, 14)]  # 46 tokens: 3 chunks of 16
    model = LlamaModel(qwen35_path, slots=3, ctx_size=256, threads=1, n_batch=64)
    try:
        smooth, _ = open_core(model, prefill_chunk=16, prefill_share=4.0, spec=None)
        firsts = first_token_steps(smooth, prompts)
        assert len(set(firsts.values())) == 1  # one step gave all three their first token
        eager, _ = open_core(
            model, prefill_chunk=16, prefill_share=math.inf, spec=None, prompt_cache=False
        )
        firsts = first_token_steps(eager, prompts)
        assert firsts[0] < firsts[1] < firsts[2]  # each as soon as it was in
    finally:
        model.close()
