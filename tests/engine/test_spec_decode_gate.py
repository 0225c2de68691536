"""The draft gate (issue 36): steps are open to drafts only while open steps emitted more
tokens per ms than steps held from them, both kinds measured side by side. Pure: no
model."""

from __future__ import annotations

import itertools
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from llmtrio.engine.spec_decode import DraftGate


def feed(
    gate: DraftGate,
    outputs: int,
    *,
    plain_ms: float,
    drafted_tokens: int,
    steps: int,
    drafted_ms: float | None = None,
    start: float = 0.0,
) -> list[bool]:
    """Run ``steps`` steps: a held step emits ``outputs`` tokens in ``plain_ms``, an open one
    ``drafted_tokens`` in ``drafted_ms`` (default: 1.5x the plain). Returns each step's
    verdict."""
    verdicts = []
    now = start
    for _ in range(steps):
        allowed = gate.open(outputs, now)
        verdicts.append(allowed)
        if allowed:
            ms = drafted_ms if drafted_ms is not None else plain_ms * 1.5
            gate.measured(outputs, drafted_tokens, ms, opened=True, at=now)
        else:
            ms = plain_ms
            gate.measured(outputs, outputs, ms, opened=False, at=now)
        now += ms / 1000
    return verdicts


def test_the_held_rate_is_measured_before_any_step_opens() -> None:
    gate = DraftGate(least=6)
    verdicts = feed(gate, 8, plain_ms=60, drafted_tokens=16, steps=6)
    assert verdicts == [False] * 6
    assert gate.held == 6


def test_open_steps_that_pay_stay_open_but_one_in_hold_every_is_held() -> None:
    gate = DraftGate(least=6, hold_every=8, sure=0.25)
    # 14 tokens in 90 ms against 8 in 60: drafting pays (by 17%).
    verdicts = feed(gate, 8, plain_ms=60, drafted_tokens=14, steps=6 + 6 + 80)
    settled = verdicts[12:]
    assert settled.count(False) == len(settled) // 8
    # Never two held steps running while opening pays.
    assert not any(a is False and b is False for a, b in itertools.pairwise(settled))


def test_a_lead_past_sure_measures_the_held_rate_four_times_less_often() -> None:
    gate = DraftGate(least=6, hold_every=8, sure=0.25)
    # 24 tokens in 90 ms against 8 in 60: drafting runs 2x.
    verdicts = feed(gate, 8, plain_ms=60, drafted_tokens=24, steps=6 + 6 + 320)
    settled = verdicts[12:]
    assert settled.count(False) == len(settled) // 32


def test_open_steps_that_lose_are_held_but_probed_one_in_probe_every() -> None:
    gate = DraftGate(least=6, probe_every=16)
    # 9 tokens in 90 ms against 8 in 60: drafting loses.
    verdicts = feed(gate, 8, plain_ms=60, drafted_tokens=9, steps=6 + 6 + 160)
    settled = verdicts[12:]
    assert settled.count(True) == len(settled) // 16
    held, opened = gate.rates(8, 10.0)
    assert held is not None and opened is not None and opened < held


def test_each_count_of_sequences_is_judged_on_its_own() -> None:
    gate = DraftGate(least=2, probe_every=1000, hold_every=1000)
    feed(gate, 8, plain_ms=60, drafted_tokens=9, steps=40)  # loses at eight
    feed(gate, 1, plain_ms=17, drafted_tokens=5, drafted_ms=30, steps=40)  # pays at one
    assert not gate.open(8, 1.0)
    assert gate.open(1, 1.0)


def test_a_change_in_what_drafts_earn_turns_the_gate() -> None:
    gate = DraftGate(least=6, window=24, probe_every=4)
    feed(gate, 8, plain_ms=60, drafted_tokens=9, steps=200)
    assert not gate.open(8, 100.0)
    # The text became one the drafts copy: the probes see it, and drafts pass again.
    verdicts = feed(gate, 8, plain_ms=60, drafted_tokens=24, steps=200, start=200.0)
    assert verdicts[-20:].count(True) >= 17


def test_steps_older_than_max_age_are_forgotten() -> None:
    gate = DraftGate(least=6, max_age_s=60)
    feed(gate, 8, plain_ms=60, drafted_tokens=16, steps=40)
    assert gate.open(8, 10.0) or gate.open(8, 10.0)
    # After an hour idle, the held rate is measured again before a step opens.
    assert [gate.open(8, 3600.0 + i) for i in range(3)] == [False] * 3
    assert gate.rates(8, 3600.0) == (None, None)


@settings(max_examples=60, deadline=None)
@given(
    gain=st.floats(min_value=0.5, max_value=2.0),
    noise=st.floats(min_value=0.0, max_value=0.3),
    seed=st.integers(0, 2**32 - 1),
)
def test_throughput_is_at_least_the_better_kind_less_the_measuring(
    gain: float, noise: float, seed: int
) -> None:
    """Steps whose times scatter by up to ``noise`` either way: over a long run the tokens
    per ms realized are at least the better kind's, less what measuring the other costs
    (one step in ``probe_every`` or ``hold_every`` of the difference) and, where the two are
    within 3% of each other, what noise misjudging them costs (at most the difference), and
    1% for the noise in the realized rate itself (3000 steps' jitter)."""
    rng = random.Random(seed)
    gate = DraftGate()
    plain_ms, outputs = 60.0, 8
    drafted_ms = 90.0
    drafted_tokens = outputs * gain * drafted_ms / plain_ms  # ``gain`` x the plain rate
    tokens = ms = 0.0
    now = 0.0
    for _ in range(3000):
        jitter = 1.0 + rng.uniform(-noise, noise)
        if gate.open(outputs, now):
            step, emitted = drafted_ms * jitter, drafted_tokens
            gate.measured(outputs, round(emitted), step, opened=True, at=now)
        else:
            step, emitted = plain_ms * jitter, outputs
            gate.measured(outputs, outputs, step, opened=False, at=now)
        tokens += emitted
        ms += step
        now += step / 1000
    realized = (tokens / ms) / (outputs / plain_ms)  # against always plain
    best = max(1.0, gain)
    exploring = 1 / gate.probe_every if gain < 1 else 1 / gate.hold_every
    assert realized >= best - abs(gain - 1) * exploring - min(abs(gain - 1), 0.03) - 0.01
