"""The admission and chunking policy, fed with made-up step times."""

from __future__ import annotations

from llmtrio.engine.generate._scheduler import Prefill, Scheduler


def test_admits_up_to_max_inflight_in_arrival_order() -> None:
    s = Scheduler(max_inflight=2, prefill_chunk=1000)
    for key in range(3):
        s.add(key, 10)
    plan = s.schedule()
    assert plan.admitted == (0, 1)
    assert plan.prefill == (Prefill(0, 0, 10), Prefill(1, 0, 10))
    assert s.waiting == 1
    plan = s.schedule()
    assert plan.decode == (0, 1) and plan.prefill == () and plan.admitted == ()
    s.remove(0)
    plan = s.schedule()
    assert plan.admitted == (2,)
    assert plan.decode == (1,)
    assert plan.prefill == (Prefill(2, 0, 10),)


def test_prefill_is_chunked_and_interleaved_with_decoding() -> None:
    s = Scheduler(max_inflight=4, prefill_chunk=64)
    s.add(0, 5)
    s.schedule()
    s.add(1, 150)
    chunks = []
    for _ in range(3):
        plan = s.schedule()
        assert plan.decode[0] == 0  # the running sequence decodes every step
        chunks.append(plan.prefill)
    assert chunks == [(Prefill(1, 0, 64),), (Prefill(1, 64, 64),), (Prefill(1, 128, 22),)]
    assert s.schedule().decode == (0, 1)


def test_prefill_budget_is_shared_oldest_first() -> None:
    s = Scheduler(max_inflight=4, prefill_chunk=100)
    s.add(0, 80)
    s.add(1, 80)
    assert s.schedule().prefill == (Prefill(0, 0, 80), Prefill(1, 0, 20))
    assert s.schedule().prefill == (Prefill(1, 20, 60),)


def test_removing_a_waiting_request() -> None:
    s = Scheduler(max_inflight=1, prefill_chunk=10)
    s.add(0, 1)
    s.add(1, 1)
    s.schedule()
    s.remove(1)
    assert s.waiting == 0
    s.remove(0)
    assert s.running == 0 and s.schedule().empty


def test_target_step_ms_pauses_admission_while_over_target() -> None:
    s = Scheduler(max_inflight=8, prefill_chunk=100, target_step_ms=50)
    for key in range(8):
        s.add(key, 10)
    assert s.schedule().admitted == (0,)  # one at a time
    s.measured(30, decode_only=False)
    assert s.schedule().admitted == ()  # no decode step measured with key 0 in it yet
    s.measured(30, decode_only=True)
    assert s.schedule().admitted == (1,)
    assert s.schedule().admitted == ()  # not measured with key 1 yet
    s.measured(45, decode_only=True)
    assert s.schedule().admitted == (2,)
    s.measured(60, decode_only=True)  # over target: no admission
    for _ in range(5):
        assert s.schedule().admitted == ()
    assert s.running == 3
    s.measured(45, decode_only=True)
    assert s.schedule().admitted == (3,)


def test_target_step_ms_ignores_steps_with_prefill() -> None:
    s = Scheduler(max_inflight=8, prefill_chunk=100, target_step_ms=50)
    s.add(0, 10)
    s.add(1, 10)
    s.schedule()
    s.measured(500, decode_only=False)  # a prefill-heavy step does not count
    s.measured(20, decode_only=True)
    assert s.schedule().admitted == (1,)


def test_target_step_admits_when_nothing_runs_even_if_last_measure_was_slow() -> None:
    s = Scheduler(max_inflight=8, prefill_chunk=100, target_step_ms=10)
    s.add(0, 10)
    s.schedule()
    s.measured(99, decode_only=True)
    s.remove(0)
    s.add(1, 10)
    assert s.schedule().admitted == (1,)
