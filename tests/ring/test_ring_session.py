"""The ingress's end of one worker connection, ``SessionCore``, with no sockets and no clock:
messages and times in, effects out (as h11's tests drive its ``Connection``). Then the same
core against a real ``RingCore``, and a hypothesis state machine over random sequences of what
a worker and a ring may do."""

from __future__ import annotations

import copy
import math

import attrs
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from llmtrio.api import CHAT_PATH
from llmtrio.ring import (
    PROTOCOL_VERSION,
    SESSION_TRANSITIONS,
    WORKER_HEADER,
    Assign,
    Attach,
    Cancel,
    Claim,
    Credit,
    Detach,
    Heartbeat,
    Outcome,
    ProtocolError,
    Release,
    RequestHead,
    ResponseData,
    ResponseEnd,
    ResponseError,
    ResponseHead,
    Ring,
    RingCore,
    SessionClosed,
    SessionCore,
    SessionEffect,
    SessionState,
    StreamLost,
    ToClient,
    ToRing,
    ToWire,
    ToWorker,
    Withdraw,
    Withdrawn,
)

HEAD = RequestHead("POST", CHAT_PATH, [])
NAME = "worker-1#7"


def attached(max_inflight: int = 2, *, credits: int = 2, now: float = 0.0) -> SessionCore:
    core = SessionCore(NAME, opened=now, credits=credits, worker_timeout=10, cancel_ack_timeout=5)
    effects = core.receive(Attach("it calls itself this", max_inflight, models=["m"]), now)
    assert effects == [ToRing(Attach(NAME, max_inflight, models=["m"]))]
    return core


def holding(core: SessionCore, *stream_ids: int, now: float = 0.0) -> None:
    """Claim and be assigned ``stream_ids``."""
    assert core.receive(Claim(len(stream_ids)), now) == [ToRing(Claim(len(stream_ids)))]
    for stream_id in stream_ids:
        (effect,) = core.from_ring(Assign(stream_id, HEAD, b"body"), now)
        assert effect == ToWire(Assign(stream_id, HEAD, b"body", credits=core.credits))


def unchanged_after_refusal(core: SessionCore, message: object, match: str) -> None:
    before = copy.deepcopy(core)
    with pytest.raises(ProtocolError, match=match):
        core.receive(message, 1.0)  # type: ignore[arg-type]
    assert core == before


# -- the handshake ------------------------------------------------------------------------------


def test_an_attach_names_the_worker_as_the_ingress_does() -> None:
    core = attached(3)
    assert core.state is SessionState.ATTACHED
    assert (core.claims, core.held) == (0, ())


def test_another_protocol_version_is_refused_with_a_reason() -> None:
    core = SessionCore(NAME, opened=0)
    effects = core.receive(Attach("old", 1, version=PROTOCOL_VERSION + 1), 0.5)
    reason = f"incompatible protocol version {PROTOCOL_VERSION + 1}: this ingress speaks"
    assert [type(e) for e in effects] == [ToWire, SessionClosed]
    assert isinstance(effects[0], ToWire) and isinstance(effects[0].message, Detach)
    assert effects[0].message.reason.startswith(reason)
    assert effects[1] == SessionClosed(effects[0].message.reason, fault=True)
    assert core.state is SessionState.CLOSED
    assert core.receive(Heartbeat(0, 1, 1), 1) == [] and core.expire(100) == []
    assert core.deadline == math.inf


def test_the_first_message_must_be_an_attach() -> None:
    core = SessionCore(NAME, opened=0)
    *_, closed = core.receive(Claim(1), 0)
    assert isinstance(closed, SessionClosed) and "the first message must be Attach" in closed.reason


def test_no_attach_within_the_worker_timeout_closes_the_connection() -> None:
    core = SessionCore(NAME, opened=100, worker_timeout=7)
    assert core.deadline == 107
    assert core.expire(106.9) == []
    assert core.expire(107) == [SessionClosed("sent no Attach within 7s", fault=True)]


