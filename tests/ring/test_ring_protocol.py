"""The ring's sans-IO core on its own: messages, frames and the lane state machine.

No trio and no sockets here: bytes in, messages and effects out.
"""

from __future__ import annotations

import json
import struct

import pytest
import trio

from llmtrio.ring import (
    MAX_FRAME_SIZE,
    TRANSITIONS,
    Assign,
    Attach,
    Cancel,
    Claim,
    Credit,
    Detach,
    FrameDecoder,
    Heartbeat,
    Message,
    Outcome,
    ProtocolError,
    Release,
    RequestHead,
    ResponseData,
    ResponseEnd,
    ResponseError,
    ResponseHead,
    RingCore,
    RingFullError,
    StreamState,
    ToClient,
    ToWorker,
    Withdraw,
    Withdrawn,
    encode,
    encode_available,
)

from .._helpers import HEAD

EVERY_MESSAGE: list[Message] = [
    Attach("worker-1", 8),
    Attach("wörker ☃", 1),
    Attach("w", 2, models=("gemma", "qwen"), version=7),
    Heartbeat(inflight=3, max_inflight=8, available_slots=5),
    Heartbeat(0, 0, 0),
    Heartbeat(inflight=8, max_inflight=8, available_slots=0, decoding=6),
    Heartbeat(1, 4, 3, cache_hits=2, cached_tokens=900, cache_bytes=12_000_000),
    Heartbeat(2, 4, 2, 2, kv_used=300, kv_total=16384),
    Heartbeat(2, 4, 2, 2, spec_drafted=800, spec_accepted=600),
    Heartbeat(0, 2, 2, model_state="unloaded"),
    Heartbeat(1, 2, 1, 1, model_state="loaded"),
    Heartbeat(0, 2, 2, model_state="unloaded", free_bytes=3 << 30),
    Heartbeat(0, 2, 2, model_state="unloaded", free_bytes=-1),
    Heartbeat(1, 2, 1, 1, prefixes=("9f86d081884c7d65", "2c26b46b68ffc68f")),
    Claim(1),
    Claim(7),
    Withdraw(3),
    Withdrawn(0),
    Release(4),
    Credit(4, 16),
    Assign(1, HEAD, b"x", credits=16),
    Assign(1, HEAD, b'{"messages": []}'),
    Assign(2**40, RequestHead("GET", "/health"), b""),
    Assign(3, RequestHead("POST", "/ü", {"x-a": "1", "x-b": "\udcff"}), bytes(range(256)) * 300),
    ResponseHead(1, 200, [("content-type", "text/event-stream"), ("x-dup", "a"), ("x-dup", "b")]),
    ResponseHead(9, 503),
    ResponseData(1, b"data: {}\n\n"),
    ResponseData(1, b""),
    ResponseData(5, "é😀".encode() + b"\x00\xff"),
    ResponseEnd(1),
    ResponseEnd(2, outcome=Outcome(finish_reason="stop", prompt_tokens=3, completion_tokens=9)),
    ResponseEnd(3, outcome=Outcome()),
    ResponseError(1, "decode failed: ☠"),
    ResponseError(4, "too long", outcome=Outcome(error_code="x", cached_tokens=0)),
    Cancel(12),
    Detach("shutting down"),
    Detach(),
]


def decode_all(data: bytes, decoder: FrameDecoder | None = None) -> list[Message]:
    decoder = decoder or FrameDecoder()
    decoder.receive_data(data)
    messages = []
    while (message := decoder.next_message()) is not None:
        messages.append(message)
    return messages


def frame(code: int, header: object, payload: bytes = b"", *, raw: bytes | None = None) -> bytes:
    body = raw if raw is not None else json.dumps(header).encode()
    return struct.pack(">IBI", 5 + len(body) + len(payload), code, len(body)) + body + payload


# -- messages and frames ---------------------------------------------------------------------


