"""Routing by model in the ring's sans-IO core: a stream parks under its routing key (the
request's model) and only a claim for that model takes it; a claim without a model (a worker
of the previous version) takes any model its worker listed. The core's tests use no trio and no
sockets; the last few run the in-process ``Ring`` on a fake clock.
"""

from __future__ import annotations

import json
import struct

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from llmtrio.ring import (
    Assign,
    Attach,
    Claim,
    ParkTimeoutError,
    ProtocolError,
    ResponseEnd,
    ResponseHead,
    Ring,
    RingCore,
    StreamState,
    ToClient,
    ToWorker,
    Withdraw,
    encode,
)

from .._helpers import HEAD
from .test_ring_protocol import decode_all


def assigned(effects: list[object]) -> list[tuple[str, int]]:
    return [
        (effect.worker_id, effect.message.stream_id)
        for effect in effects
        if isinstance(effect, ToWorker) and isinstance(effect.message, Assign)
    ]


def park(core: RingCore, key: str) -> tuple[int, list[tuple[str, int]]]:
    stream_id, effects = core.park(HEAD, key.encode(), key=key)
    return stream_id, assigned(effects)


# -- the wire: optional fields only -------------------------------------------------------------


def test_claim_and_withdraw_carry_an_optional_model() -> None:
    for message in (Claim(2, model="gemma"), Withdraw(1, model="qwen"), Claim(3), Withdraw(2)):
        assert decode_all(encode(message)) == [message]
    # Without a model the frame is byte for byte what a worker of the previous version writes.
    assert b"model" not in encode(Claim(2)) and b"model" not in encode(Withdraw(1))
    with pytest.raises(ValueError, match="must not be empty"):
        Claim(1, model="")


def test_attach_carries_kinds_only_when_a_model_is_not_chat() -> None:
    chat = Attach("w", 2, models=("a", "b"), kinds=("chat", "chat"))
    assert b"kinds" not in encode(chat)
    mixed = Attach("w", 2, models=("a", "e"), kinds=("chat", "embedding"))
    assert decode_all(encode(mixed)) == [mixed]
    assert (mixed.kind("a"), mixed.kind("e"), Attach("w", 1, models=("x",)).kind("x")) == (
        "chat",
        "embedding",
        "chat",
    )
    with pytest.raises(ValueError, match="one kind per model"):
        Attach("w", 1, models=("a", "b"), kinds=("chat",))
    with pytest.raises(ValueError, match="kind is a name"):
        Attach("w", 1, models=("a",), kinds=("",))


def test_a_reranking_models_kind_crosses_the_wire_and_a_newer_kind_is_kept() -> None:
    """``rerank`` is a kind of its own on the wire; a kind this version does not know (a newer
    worker's) is kept as it is rather than refusing the worker: its model is listed with it,
    and only the routes of any kind reach it (``llmtrio.web``'s resolution)."""
    ranker = Attach("w", 2, models=("r", "c"), kinds=("rerank", "chat"))
    assert json.loads(encode(ranker)[9:])["kinds"] == ["rerank", "chat"]
    assert decode_all(encode(ranker)) == [ranker]
    newer = Attach("w", 1, models=("x",), kinds=("audio",))
    assert decode_all(encode(newer)) == [newer]
    core = RingCore(4)
    core.attach(newer)
    assert core.models()["x"].kind == "audio"


def test_attach_carries_the_models_that_take_images_only_when_some_do() -> None:
    assert b"vision" not in encode(Attach("w", 1, models=("a",)))
    seeing = Attach("w", 2, models=("a", "b"), vision=("b",))
    assert decode_all(encode(seeing)) == [seeing]
    core = RingCore(max_streams=4)
    core.attach(seeing)
    assert {name: m.vision for name, m in core.models().items()} == {"a": False, "b": True}


def test_attach_carries_the_context_lengths_the_least_of_which_the_ring_states() -> None:
    assert b"contexts" not in encode(Attach("w", 1, models=("a",)))
    assert b"contexts" not in encode(Attach("w", 1, models=("a",), contexts=(0,)))
    stated = Attach("w", 2, models=("a", "b"), contexts=(4096, 0))
    assert decode_all(encode(stated)) == [stated]
    assert (stated.context("a"), stated.context("b"), stated.context("x")) == (4096, 0, 0)
    core = RingCore(max_streams=4)
    core.attach(stated)
    core.attach(Attach("v", 1, models=("a",), contexts=(2048,)))
    core.attach(Attach("old", 1, models=("a", "b")))  # the previous version states none
    lengths = {name: m.context_length for name, m in core.models().items()}
    assert lengths == {"a": 2048, "b": 0}
    with pytest.raises(ValueError, match="one length per model"):
        Attach("w", 1, models=("a", "b"), contexts=(1,))
    with pytest.raises(ValueError, match="0 or more"):
        Attach("w", 1, models=("a",), contexts=(-1,))