def test_the_transition_table_is_what_the_core_enforces() -> None:
    core = attached()
    allowed = SESSION_TRANSITIONS[SessionState.ATTACHED]
    for message in (Attach("again", 1), Assign(1, HEAD), Cancel(1), Credit(1), Withdrawn(0)):
        assert type(message) not in allowed
        unchanged_after_refusal(core, message, f"may not send {type(message).__name__}")
    assert allowed[Detach] is SessionState.CLOSED


# -- claims -------------------------------------------------------------------------------------


def test_claims_and_held_streams_never_exceed_max_inflight() -> None:
    core = attached(2)
    holding(core, 5)
    assert core.receive(Claim(1), 1) == [ToRing(Claim(1))]
    unchanged_after_refusal(core, Claim(1), "holding 1 and waiting for 1, beyond its max_inflight")
    assert (core.claims, core.held) == (1, (5,))
    # The end frees the slot: the worker may claim it again at once.
    assert core.receive(ResponseEnd(5), 2) == [ToRing(ResponseEnd(5))]
    assert core.receive(Claim(1), 2) == [ToRing(Claim(1))]
    assert (core.claims, core.held) == (2, ())


def test_a_withdraw_goes_to_the_ring_and_its_answer_to_the_worker() -> None:
    core = attached(3)
    core.receive(Claim(3), 0)
    assert core.receive(Withdraw(2), 1) == [ToRing(Withdraw(2))]
    assert core.from_ring(Withdrawn(2), 1) == [ToWire(Withdrawn(2))]
    assert core.claims == 1


# -- streams and credits ------------------------------------------------------------------------


def test_a_head_names_the_worker_and_messages_go_to_the_ring_as_they_are() -> None:
    core = attached()
    holding(core, 3)
    (effect,) = core.receive(ResponseHead(3, 200, [("content-type", "text/plain")]), 1)
    assert effect == ToRing(
        ResponseHead(3, 200, [("content-type", "text/plain"), (WORKER_HEADER, NAME)])
    )
    data = ResponseData(3, b"x")
    (forwarded,) = core.receive(data, 1)
    assert isinstance(forwarded, ToRing) and forwarded.message is data  # not rebuilt
    end = ResponseEnd(3, outcome=Outcome(finish_reason="stop", completion_tokens=1))
    (forwarded,) = core.receive(end, 1)
    assert isinstance(forwarded, ToRing) and forwarded.message is end
    assert core.held == ()


def test_credits_bound_a_stream_and_one_last_chunk_may_pass_them() -> None:
    core = attached(credits=2)
    holding(core, 1)
    core.receive(ResponseHead(1, 200), 0)
    for _ in range(2):
        core.receive(ResponseData(1, b"x"), 0)
    assert core.credits_left(1) == 0
    core.receive(ResponseData(1, b"last"), 0)  # past the credits: only the end may follow
    unchanged_after_refusal(core, ResponseData(1, b"more"), "beyond its credits on stream 1")
    assert core.from_ring(Credit(1), 0) == [ToWire(Credit(1))]  # the client read one
    unchanged_after_refusal(core, ResponseData(1, b"more"), "beyond its credits")
    assert core.receive(ResponseEnd(1), 0) == [ToRing(ResponseEnd(1))]


def test_credits_come_back_as_the_client_takes_chunks() -> None:
    core = attached(credits=1)
    holding(core, 1)
    core.receive(ResponseHead(1, 200), 0)
    for _ in range(5):
        core.receive(ResponseData(1, b"x"), 0)
        assert core.from_ring(Credit(1), 0) == [ToWire(Credit(1))]
    assert core.credits_left(1) == 1
    core.receive(ResponseEnd(1), 0)
    assert core.from_ring(Credit(1), 0) == []  # for a finished stream: nothing to say


def test_messages_on_streams_the_worker_does_not_hold_are_refused() -> None:
    core = attached()
    holding(core, 1)
    for message in (ResponseData(2, b"x"), ResponseEnd(2), Release(2), ResponseHead(2, 200)):
        unchanged_after_refusal(core, message, "does not hold stream 2")
    core.receive(Release(1), 0)
    unchanged_after_refusal(core, ResponseEnd(1), "does not hold stream 1")


