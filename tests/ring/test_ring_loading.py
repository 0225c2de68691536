"""One load at a time across the ring (models on demand): while every link listing a model
states it ``unloaded``, the ring assigns its parked streams to the one claimant whose worker
states the most free budget (``Heartbeat.free_bytes``) and holds the others' claims for it
until that load ends. The core's tests use no trio, no sockets and no model.
"""

from __future__ import annotations

import math
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from llmtrio.api import CHAT_PATH
from llmtrio.ring import (
    Attach,
    Claim,
    Heartbeat,
    ResponseEnd,
    ResponseError,
    ResponseHead,
    RingCore,
    StreamState,
    encode,
)

from .._helpers import HEAD, wait_until
from .._procs import Ring
from ..worker.test_models_on_demand import QWEN35, chat
from ..worker.test_multi_model import wait_models
from .test_ring_protocol import decode_all, frame
from .test_ring_routing import assigned, park

GIB = 1 << 30


def beat(state: str, free: int = 0) -> Heartbeat:
    return Heartbeat(0, 64, 64, model_state=state, free_bytes=free)


def on_demand(*workers: tuple[str, int], model: str = "m") -> RingCore:
    """A core with one link per worker for ``model``, each stating it unloaded with ``free``
    bytes of budget, each claiming 64 streams (as an unloaded link does)."""
    core = RingCore(max_streams=1000)
    for worker_id, free in workers:
        core.attach(Attach(worker_id, 64, models=(model,)))
        core.heartbeat(worker_id, beat("unloaded", free))
        assert core.claim(worker_id, Claim(64, model=model)) == []
    return core


def test_free_bytes_is_an_optional_heartbeat_field() -> None:
    old = frame(2, {"inflight": 0, "max_inflight": 2, "available_slots": 2})
    (read,) = decode_all(old)
    assert read.free_bytes == 0  # an older worker states none
    assert b"free_bytes" not in encode(Heartbeat(0, 2, 2, model_state="unloaded"))
    assert decode_all(encode(beat("unloaded", -1))) == [beat("unloaded", -1)]


def test_the_worker_with_the_most_free_budget_alone_loads() -> None:
    core = on_demand(("small", 1 * GIB), ("big", 3 * GIB), ("mid", 2 * GIB))
    got = [park(core, "m")[1] for _ in range(16)]
    # All 16 first requests join the one load the first of them asked "big" for.
    assert got == [[("big", stream_id)] for stream_id in range(1, 17)]


def test_no_bound_beats_any_free_budget_and_ties_go_by_turn() -> None:
    core = on_demand(("a", 5 * GIB), ("b", -1))
    assert park(core, "m")[1] == [("b", 1)]
    core = on_demand(("a", GIB), ("b", GIB))
    assert park(core, "m")[1] == [("a", 1)]