@pytest.mark.parametrize("message", EVERY_MESSAGE, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(message: Message) -> None:
    data = encode(message)
    (length,) = struct.unpack(">I", data[:4])
    assert length == len(data) - 4
    assert decode_all(data) == [message]


def test_many_frames_in_one_read_and_byte_by_byte() -> None:
    wire = b"".join(encode(message) for message in EVERY_MESSAGE)
    assert decode_all(wire) == EVERY_MESSAGE

    decoder = FrameDecoder()
    decoded = []
    for i in range(len(wire)):
        decoder.receive_data(wire[i : i + 1])
        while (message := decoder.next_message()) is not None:
            decoded.append(message)
    assert decoded == EVERY_MESSAGE
    decoder.receive_data(b"")  # a clean end
    assert decoder.next_message() is None


def test_a_partial_frame_waits_for_the_rest() -> None:
    data = encode(Assign(4, HEAD, b"x" * 1000))
    decoder = FrameDecoder()
    for cut in (1, 4, 9, 500):
        decoder = FrameDecoder()
        decoder.receive_data(data[:cut])
        assert decoder.next_message() is None
        decoder.receive_data(data[cut:])
        assert decoder.next_message() == Assign(4, HEAD, b"x" * 1000)
        assert decoder.next_message() is None


def test_an_oversize_frame_is_refused_as_soon_as_its_length_arrives() -> None:
    decoder = FrameDecoder(max_frame_size=1024)
    decoder.receive_data(struct.pack(">I", 1025))
    with pytest.raises(ProtocolError, match="exceeds the 1024-byte limit") as info:
        decoder.next_message()
    assert info.value.offending == struct.pack(">I", 1025)
    # The decoder stays broken: where the next frame starts is unknown.
    decoder.receive_data(b"more")
    with pytest.raises(ProtocolError, match="broken by an earlier error"):
        decoder.next_message()


def test_the_default_frame_bound_and_a_frame_just_at_it() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(struct.pack(">I", MAX_FRAME_SIZE + 1))
    with pytest.raises(ProtocolError):
        decoder.next_message()

    message = ResponseData(1, b"")
    exact = len(encode(message)) - 4 + 100
    big = ResponseData(1, b"z" * 100)
    assert decode_all(encode(big, max_frame_size=exact), FrameDecoder(exact)) == [big]


def test_encode_refuses_a_frame_over_the_bound() -> None:
    message = ResponseData(1, b"z" * 2000)
    with pytest.raises(ProtocolError, match="exceeds") as info:
        encode(message, max_frame_size=1000)
    assert info.value.offending is message


def test_frames_of_unknown_types_are_skipped() -> None:
    data = frame(99, {"from": "a newer peer"}, b"payload") + encode(Claim(2)) + frame(200, {})
    assert decode_all(data + encode(Cancel(1))) == [Claim(2), Cancel(1)]


def test_a_frame_without_a_version_is_an_attach_of_version_0() -> None:
    (attach,) = decode_all(frame(1, {"worker_id": "w", "max_inflight": 2}))
    assert isinstance(attach, Attach)
    assert (attach.version, attach.models) == (0, ())


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (frame(3, None, raw=b"{not json"), "not JSON"),
        (frame(3, None, raw=b"\xff\xfe"), "not JSON"),
        (frame(3, [1, 2]), "not a JSON object"),
        (frame(3, {}), "lacks 'count'"),
        (frame(3, {"count": "1"}), "'count' must be an integer"),
        (frame(3, {"count": True}), "'count' must be an integer"),
        (frame(3, {"count": 0}), "invalid Claim"),
        (frame(1, {"worker_id": 5, "max_inflight": 1}), "'worker_id' must be a string"),
        (frame(1, {"worker_id": "", "max_inflight": 1}), "invalid Attach"),
        (frame(5, {"stream_id": 1, "status": 200, "headers": [["a"]]}), "list of \\[name, value"),
        (frame(5, {"stream_id": 1, "status": 42, "headers": []}), "invalid ResponseHead"),
        (frame(7, {"stream_id": 0}), "invalid ResponseEnd"),
        (frame(7, {"stream_id": 1}, b"stray"), "ResponseEnd frame carries no payload"),
        (frame(3, None, raw=b"[" * 100_000), "not JSON"),
        (struct.pack(">IB", 1, 3), "too short"),
        (struct.pack(">IBI", 5, 3, 10), "claims 10 bytes"),
    ],
)
def test_malformed_frames_raise_protocol_error(data: bytes, match: str) -> None:
    decoder = FrameDecoder()
    decoder.receive_data(data)
    with pytest.raises(ProtocolError, match=match) as info:
        decoder.next_message()
    assert isinstance(info.value.offending, bytes)