def test_attach_carries_the_models_that_take_audio_only_when_some_do() -> None:
    assert b"audio" not in encode(Attach("w", 1, models=("a",), vision=("a",)))
    hearing = Attach("w", 2, models=("a", "b"), vision=("b",), audio=("a", "b"))
    assert decode_all(encode(hearing)) == [hearing]
    core = RingCore(max_streams=4)
    core.attach(hearing)
    taken = {name: (m.vision, m.audio) for name, m in core.models().items()}
    assert taken == {"a": (False, True), "b": (True, True)}


def test_an_older_peer_reads_a_claim_with_a_model_as_a_plain_claim() -> None:
    """The previous version's decoder ignores unknown keys: the model's absence there is a
    claim for any model, which is what an old ingress did with every claim."""
    header = json.dumps({"count": 1, "model": "gemma"}).encode()
    data = struct.pack(">IBI", 5 + len(header), 3, len(header)) + header
    assert decode_all(data) == [Claim(1, model="gemma")]
    assert json.loads(encode(Claim(1, model="gemma"))[9:]) == {"count": 1, "model": "gemma"}


# -- the core --------------------------------------------------------------------------------


def two_models() -> RingCore:
    core = RingCore(max_streams=50)
    core.attach(Attach("a", 4, models=("A",)))
    core.attach(Attach("b", 4, models=("B",)))
    return core


def test_a_claim_is_filled_only_with_streams_of_its_model() -> None:
    core = two_models()
    a1, got = park(core, "A")
    b1, _ = park(core, "B")
    a2, _ = park(core, "A")
    assert got == []
    assert assigned(core.claim("a", Claim(4, model="A"))) == [("a", a1), ("a", a2)]
    assert core.state(b1) is StreamState.PARKED  # a's two spare claims do not take it
    assert assigned(core.claim("b", Claim(1, model="B"))) == [("b", b1)]
    assert park(core, "A")[1][0][0] == "a"  # a still waits with 2 claims
    assert park(core, "B")[1] == []  # b's one claim is spent


def test_a_claim_without_a_model_takes_any_model_its_worker_listed() -> None:
    core = RingCore(max_streams=50)
    core.attach(Attach("old", 4, models=("A", "B")))
    a, _ = park(core, "A")
    c, _ = park(core, "C")
    b, _ = park(core, "B")
    assert assigned(core.claim("old", Claim(3))) == [("old", a), ("old", b)]
    assert core.state(c) is StreamState.PARKED
    assert core.stats().workers[0].waiting_claims == 1
    assert park(core, "C")[1] == []
    assert park(core, "B")[1] == [("old", 5)]


def test_a_worker_that_lists_no_model_and_a_stream_without_a_key_match_anything() -> None:
    """Library users of the ring without models keep today's behaviour."""
    core = RingCore(max_streams=50)
    core.attach(Attach("any", 2))
    core.attach(Attach("a", 2, models=("A",)))
    core.claim("a", Claim(1, model="A"))
    sid, got = park(core, "")
    assert got == [("a", sid)]  # a stream without a key: any claim
    assert park(core, "Z")[1] == []
    assert assigned(core.claim("any", Claim(1))) == [("any", 2)]


def test_a_claim_for_a_model_the_worker_did_not_list_is_refused() -> None:
    core = two_models()
    with pytest.raises(ProtocolError, match="did not list"):
        core.claim("a", Claim(1, model="B"))
    assert core.stats().workers[0].waiting_claims == 0


def test_round_robin_holds_per_model() -> None:
    core = RingCore(max_streams=50)
    for worker in ("a1", "a2", "b1"):
        core.attach(Attach(worker, 4, models=("A" if worker[0] == "a" else "B",)))
    core.claim("a1", Claim(3, model="A"))
    core.claim("b1", Claim(3, model="B"))
    core.claim("a2", Claim(3, model="A"))
    order = [park(core, key)[1][0][0] for key in "ABAABA"]
    assert order == ["a1", "b1", "a2", "a1", "b1", "a2"]