# -- cancels and silence ------------------------------------------------------------------------


def test_a_cancel_not_acknowledged_in_time_loses_the_stream_only() -> None:
    core = attached()
    holding(core, 1, 2)
    core.receive(ResponseHead(1, 200), 0)
    assert core.from_ring(Cancel(1), 3) == [ToWire(Cancel(1))]
    assert core.from_ring(Cancel(1), 3.5) == []  # once
    assert core.from_ring(Credit(1), 3.5) == []  # no credits for a stream being cancelled
    core.receive(Heartbeat(1, 2, 1), 7)
    assert core.deadline == 8  # the acknowledgement is due before the next silence check
    assert core.expire(7.9) == []
    assert core.expire(8) == [
        ToRing(ResponseError(1, "the worker did not acknowledge the cancel")),
        StreamLost(1),
    ]
    assert core.held == (2,)
    # Its late messages are dropped, once; the other stream goes on.
    assert core.receive(ResponseData(1, b"late"), 9) == []
    assert core.receive(ResponseEnd(1), 9) == []
    unchanged_after_refusal(core, ResponseEnd(1), "does not hold stream 1")
    assert core.receive(ResponseHead(2, 200), 9) != []


def test_an_acknowledged_cancel_is_forwarded_and_forgotten() -> None:
    core = attached()
    holding(core, 1)
    core.from_ring(Cancel(1), 0)
    assert core.receive(ResponseError(1, "cancelled"), 1) == [ToRing(ResponseError(1, "cancelled"))]
    assert core.deadline == 11  # only the silence check is left
    assert core.expire(10) == []


def test_a_silent_worker_is_declared_dead_and_its_claims_withdrawn() -> None:
    core = attached(4)
    holding(core, 1)
    core.receive(Claim(2), 3)
    assert core.deadline == 13
    assert core.expire(12.9) == []
    assert core.expire(13) == [
        ToRing(Withdraw(2)),
        SessionClosed("silent for 10s: declared dead", fault=True),
    ]
    assert core.from_ring(Assign(2, HEAD), 14) == []


def test_a_worker_leaving_and_the_ingress_closing() -> None:
    core = attached()
    assert core.receive(Detach("draining"), 1) == [SessionClosed("the worker left: draining")]
    core = attached(3)
    core.receive(Claim(1), 0)
    assert core.close("the ingress is shutting down") == [
        ToRing(Withdraw(1)),
        ToWire(Detach("the ingress is shutting down")),
        SessionClosed("the ingress is shutting down"),
    ]
    assert core.close("again") == []


# -- against a RingCore -------------------------------------------------------------------------


@attrs.define
class Bridge:
    """A ``SessionCore`` attached to a ``RingCore`` by hand, as ``Ring`` and the control
    listener attach them: what the session sends to the ring goes to the core, the core's
    messages for the worker come back to the session. No I/O anywhere."""

    ring: RingCore
    session: SessionCore
    wire: list[object] = attrs.field(factory=list)  # what the worker was sent
    client: list[object] = attrs.field(factory=list)  # what the clients were sent

    def run(self, effects: list[SessionEffect]) -> None:
        for effect in effects:
            match effect:
                case ToWire(message=message):
                    self.wire.append(message)
                case ToRing(message=Attach() as attach):
                    self.ring.attach(attach)
                case ToRing(message=Withdraw(count=count)):
                    taken = self.ring.withdraw(self.session.worker_id, count)
                    self.run(self.session.from_ring(Withdrawn(taken), 0))
                case ToRing(message=message):
                    for out in self.ring.receive(self.session.worker_id, message):
                        if isinstance(out, ToWorker):
                            self.run(self.session.from_ring(out.message, 0))
                        else:
                            assert isinstance(out, ToClient)
                            self.client.append(out.message)