def test_unknown_header_keys_are_ignored() -> None:
    assert decode_all(frame(3, {"count": 2, "priority": "high"})) == [Claim(2)]


def test_a_heartbeat_from_an_older_worker_reports_no_kv_cache() -> None:
    """Workers older than the KV fields send none: read as not reported (a total of 0), so
    the ingress leaves them out of its KV-cache usage instead of counting them empty."""
    old = frame(2, {"inflight": 1, "max_inflight": 4, "available_slots": 3, "decoding": 1})
    (beat,) = decode_all(old)
    assert beat == Heartbeat(1, 4, 3, 1) and (beat.kv_used, beat.kv_total) == (0, 0)
    assert b"kv_" not in encode(Heartbeat(1, 4, 3, 1))  # and nothing extra goes out for them
    assert beat.model_state == "" and b"model_state" not in encode(beat)


def test_an_end_of_stream_inside_a_frame_is_an_error() -> None:
    data = encode(ResponseData(1, b"abc"))
    for cut in (2, 6, len(data) - 1):
        decoder = FrameDecoder()
        decoder.receive_data(data[:cut])
        assert decoder.next_message() is None
        decoder.receive_data(b"")
        with pytest.raises(ProtocolError, match="stream ended"):
            decoder.next_message()

    decoder = FrameDecoder()
    decoder.receive_data(data + data)
    decoder.receive_data(b"")
    assert decoder.next_message() == decoder.next_message() == ResponseData(1, b"abc")
    assert decoder.next_message() is None
    with pytest.raises(ProtocolError, match="after the end"):
        decoder.receive_data(b"x")