def test_a_worker_of_the_previous_version_shares_the_line_with_new_ones_in_turn() -> None:
    core = RingCore(max_streams=50)
    core.attach(Attach("new", 4, models=("A",)))
    core.attach(Attach("old", 4, models=("A", "B")))
    core.claim("new", Claim(2, model="A"))
    core.claim("old", Claim(2))
    assert [park(core, "A")[1][0][0] for _ in range(3)] == ["new", "old", "new"]
    assert park(core, "B")[1][0][0] == "old"  # its last claim, for any model it listed
    assert park(core, "A")[1] == []


def test_requeue_before_the_head_goes_to_the_front_of_its_own_model() -> None:
    core = RingCore(max_streams=50)
    core.attach(Attach("a1", 2, models=("A",)))
    core.attach(Attach("b", 2, models=("B",)))
    core.claim("a1", Claim(1, model="A"))
    first, got = park(core, "A")
    assert got == [("a1", first)]
    second, _ = park(core, "A")
    park(core, "B")
    core.claim("b", Claim(2, model="B"))  # b waits with one claim: it must not take A's
    core.detach("a1", "crashed")
    assert core.state(first) is StreamState.PARKED
    core.attach(Attach("a2", 2, models=("A",)))
    assert assigned(core.claim("a2", Claim(1, model="A"))) == [("a2", first)]
    assert core.release("a2", first) == [] and core.holder(first) is None
    assert assigned(core.claim("a2", Claim(2, model="A"))) == [("a2", first), ("a2", second)]


def test_withdraw_takes_back_the_claims_of_the_model_named() -> None:
    core = RingCore(max_streams=50)
    core.attach(Attach("w", 6, models=("A", "B")))
    core.claim("w", Claim(2, model="A"))
    core.claim("w", Claim(1, model="B"))
    core.claim("w", Claim(1))
    assert core.withdraw("w", 5, "B") == 1
    assert park(core, "B")[1] == [("w", 1)]  # the claim without a model is still there
    assert core.withdraw("w", 5) == 2  # the rest: any claim
    assert core.stats().workers[0].waiting_claims == 0
    assert park(core, "A")[1] == []


def test_models_lists_each_model_with_its_workers_and_kind() -> None:
    core = RingCore(max_streams=5)
    core.attach(Attach("w1", 1, models=("A", "E"), kinds=("chat", "embedding")))
    core.attach(Attach("w2", 1, models=("A",)))
    models = core.models()
    assert [(m.name, m.kind, m.workers) for m in models.values()] == [
        ("A", "chat", 2),
        ("E", "embedding", 1),
    ]
    core.detach("w1")
    assert list(core.models()) == ["A"]


# -- properties ------------------------------------------------------------------------------

MODELS = ("A", "B", "C")
WORKERS = {  # disjoint and overlapping model sets, new (claims name a model) and old workers
    "a": ("A",),
    "b": ("B",),
    "ab": ("A", "B"),
    "old-bc": ("B", "C"),
    "old-all": (),
}
EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("park"), st.sampled_from(MODELS)),
        st.tuples(st.just("claim"), st.sampled_from(sorted(WORKERS)), st.sampled_from(MODELS)),
        st.tuples(st.just("serve"), st.sampled_from(sorted(WORKERS)), st.booleans()),
        st.tuples(st.just("withdraw"), st.sampled_from(sorted(WORKERS)), st.sampled_from(MODELS)),
        st.tuples(st.just("cancel"), st.integers(min_value=1, max_value=60)),
        st.tuples(st.just("crash"), st.sampled_from(sorted(WORKERS))),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(EVENTS)