def test_a_session_and_a_ring_core_serve_a_stream_together() -> None:
    ring = RingCore(max_streams=4)
    bridge = Bridge(ring, SessionCore(NAME, opened=0, credits=4))
    bridge.run(bridge.session.receive(Attach("w", 2), 0))
    bridge.run(bridge.session.receive(Claim(2), 0))
    stream_id, effects = ring.park(HEAD, b"hi", key="gemma")
    for effect in effects:
        assert isinstance(effect, ToWorker)
        bridge.run(bridge.session.from_ring(effect.message, 0))
    assert bridge.wire == [Assign(stream_id, HEAD, b"hi", credits=4)]
    for message in (ResponseHead(stream_id, 200), ResponseData(stream_id, b"a")):
        bridge.run(bridge.session.receive(message, 1))
    outcome = Outcome(finish_reason="length", prompt_tokens=2, completion_tokens=1)
    bridge.run(bridge.session.receive(ResponseEnd(stream_id, outcome=outcome), 1))
    assert bridge.client == [
        ResponseHead(stream_id, 200, [(WORKER_HEADER, NAME)]),
        ResponseData(stream_id, b"a"),
        ResponseEnd(stream_id, outcome=outcome),
    ]
    bridge.run(bridge.session.receive(Withdraw(5), 2))
    assert bridge.wire[-1] == Withdrawn(1)
    assert ring.stats().tracked == 0
    assert (ring.stats().workers[0].waiting_claims, bridge.session.claims) == (0, 0)


async def test_a_relayed_link_takes_messages_as_they_are_and_relays_the_rings() -> None:
    """How the control listener attaches a remote worker: its messages go in through
    ``post`` as they are (a chunk never waits: credits bound it), the ring's come out through
    the relay, and each chunk that enters the client's buffer is a credit."""
    ring = Ring(max_streams=4, response_buffer=2)
    relayed: list[object] = []
    async with ring.attach("remote", 2, relay=relayed.append) as link:
        with pytest.raises(ProtocolError, match="relay"):
            await link.claim()
        link.post(Claim(2))
        stream = ring.park(HEAD, b"q")
        assert relayed == [Assign(stream.stream_id, HEAD, b"q")]
        link.post(Withdraw(2))
        assert relayed[-1] == Withdrawn(1)
        link.post(ResponseHead(stream.stream_id, 200))
        for chunk in (b"a", b"b", b"c", b"d"):  # past the buffer's 2, at once
            link.post(ResponseData(stream.stream_id, chunk))
        assert relayed[1:].count(Credit(stream.stream_id)) == 2  # the two in the buffer
        body = stream.body()
        assert await body.__anext__() == b"a"
        assert relayed.count(Credit(stream.stream_id)) == 3  # "c" entered the buffer
        link.post(ResponseEnd(stream.stream_id, outcome=Outcome(completion_tokens=4)))
        assert [chunk async for chunk in body] == [b"b", b"c", b"d"]
        assert relayed.count(Credit(stream.stream_id)) == 3  # none once the stream is over
        assert stream.outcome == Outcome(completion_tokens=4)
        gone = ring.park(HEAD)
        link.post(Claim(1))
        gone.cancel()
        assert relayed[-2:] == [Assign(gone.stream_id, HEAD), Cancel(gone.stream_id)]
        link.post(ResponseEnd(gone.stream_id))  # the acknowledgement
    assert ring.stats().tracked == 0


# -- a property over random sequences -----------------------------------------------------------