def test_message_values_are_checked_on_construction() -> None:
    with pytest.raises(ValueError):
        Claim(0)
    with pytest.raises(ValueError):
        ResponseHead(1, 99)
    with pytest.raises(ValueError):
        ResponseHead(1, 600)
    with pytest.raises(ValueError):
        Cancel(0)
    with pytest.raises(TypeError):
        Heartbeat(True, 1, 1)
    with pytest.raises(TypeError):
        ResponseData(1, "text")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ResponseData(1, 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        RequestHead("GET", "/", ["ab"])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        RequestHead("GET", "/", [("a", b"b")])  # type: ignore[list-item]
    assert RequestHead("GET", "/", {"a": "1"}).headers == (("a", "1"),)
    assert ResponseData(1, bytearray(b"ab")).data == b"ab"
    assert "3 bytes" in repr(Assign(1, HEAD, b"abc"))


# -- the lane state machine ------------------------------------------------------------------


def assigned(effects: list[ToWorker | ToClient]) -> list[tuple[str, int]]:
    return [
        (effect.worker_id, effect.message.stream_id)
        for effect in effects
        if isinstance(effect, ToWorker) and isinstance(effect.message, Assign)
    ]


def park(core: RingCore, n: int = 1) -> list[int]:
    ids = []
    for i in range(n):
        stream_id, effects = core.park(HEAD, f"body {i}".encode())
        assert effects == []
        ids.append(stream_id)
    return ids


def assert_empty(core: RingCore) -> None:
    stats = core.stats()
    assert stats.tracked == 0
    assert (stats.parked, stats.serving, stats.cancelling) == (0, 0, 0)
    assert all(worker.held == () for worker in stats.workers)


def test_a_stream_round_trips_and_is_forgotten() -> None:
    core = RingCore(max_streams=4)
    core.attach(Attach("w", 2))
    (sid,) = park(core)
    assert core.state(sid) is StreamState.PARKED

    effects = core.claim("w", Claim(1))
    assert effects == [ToWorker("w", Assign(sid, HEAD, b"body 0"))]
    assert core.state(sid) is StreamState.ASSIGNED
    assert core.holder(sid) == "w"

    head = ResponseHead(sid, 200, [("content-type", "text/plain")])
    assert core.respond("w", head) == [ToClient(sid, head)]
    assert core.state(sid) is StreamState.RESPONDING
    data = ResponseData(sid, b"hello")
    assert core.respond("w", data) == [ToClient(sid, data)]
    assert core.respond("w", ResponseEnd(sid)) == [ToClient(sid, ResponseEnd(sid))]
    assert core.state(sid) is None
    assert_empty(core)


def test_parked_streams_are_assigned_in_arrival_order_up_to_the_claims() -> None:
    core = RingCore(max_streams=10)
    core.attach(Attach("w", 4))
    ids = park(core, 5)
    assert assigned(core.claim("w", Claim(2))) == [("w", ids[0]), ("w", ids[1])]
    assert core.stats().parked == 3
    assert core.stats().workers[0].waiting_claims == 0
    assert assigned(core.claim("w", Claim(1))) == [("w", ids[2])]
    with pytest.raises(ProtocolError, match="beyond its max_inflight"):
        core.claim("w", Claim(2))  # holds 3 of 4
    assert core.stats().workers[0].waiting_claims == 0  # the refused claim changed nothing


def test_a_claim_waits_for_the_next_park() -> None:
    core = RingCore(max_streams=10)
    core.attach(Attach("w", 2))
    assert core.claim("w", Claim(2)) == []
    assert core.stats().workers[0].waiting_claims == 2
    sid, effects = core.park(HEAD, b"b")
    assert effects == [ToWorker("w", Assign(sid, HEAD, b"b"))]
    assert core.stats().workers[0].waiting_claims == 1
    assert core.withdraw("w", 5) == 1
    assert core.withdraw("w") == 0
    assert core.park(HEAD)[1] == []


def test_waiting_workers_are_served_round_robin() -> None:
    core = RingCore(max_streams=10)
    for worker in ("a", "b"):
        core.attach(Attach(worker, 3))
    core.claim("a", Claim(3))
    core.claim("b", Claim(3))
    got = [assigned(core.park(HEAD)[1])[0][0] for _ in range(5)]
    assert got == ["a", "b", "a", "b", "a"]


def test_a_full_ring_refuses_and_a_finished_stream_frees_its_spot() -> None:
    core = RingCore(max_streams=2, retry_after=3)
    core.attach(Attach("w", 2))
    a, b = park(core, 2)
    with pytest.raises(RingFullError) as info:
        core.park(HEAD)
    assert info.value.retry_after == 3
    assert info.value.max_streams == 2
    assert core.stats().open == 2

    core.claim("w", Claim(1))  # being served still counts
    with pytest.raises(RingFullError):
        core.park(HEAD)
    core.respond("w", ResponseError(a, "no"))
    (c,) = park(core)
    assert c > b


def test_cancelling_a_parked_stream_forgets_it_and_frees_its_spot() -> None:
    core = RingCore(max_streams=2)
    core.attach(Attach("w", 2))
    a, b = park(core, 2)
    assert core.cancel(a) == []  # no worker to tell
    assert core.cancel(a) == []  # idempotent
    assert core.state(a) is None
    (c,) = park(core)
    assert assigned(core.claim("w", Claim(2))) == [("w", b), ("w", c)]


def test_cancelling_a_served_stream_tells_its_worker_and_waits_for_the_ack() -> None:
    core = RingCore(max_streams=1)
    core.attach(Attach("w", 1))
    (sid,) = park(core)
    core.claim("w", Claim(1))
    core.respond("w", ResponseHead(sid, 200))

    assert core.cancel(sid) == [ToWorker("w", Cancel(sid))]
    assert core.cancel(sid) == []  # told once
    assert core.state(sid) is StreamState.CANCELLED
    stats = core.stats()
    assert (stats.open, stats.cancelling, stats.workers[0].held) == (0, 1, (sid,))
    park(core)  # the client's spot is free at once

    # Whatever the worker sent before it saw the Cancel is dropped, not an error.
    assert core.respond("w", ResponseData(sid, b"late")) == []
    with pytest.raises(ProtocolError, match="beyond its max_inflight"):
        core.claim("w", Claim(1))  # the worker's slot is busy until it acknowledges
    assert core.respond("w", ResponseEnd(sid)) == []
    assert core.state(sid) is None
    assert core.stats().workers[0].held == ()


def test_a_cancelled_assigned_stream_may_be_acknowledged_with_an_error() -> None:
    core = RingCore(max_streams=1)
    core.attach(Attach("w", 1))
    (sid,) = park(core)
    core.claim("w", Claim(1))
    assert core.cancel(sid) == [ToWorker("w", Cancel(sid))]
    assert core.respond("w", ResponseHead(sid, 200)) == []
    assert core.respond("w", ResponseError(sid, "stopped")) == []
    assert_empty(core)


@pytest.mark.parametrize(
    ("before", "message", "match"),
    [
        ([], ResponseData(1, b"x"), "ResponseData is illegal on stream 1 in state ASSIGNED"),
        ([], ResponseEnd(1), "ResponseEnd is illegal .* ASSIGNED"),
        ([ResponseHead(1, 200)], ResponseHead(1, 200), "ResponseHead is illegal .* RESPONDING"),
        ([], ResponseData(2, b"x"), "does not hold stream 2"),  # parked, nobody's
        ([], ResponseEnd(99), "does not hold stream 99"),  # unknown
        ([ResponseHead(1, 200), ResponseEnd(1)], ResponseData(1, b"x"), "does not hold stream 1"),
    ],
)
def test_out_of_order_responses_are_protocol_errors_that_change_nothing(
    before: list[ResponseHead | ResponseEnd], message: ResponseData | ResponseEnd, match: str
) -> None:
    core = RingCore(max_streams=4)
    core.attach(Attach("w", 1))
    park(core, 2)
    core.claim("w", Claim(1))
    for earlier in before:
        core.respond("w", earlier)
    stats = core.stats()
    with pytest.raises(ProtocolError, match=match) as info:
        core.respond("w", message)
    assert info.value.offending == message
    assert core.stats() == stats


def test_only_the_holding_worker_may_respond() -> None:
    core = RingCore(max_streams=4)
    core.attach(Attach("a", 1))
    core.attach(Attach("b", 1))
    (sid,) = park(core)
    core.claim("a", Claim(1))
    with pytest.raises(ProtocolError, match="'b' does not hold stream"):
        core.respond("b", ResponseHead(sid, 200))
    with pytest.raises(ProtocolError, match="'c' is not attached"):
        core.respond("c", ResponseHead(sid, 200))
    with pytest.raises(ProtocolError, match="'b' does not hold"):
        core.release("b", sid)
    assert core.state(sid) is StreamState.ASSIGNED


def test_workers_attach_once_and_send_only_worker_messages() -> None:
    core = RingCore(max_streams=4)
    core.attach(Attach("w", 1))
    with pytest.raises(ProtocolError, match="already attached"):
        core.attach(Attach("w", 4))
    for message in (Attach("w", 1), Assign(1, HEAD), Cancel(1)):
        with pytest.raises(ProtocolError, match="may not send") as info:
            core.receive("w", message)
        assert info.value.offending is message
    with pytest.raises(ProtocolError, match="not attached"):
        core.heartbeat("x", Heartbeat(0, 1, 1))


def test_heartbeats_are_stored_for_stats() -> None:
    core = RingCore(max_streams=4)
    core.attach(Attach("w", 8))
    assert core.stats().workers[0].capacity is None
    assert core.receive("w", Heartbeat(inflight=2, max_inflight=6, available_slots=4)) == []
    (worker,) = core.stats().workers
    assert (worker.worker_id, worker.max_inflight) == ("w", 8)
    assert worker.capacity == Heartbeat(2, 6, 4)


def test_detach_requeues_streams_without_a_head_and_fails_the_others() -> None:
    core = RingCore(max_streams=10)
    core.attach(Attach("a", 4))
    core.attach(Attach("b", 4))
    s1, s2, s3, s4, s5 = park(core, 5)
    core.claim("a", Claim(4))  # a holds s1..s4
    core.respond("a", ResponseHead(s2, 200))
    core.respond("a", ResponseData(s2, b"partial"))
    core.cancel(s4)

    effects = core.detach("a", "killed")
    assert effects == [
        ToClient(s2, ResponseError(s2, "worker 'a' detached mid-response: killed")),
    ]
    # s1 and s3 are parked again, ahead of s5 which arrived after them; s4 is forgotten.
    assert [core.state(s) for s in (s1, s2, s3, s4, s5)] == [StreamState.PARKED, None] * 2 + [
        StreamState.PARKED
    ]
    assert core.stats().parked == 3
    assert [w.worker_id for w in core.stats().workers] == ["b"]
    assert assigned(core.claim("b", Claim(3))) == [("b", s1), ("b", s3), ("b", s5)]


def test_detach_hands_requeued_streams_to_a_waiting_worker_at_once() -> None:
    core = RingCore(max_streams=10)
    core.attach(Attach("a", 1))
    core.attach(Attach("b", 1))
    (sid,) = park(core)
    core.claim("a", Claim(1))
    core.claim("b", Claim(1))
    assert core.receive("a", Detach("bye")) == [ToWorker("b", Assign(sid, HEAD, b"body 0"))]


def test_a_stream_that_outlives_max_assignments_workers_fails() -> None:
    core = RingCore(max_streams=10, max_assignments=2)
    (sid,) = park(core)
    for worker in ("a", "b"):
        core.attach(Attach(worker, 1))
        core.claim(worker, Claim(1))
        effects = core.detach(worker, "crashed")
    assert effects == [
        ToClient(
            sid,
            ResponseError(
                sid,
                "worker 'b' detached before responding: crashed (the stream was assigned 2 times)",
            ),
        )
    ]
    assert_empty(core)


def test_max_assignments_of_one_turns_requeueing_off() -> None:
    core = RingCore(max_streams=10, max_assignments=1)
    core.attach(Attach("a", 1))
    park(core)
    core.claim("a", Claim(1))
    effects = core.detach("a")
    assert len(effects) == 1
    assert isinstance(effects[0], ToClient)
    assert isinstance(effects[0].message, ResponseError)
    assert_empty(core)


def test_release_requeues_at_the_front_without_counting_an_assignment() -> None:
    core = RingCore(max_streams=10, max_assignments=2)
    core.attach(Attach("w", 2))
    s1, s2 = park(core, 2)
    core.claim("w", Claim(1))
    assert core.release("w", s1) == []
    assert core.state(s1) is StreamState.PARKED
    assert assigned(core.claim("w", Claim(1))) == [("w", s1)]  # still first in line
    # Assigned twice but released once: one worker death leaves it a second chance.
    core.detach("w")
    assert core.state(s1) is StreamState.PARKED

    core.attach(Attach("w", 2))
    core.claim("w", Claim(2))
    core.respond("w", ResponseHead(s1, 200))
    with pytest.raises(ProtocolError, match="cannot be released"):
        core.release("w", s1)
    core.respond("w", ResponseEnd(s1))
    core.cancel(s2)
    assert core.release("w", s2) == []  # releasing a cancelled stream acknowledges it
    assert_empty(core)


def test_nothing_is_left_after_many_streams_finish_every_way() -> None:
    core = RingCore(max_streams=8)
    core.attach(Attach("a", 8))
    for _ in range(50):
        ids = park(core, 8)
        core.cancel(ids[0])  # cancelled while parked
        core.claim("a", Claim(7))
        for sid in ids[1:3]:
            core.respond("a", ResponseHead(sid, 200))
            core.respond("a", ResponseData(sid, b"x"))
            core.respond("a", ResponseEnd(sid))
        core.respond("a", ResponseError(ids[3], "bad"))
        core.respond("a", ResponseHead(ids[4], 200))
        core.cancel(ids[4])
        core.respond("a", ResponseEnd(ids[4]))
        core.cancel(ids[5])
        core.respond("a", ResponseError(ids[5], "ack"))
        core.release("a", ids[6])
        core.cancel(ids[6])
        core.respond("a", ResponseHead(ids[7], 200))
        core.respond("a", ResponseEnd(ids[7]))
        assert_empty(core)
    core.detach("a")
    assert core.stats().workers == ()
    assert core.open_streams == 0


def test_worker_and_ring_talk_through_bytes_only() -> None:
    """Two ends joined by byte strings, as a network transport would join them."""
    core = RingCore(max_streams=4)
    to_ring, to_worker = FrameDecoder(), FrameDecoder()

    def worker_sends(*messages: Message) -> list[Message]:
        to_ring.receive_data(b"".join(encode(m) for m in messages))
        out: list[Message] = []
        while (message := to_ring.next_message()) is not None:
            if isinstance(message, Attach):
                core.attach(message)
                continue
            for effect in core.receive("w", message):
                if isinstance(effect, ToWorker):
                    to_worker.receive_data(encode(effect.message))
                else:
                    out.append(effect.message)  # what the client would see
        return out

    def worker_receives() -> list[Message]:
        return decode_all(b"", to_worker)

    assert worker_sends(Attach("w", 2), Heartbeat(0, 2, 2), Claim(2)) == []
    sid, effects = core.park(HEAD, b"{}")
    for effect in effects:
        assert isinstance(effect, ToWorker)
        to_worker.receive_data(encode(effect.message))
    assert worker_receives() == [Assign(sid, HEAD, b"{}")]
    client_sees = worker_sends(
        ResponseHead(sid, 200, [("content-type", "text/event-stream")]),
        ResponseData(sid, b"data: hi\n\n"),
        ResponseEnd(sid),
    )
    assert client_sees == [
        ResponseHead(sid, 200, [("content-type", "text/event-stream")]),
        ResponseData(sid, b"data: hi\n\n"),
        ResponseEnd(sid),
    ]
    assert worker_sends(Detach("done")) == []
    assert core.stats().workers == ()
    assert_empty(core)


@pytest.mark.parametrize("state", [StreamState.ASSIGNED, StreamState.RESPONDING])
@pytest.mark.parametrize(
    "message",
    [
        ResponseHead(1, 200),
        ResponseData(1, b"x"),
        ResponseEnd(1),
        ResponseError(1, "e"),
        Release(1),
    ],
    ids=lambda m: type(m).__name__,
)
def test_the_core_follows_its_transition_table(state: StreamState, message: Message) -> None:
    """Every (state, message) pair does what TRANSITIONS says, or is refused changing nothing."""
    core = RingCore(4)
    core.attach(Attach("w", 1))
    core.park(HEAD)
    core.claim("w", Claim(1))
    if state is StreamState.RESPONDING:
        core.respond("w", ResponseHead(1, 200))
    expected = TRANSITIONS[state].get(type(message))
    if expected is None:
        with pytest.raises(ProtocolError):
            core.receive("w", message)
        assert core.state(1) is state
        return
    core.receive("w", message)
    if expected in (StreamState.ENDED, StreamState.FAILED):
        assert core.state(1) is None  # finished and forgotten
    else:
        assert core.state(1) is expected


def test_encode_available_writes_what_piled_up_as_one_chunk() -> None:
    send, receive = trio.open_memory_channel[Message](10)
    for message in (Credit(1, 1), Cancel(2)):
        send.send_nowait(message)
    data = encode_available(Claim(3), receive)
    assert decode_all(data) == [Claim(3), Credit(1, 1), Cancel(2)]
    assert encode_available(Claim(1), receive) == encode(Claim(1))  # nothing waits any more