def test_a_loaded_link_holds_the_unloaded_links_claims() -> None:
    core = on_demand(("a", GIB), ("b", 2 * GIB))
    first, _ = park(core, "m")
    core.heartbeat("b", beat("loading", 2 * GIB))
    core.respond("b", ResponseHead(first, 200))
    core.respond("b", ResponseEnd(first))
    assert core.heartbeat("b", beat("loaded", GIB)) == []
    core.withdraw("b", 63, "m")  # b's slots are busy: it claims nothing
    late, effects = park(core, "m")
    assert effects == [] and core.state(late) is StreamState.PARKED  # a does not load it too
    # b unloads: every link is cold again, and a (now the most free) loads the parked one.
    assert assigned(core.heartbeat("b", beat("unloaded", GIB // 2))) == [("a", late)]


def test_a_failed_load_lets_the_held_claims_be_weighed_again() -> None:
    core = on_demand(("a", GIB), ("b", 2 * GIB))
    first, _ = park(core, "m")
    second, _ = park(core, "m")
    core.heartbeat("b", beat("loading", 2 * GIB))
    core.withdraw("b", 62, "m")  # b claims no more (say it is past LOAD_WAITERS)
    third, effects = park(core, "m")
    assert effects == []
    # b's load fails: it answers what it holds, then states unloaded with less budget free.
    core.respond("b", ResponseError(first, "load failed"))
    core.heartbeat("b", beat("unloaded", 0))
    effects = core.respond("b", ResponseError(second, "load failed"))
    assert assigned(effects) == [("a", third)]


def test_the_next_load_after_a_failed_one_goes_to_another_worker() -> None:
    """A worker whose load failed is asked again only once every other cold claimant has
    failed too (the oldest failure first), however much budget it states free."""
    core = on_demand(("a", GIB), ("b", 2 * GIB))

    def fails(worker: str, stream_id: int) -> None:
        core.respond(worker, ResponseHead(stream_id, 503))  # model_load_failed, answered
        core.respond(worker, ResponseEnd(stream_id))

    first, effects = park(core, "m")
    assert effects == [("b", first)]  # b states the most free budget
    fails("b", first)
    assert core.heartbeat("b", beat("unloaded", 2 * GIB)) == []
    second, effects = park(core, "m")
    assert effects == [("a", second)]  # though b still states more
    fails("a", second)
    third, effects = park(core, "m")
    assert effects == [("b", third)]  # both failed: the older failure goes first
    core.heartbeat("b", beat("loaded", GIB))  # b loads it: its failure is forgotten
    core.respond("b", ResponseHead(third, 200))
    core.respond("b", ResponseEnd(third))
    core.withdraw("b", 64, "m")
    core.heartbeat("b", beat("unloaded", 2 * GIB))  # idle, unloaded again
    assert core.claim("b", Claim(64, model="m")) == []
    fourth, effects = park(core, "m")
    assert effects == [("b", fourth)]  # a failed last: b, with the most free, again


def test_a_detached_loader_hands_its_requests_to_the_next() -> None:
    core = on_demand(("a", GIB), ("b", 2 * GIB))
    ids = [park(core, "m")[0] for _ in range(3)]
    assert sorted(assigned(core.detach("b", "gone"))) == [("a", sid) for sid in ids]


def test_a_link_stating_no_model_state_is_never_held() -> None:
    """A worker of the previous version (or one loaded at start) states no model state: it is
    served as before, and the unloaded links beside it wait for it."""
    core = on_demand(("cold", GIB))
    core.attach(Attach("old", 4, models=("m",)))
    core.heartbeat("old", Heartbeat(0, 4, 4))
    assert core.claim("old", Claim(1, model="m")) == []
    assert park(core, "m")[1] == [("old", 1)]
    sid, effects = park(core, "m")
    assert effects == [] and core.state(sid) is StreamState.PARKED


WORKERS = {"a": 1 * GIB, "b": 3 * GIB, "c": -1}
MODELS = ("m", "n")
EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("park"), st.sampled_from(MODELS)),
        st.tuples(st.just("claim"), st.sampled_from(sorted(WORKERS)), st.sampled_from(MODELS)),
        st.tuples(st.just("loaded"), st.sampled_from(sorted(WORKERS)), st.sampled_from(MODELS)),
        st.tuples(st.just("answer"), st.sampled_from(sorted(WORKERS)), st.sampled_from(MODELS)),
        st.tuples(st.just("fail"), st.sampled_from(sorted(WORKERS)), st.sampled_from(MODELS)),
        st.tuples(st.just("crash"), st.sampled_from(sorted(WORKERS)), st.sampled_from(MODELS)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(EVENTS)
def test_one_link_per_model_loads_and_nothing_is_lost(events: list[tuple[str, ...]]) -> None:
    """Workers that behave as on-demand links (a link states its model unloaded until it is
    assigned a stream, loading then, loaded when done; it unloads once idle or when its load
    fails): per model at most one link is ever loading or loaded; no stream stays parked
    while a claim that may take it waits; every stream is answered or still tracked; a load
    goes to a link that has not failed to load the model unless every cold one waiting has
    (then to the oldest failure), and among those to the most free budget."""
    core = RingCore(max_streams=1000, max_assignments=1000)
    state: dict[tuple[str, str], str] = {}
    failed: dict[tuple[str, str], int] = {}  # the order of each link's last failed load
    failures = 0
    keys: dict[int, str] = {}
    ended: set[int] = set()

    def link(worker: str, model: str) -> str:
        return f"{worker}/{model}"

    def attach(worker: str, model: str) -> None:
        core.attach(Attach(link(worker, model), 64, models=(model,)))
        state[worker, model] = "unloaded"
        assert core.heartbeat(link(worker, model), beat("unloaded", WORKERS[worker])) == []
        check(core.claim(link(worker, model), Claim(4, model=model)))  # a few to start

    def held(worker: str, model: str) -> list[int]:
        return list(core.held(link(worker, model)))

    def claims(worker: str, model: str) -> int:
        """The link's unfilled claims (none while it is detached)."""
        found = [w for w in core.stats().workers if w.worker_id == link(worker, model)]
        return sum(w.waiting_claims for w in found)

    def rank(worker: str, model: str) -> tuple[float, float]:
        free = WORKERS[worker]
        return (failed.get((worker, model), 0), -math.inf if free < 0 else -free)

    def check(effects: list[object]) -> None:
        for link_id, stream_id in assigned(effects):
            worker, model = link_id.split("/")
            assert keys[stream_id] == model
            if state[worker, model] == "unloaded":  # asked to load it
                waiting = [
                    w
                    for w in WORKERS
                    if w != worker
                    and state[w, model] == "unloaded"
                    and not held(w, model)
                    and claims(w, model)
                ]
                best = min([rank(w, model) for w in waiting], default=rank(worker, model))
                assert rank(worker, model) <= best, (worker, model, failed)
                state[worker, model] = "loading"
                core.heartbeat(link_id, beat("loading", WORKERS[worker]))

    for worker in WORKERS:
        for model in MODELS:
            attach(worker, model)
    for event in events:
        kind, *rest = event
        if kind == "park":
            stream_id, effects = core.park(HEAD, key=rest[0])
            keys[stream_id] = rest[0]
            check(effects)
            continue
        worker, model = rest
        me = link(worker, model)
        stats = {w.worker_id: w for w in core.stats().workers}[me]
        if kind == "claim" and stats.waiting_claims + len(stats.held) < 64:
            check(core.claim(me, Claim(1, model=model)))
        elif kind == "loaded" and state[worker, model] == "loading":
            state[worker, model] = "loaded"
            failed.pop((worker, model), None)
            check(core.heartbeat(me, beat("loaded", WORKERS[worker])))
        elif held(worker, model) and (kind, state[worker, model]) in (
            ("answer", "loaded"),
            ("fail", "loading"),
        ):
            for stream_id in held(worker, model) if kind == "fail" else held(worker, model)[:1]:
                if kind == "fail":
                    check(core.respond(me, ResponseError(stream_id, "load failed")))
                else:
                    core.respond(me, ResponseHead(stream_id, 200))
                    check(core.respond(me, ResponseEnd(stream_id)))
                ended.add(stream_id)
            if not held(worker, model):  # idle (or failed): it unloads
                if kind == "fail":
                    failures += 1
                    failed[worker, model] = failures
                state[worker, model] = "unloaded"
                check(core.heartbeat(me, beat("unloaded", WORKERS[worker])))
        elif kind == "crash":
            effects = core.detach(me, "crashed")
            state[worker, model] = "unloaded"
            failed.pop((worker, model), None)
            check(effects)
            attach(worker, model)
        for model in MODELS:
            active = [w for w in WORKERS if state[w, model] != "unloaded"]
            assert len(active) <= 1, (model, active)
            parked = [s for s in keys if keys[s] == model and core.state(s) is StreamState.PARKED]
            waiting = {
                stats.worker_id.split("/")[0]
                for stats in core.stats().workers
                if stats.models == (model,) and stats.waiting_claims
            }
            if parked:
                # Parked streams wait only on claims the ring holds: the active link has none,
                # and without one no link has any.
                assert not (waiting & set(active)) and (active or not waiting), (parked, waiting)
    for stream_id in keys:
        assert stream_id in ended or core.state(stream_id) is not None


def test_sixteen_first_requests_load_the_model_once_across_two_workers(
    tmp_path: Path, gemma_path: Path
) -> None:
    """Real processes: two ``llmtrio worker``s list the same unloaded model, one ingress; 16
    concurrent first requests cause one load, on the worker with the larger budget free."""
    models = tmp_path / "models.toml"
    models.write_text(
        f'[models.qwen]\nsource = "{QWEN35}"\nthreads = 1\nmax_inflight = 2\nctx_size = 256\n'
    )
    with Ring.opened(tmp_path, gemma_path) as ring:
        ingress = ring.ingress("ingress")
        workers = {
            worker: ring.spawn(
                worker,
                "worker",
                f"--ingress-url={ingress.control}",
                f"--tls-cert={ring.certificate(worker)}",
                f"--ca={tmp_path / 'ingress-ca.pem'}",
                f"--models-file={models}",
                f"--memory-budget={budget}",
                "--threads=1",
            )
            for worker, budget in (("w-small", 1500), ("w-big", 3000))
        }
        with httpx.Client(base_url=ingress.url, timeout=120) as client:
            wait_models(client, {"qwen": 2})
            wait_until(
                lambda: all(w["capacity"] is not None for w in ingress.workers()),
                lambda: f"both workers beat: {ingress.workers()}",
            )
            with ThreadPoolExecutor(16) as pool:
                answers = list(
                    pool.map(lambda _: client.post(CHAT_PATH, json=chat("qwen")), range(16))
                )
        assert [answer.status_code for answer in answers] == [200] * 16, answers[0].text
        served = {answer.headers["x-llmtrio-worker"].split("#")[0] for answer in answers}
        assert served == {"w-big"}
        loads = {
            name: len(re.findall(r"loading qwen", proc.text())) for name, proc in workers.items()
        }
        assert loads == {"w-small": 0, "w-big": 1}