class SessionMachine(RuleBasedStateMachine):
    """Whatever a worker sends and the ring does, in any order: the session core's claim bound
    and credit bound hold, a refused message changes nothing, nothing reaches the ring about a
    stream the worker does not hold, and a closed session does nothing more."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.max_inflight = 3
        self.credits = 2
        self.core = SessionCore(
            NAME, opened=0, credits=self.credits, worker_timeout=10, cancel_ack_timeout=5
        )
        self.core.receive(Attach("w", self.max_inflight), 0)
        self.next_id = 1
        self.sent: dict[int, int] = {}  # chunks the ring got per stream
        self.credited: dict[int, int] = {}  # credits the worker got per stream
        self.closed = False

    def check(self, effects: list[SessionEffect], held_before: tuple[int, ...]) -> None:
        if self.closed:
            assert effects == []
        for effect in effects:
            assert not self.closed, "nothing follows SessionClosed"
            match effect:
                case ToRing(message=ResponseHead() | ResponseData() | Release() as message):
                    assert message.stream_id in held_before
                    if isinstance(message, ResponseData):
                        self.sent[message.stream_id] = self.sent.get(message.stream_id, 0) + 1
                case ToRing(message=ResponseEnd() | ResponseError() as message):
                    assert message.stream_id in held_before
                case ToWire(message=Assign() as assign):
                    assert assign.credits == self.credits
                case ToWire(message=Credit() as credit):
                    assert credit.stream_id in self.core.held
                    self.credited[credit.stream_id] = self.credited.get(credit.stream_id, 0) + 1
                case SessionClosed():
                    self.closed = True

    def worker(self, message: object) -> None:
        before = copy.deepcopy(self.core)
        try:
            effects = self.core.receive(message, self.now)  # type: ignore[arg-type]
        except ProtocolError:
            assert self.core == before
            return
        self.check(effects, before.held)

    def ring(self, message: Assign | Cancel | Credit | Withdrawn) -> None:
        held = self.core.held
        self.check(self.core.from_ring(message, self.now), held)

    @rule(count=st.integers(1, 4))
    def claim(self, count: int) -> None:
        self.worker(Claim(count))

    @rule(count=st.integers(1, 4))
    def withdraw(self, count: int) -> None:
        taken = min(count, self.core.claims)  # what the ring answers: its claims are these
        self.worker(Withdraw(count))
        if not self.closed:
            self.ring(Withdrawn(taken))

    @precondition(lambda self: self.core.claims > 0)
    @rule()
    def assign(self) -> None:
        self.ring(Assign(self.next_id, HEAD))
        self.next_id += 1

    @rule(
        data=st.data(),
        kind=st.sampled_from(["head", "data", "data", "data", "end", "error", "release"]),
    )
    def respond(self, data: st.DataObject, kind: str) -> None:
        # Mostly streams the worker holds; also finished, lost and never assigned ones.
        stream = data.draw(st.sampled_from([*self.core.held] * 4 + [*range(1, self.next_id + 1)]))
        message = {
            "head": ResponseHead(stream, 200),
            "data": ResponseData(stream, b"x"),
            "end": ResponseEnd(stream),
            "error": ResponseError(stream, "no"),
            "release": Release(stream),
        }[kind]
        self.worker(message)

    @precondition(lambda self: self.core.held)
    @rule(data=st.data(), kind=st.sampled_from(["credit", "credit", "cancel"]))
    def ring_says(self, data: st.DataObject, kind: str) -> None:
        stream = data.draw(st.sampled_from(self.core.held))  # the ring speaks of held streams
        self.ring(Credit(stream) if kind == "credit" else Cancel(stream))

    @rule()
    def heartbeat(self) -> None:
        self.worker(Heartbeat(0, self.max_inflight, self.max_inflight))

    @rule(seconds=st.floats(0, 12))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds
        held = self.core.held
        self.check(self.core.expire(self.now), held)
        if not self.closed:
            assert self.core.deadline > self.now

    @rule()
    def leave(self) -> None:
        self.worker(Detach("bye"))

    @invariant()
    def bounds_hold(self) -> None:
        assert len(self.core.held) + self.core.claims <= self.max_inflight
        assert self.core.claims >= 0
        for stream_id in self.core.held:
            # Credits granted, plus the credits given back, plus the one last chunk.
            allowed = self.credits + self.credited.get(stream_id, 0) + 1
            assert self.sent.get(stream_id, 0) <= allowed
            left = self.core.credits_left(stream_id)
            assert left is not None and left >= 0


SessionMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40)
test_random_sequences_keep_the_session_bounds = SessionMachine.TestCase