def test_routing_never_crosses_models_and_loses_nothing(events: list[tuple[object, ...]]) -> None:
    """Whatever happens: every stream goes only to a worker that serves its model, in arrival
    order within its model (requeued first); no parked stream waits while a claim that may
    take it waits too; every stream is answered or still tracked."""
    core = RingCore(max_streams=1000, max_assignments=1000)
    for worker, models in WORKERS.items():
        core.attach(Attach(worker, 3, models=models))
    keys: dict[int, str] = {}
    ended: set[int] = set()
    order: dict[str, list[int]] = {}  # per model: streams in the order they were assigned

    def check(effects: list[object]) -> None:
        for worker, stream_id in assigned(effects):
            models = WORKERS[worker]
            assert not models or keys[stream_id] in models, (worker, keys[stream_id])
            order.setdefault(keys[stream_id], []).append(stream_id)
        ended.update(effect.stream_id for effect in effects if isinstance(effect, ToClient))

    for event in events:
        match event:
            case ("park", model):
                stream_id, effects = core.park(HEAD, key=str(model))
                keys[stream_id] = str(model)
                check(effects)
            case ("claim", worker, model):
                stats = {w.worker_id: w for w in core.stats().workers}[str(worker)]
                if stats.waiting_claims + len(stats.held) >= stats.max_inflight:
                    continue
                named = str(model) if worker in ("a", "b", "ab") else None
                if named is not None and named not in WORKERS[str(worker)]:
                    named = WORKERS[str(worker)][0]
                check(core.claim(str(worker), Claim(1, model=named)))
            case ("serve", worker, finish):
                held = {w.worker_id: w for w in core.stats().workers}[str(worker)].held
                live = [s for s in held if core.state(s) is StreamState.ASSIGNED]
                if not live:
                    continue
                if finish:
                    core.respond(str(worker), ResponseHead(live[0], 200))
                    core.respond(str(worker), ResponseEnd(live[0]))
                    ended.add(live[0])
                else:
                    check(core.release(str(worker), live[0]))
            case ("withdraw", worker, model):
                named = str(model) if str(model) in WORKERS[str(worker)] else None
                core.withdraw(str(worker), 1, named)
            case ("cancel", stream_id):
                if core.state(int(str(stream_id))) is StreamState.PARKED:
                    core.cancel(int(str(stream_id)))
                    ended.add(int(str(stream_id)))
            case ("crash", worker):
                check(core.detach(str(worker), "crashed"))
                core.attach(Attach(str(worker), 3, models=WORKERS[str(worker)]))
        # No parked stream has a waiting claim that could take it.
        parked = {keys[s] for s in keys if core.state(s) is StreamState.PARKED}
        for stats in core.stats().workers:
            for model, count in stats.claims:
                takes = {model} if model is not None else set(stats.models or MODELS)
                assert count > 0 and not parked & takes, (stats, parked)
    # Nothing lost: every stream ended, or the core still tracks it.
    for stream_id in keys:
        assert stream_id in ended or core.state(stream_id) is not None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(MODELS), max_size=30), st.data())
def test_each_model_is_served_in_arrival_order(arrivals: list[str], data: st.DataObject) -> None:
    core = RingCore(max_streams=100)
    core.attach(Attach("w", 100, models=MODELS))
    keys = {core.park(HEAD, key=model)[0]: model for model in arrivals}
    served: list[int] = []
    for model in data.draw(st.permutations(arrivals)):  # one claim per stream, in any order
        (got,) = assigned(core.claim("w", Claim(1, model=model)))
        served.append(got[1])
    assert sorted(served) == sorted(keys)
    for model in MODELS:
        mine = [sid for sid in served if keys[sid] == model]
        assert mine == sorted(mine)


# -- the in-process ring: the park timeout and model memory per model ----------------------


async def test_a_model_nobody_serves_times_out_while_another_is_served(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A's worker waits with a claim; B's request parks (no claim fits it) and times out after
    the park timeout, untouched by A's traffic, which is served meanwhile."""
    ring = Ring(max_streams=8, park_timeout=5.0)
    for_b = ring.park(HEAD, b"b", key="B")
    served: list[bytes] = []

    async def worker_a(task_status: trio.TaskStatus[None]) -> None:
        async with ring.attach("a", 1, models=["A"]) as link:
            task_status.started()
            while True:
                with await link.claim() as claimed:
                    served.append(claimed.body)
                    await claimed.send_head(200)
                    await claimed.end()

    async with trio.open_nursery() as nursery:
        await nursery.start(worker_a)
        for n in range(3):
            stream = ring.park(HEAD, f"a{n}".encode(), key="A")
            assert (await stream.response_head()).status == 200
            await trio.sleep(1)
        start = trio.current_time()  # the park time counts from the wait for the head
        with pytest.raises(ParkTimeoutError):
            await for_b.response_head()
        assert trio.current_time() - start == pytest.approx(5.0)
        assert served == [b"a0", b"a1", b"a2"]
        nursery.cancel_scope.cancel()


async def test_the_ring_remembers_a_model_for_the_park_timeout_after_its_last_worker(
    autojump_clock: trio.abc.Clock,
) -> None:
    ring = Ring(max_streams=8, park_timeout=5.0)
    async with ring.attach("e", 1, models=["E", "C"], kinds=["embedding", "chat"]):
        assert [(m.name, m.kind, m.workers) for m in ring.models().values()] == [
            ("E", "embedding", 1),
            ("C", "chat", 1),
        ]
    assert [(m.name, m.kind, m.workers) for m in ring.models().values()] == [
        ("E", "embedding", 0),
        ("C", "chat", 0),
    ]
    await trio.sleep(5.5)
    assert ring.models() == {}
