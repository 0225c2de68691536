"""What a response ended with (``Outcome``, stated by its worker on ``ResponseEnd`` and
``ResponseError``) and the request's routing key (``Ring.park(key=...)``): on the wire, in
process, and between this version and the previous one."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path

import pytest

from llmtrio.ring import (
    Assign,
    Attach,
    Claim,
    FrameDecoder,
    Message,
    Outcome,
    ProtocolError,
    RequestHead,
    ResponseEnd,
    ResponseError,
    Ring,
    RingCore,
    StreamState,
    WorkerFailedError,
    encode,
)

from .test_ring_protocol import decode_all

ROOT = Path(__file__).resolve().parent.parent
PREVIOUS = "4b3693f8ea2b8bd7f72c5e01b834dbdd982dc023"
"""The commit issue 16 started from: ends without outcomes, protocol version 1."""

HEAD = RequestHead("POST", "/v1/chat/completions", [])
STOP = Outcome(finish_reason="stop", prompt_tokens=12, cached_tokens=8, completion_tokens=5)
FAILED = Outcome(error_code="context_length_exceeded", prompt_tokens=9000)


def frame(code: int, header: object) -> bytes:
    """A frame as any version writes it: compact JSON, no payload."""
    body = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack(">IBI", 5 + len(body), code, len(body)) + body


# -- on the wire ----------------------------------------------------------------------------------


def test_an_end_without_an_outcome_is_the_frame_the_previous_version_writes() -> None:
    assert encode(ResponseEnd(7)) == frame(7, {"stream_id": 7})
    assert encode(ResponseError(7, "boom")) == frame(8, {"stream_id": 7, "message": "boom"})
    assert decode_all(frame(7, {"stream_id": 7})) == [ResponseEnd(7)]
    (error,) = decode_all(frame(8, {"stream_id": 7, "message": "boom"}))
    assert isinstance(error, ResponseError) and error.outcome is None


def test_an_outcome_is_an_object_of_its_stated_keys_only() -> None:
    assert encode(ResponseEnd(7, outcome=STOP)) == frame(
        7,
        {
            "stream_id": 7,
            "outcome": {
                "finish_reason": "stop",
                "prompt_tokens": 12,
                "cached_tokens": 8,
                "completion_tokens": 5,
            },
        },
    )
    assert encode(ResponseError(7, "x", outcome=FAILED)) == frame(
        8,
        {
            "stream_id": 7,
            "message": "x",
            "outcome": {"prompt_tokens": 9000, "error_code": "context_length_exceeded"},
        },
    )
    for message in (
        ResponseEnd(7, outcome=STOP),
        ResponseError(7, "x", outcome=FAILED),
        ResponseEnd(1, outcome=Outcome()),
    ):
        assert decode_all(encode(message)) == [message]


def test_unknown_and_null_outcome_keys_are_read_as_absent() -> None:
    outcome = {"finish_reason": "length", "latency_ms": 4, "prompt_tokens": None}
    header = {"stream_id": 3, "outcome": outcome}
    assert decode_all(frame(7, header)) == [ResponseEnd(3, outcome=Outcome(finish_reason="length"))]


@pytest.mark.parametrize(
    "outcome",
    [5, "stop", [1], {"prompt_tokens": "3"}, {"prompt_tokens": -1}, {"finish_reason": 3}],
)
def test_a_malformed_outcome_is_a_protocol_error(outcome: object) -> None:
    decoder = FrameDecoder()
    decoder.receive_data(frame(7, {"stream_id": 1, "outcome": outcome}))
    with pytest.raises(ProtocolError):
        decoder.next_message()


def test_outcome_values_are_checked_on_construction() -> None:
    with pytest.raises(ValueError):
        Outcome(prompt_tokens=-1)
    with pytest.raises(TypeError):
        Outcome(completion_tokens=True)
    with pytest.raises(TypeError):
        ResponseEnd(1, outcome={"finish_reason": "stop"})  # type: ignore[arg-type]


@pytest.fixture
def previous(tmp_path: Path) -> Path:
    """The previous version's ``llmtrio`` package, unpacked; its parent is a PYTHONPATH."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("no git repository to take the previous version from")
    archive = subprocess.run(
        [git, "-C", str(ROOT), "archive", PREVIOUS, "llmtrio"], capture_output=True, check=False
    )
    if archive.returncode:
        pytest.skip(f"the previous version {PREVIOUS[:10]} is not in this clone (shallow?)")
    folder = tmp_path / "previous"
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(folder, filter="data")
    return folder


PREVIOUS_PEER = """
import json, sys
import llmtrio.ring as ring
decoder = ring.FrameDecoder()
decoder.receive_data(bytes.fromhex(sys.stdin.read()))
read = []
while (message := decoder.next_message()) is not None:
    read.append(repr(message))
written = [ring.encode(ring.ResponseEnd(7)), ring.encode(ring.ResponseError(8, "boom"))]
print(json.dumps({"from": ring.__file__, "read": read, "written": [w.hex() for w in written]}))
"""


def test_the_previous_version_reads_our_ends_and_we_read_its_ends(previous: Path) -> None:
    """A worker of this version ending streams with outcomes on an ingress of the previous
    one, and a worker of the previous one on this ingress: each reads the other's frames."""
    ours: list[Message] = [
        ResponseEnd(7, outcome=STOP),
        ResponseError(8, "boom", outcome=FAILED),
        ResponseEnd(9, outcome=Outcome()),
        ResponseEnd(10),
    ]
    run = subprocess.run(
        [sys.executable, "-c", PREVIOUS_PEER],
        input=b"".join(encode(message) for message in ours).hex(),
        capture_output=True,
        text=True,
        check=True,
        cwd=previous,
        env={**os.environ, "PYTHONPATH": str(previous)},
        timeout=60,
    )
    peer = json.loads(run.stdout)
    assert Path(peer["from"]).is_relative_to(previous)  # the previous version ran
    assert peer["read"] == [
        "ResponseEnd(stream_id=7)",
        "ResponseError(stream_id=8, message='boom')",
        "ResponseEnd(stream_id=9)",
        "ResponseEnd(stream_id=10)",
    ]
    assert decode_all(b"".join(bytes.fromhex(w) for w in peer["written"])) == [
        ResponseEnd(7),
        ResponseError(8, "boom"),
    ]


# -- in process ---------------------------------------------------------------------------------


async def test_the_outcome_a_worker_states_reaches_its_stream() -> None:
    ring = Ring(max_streams=4)
    async with ring.attach("w", max_inflight=2) as link:
        ended, failed = ring.park(HEAD), ring.park(HEAD)
        first, second = await link.claim(), await link.claim()
        await first.send_head(200)
        await first.send(b"a")
        assert ended.outcome is None  # not before the end
        await first.end(b"b", outcome=STOP)
        assert ended.outcome == STOP
        assert [chunk async for chunk in ended.body()] == [b"a", b"b"]
        second.fail("the prompt is too long", outcome=FAILED)
        with pytest.raises(WorkerFailedError, match="too long"):
            await failed.response_head()
        assert failed.outcome == FAILED
        with ring.park(HEAD) as plain:
            claimed = await link.claim()
            await claimed.send_head(200)
            await claimed.end()
            assert plain.outcome is None  # it stated nothing


async def test_no_outcome_when_the_stream_was_cancelled_or_its_worker_went_away() -> None:
    ring = Ring(max_streams=4, max_assignments=1)
    cancelled, orphaned = ring.park(HEAD), ring.park(HEAD)
    with pytest.raises(RuntimeError):
        async with ring.attach("w", max_inflight=2) as link:
            first, _ = await link.claim(), await link.claim()
            await first.send_head(200)
            cancelled.cancel()
            await first.end(outcome=STOP)  # acknowledges the cancel
            raise RuntimeError("the engine died")
    assert cancelled.outcome is None
    with pytest.raises(WorkerFailedError):
        await orphaned.response_head()
    assert orphaned.outcome is None
    assert cancelled.state is StreamState.CANCELLED


# -- the routing key ----------------------------------------------------------------------------


def test_park_keeps_the_routing_key_with_the_stream() -> None:
    ring = Ring(max_streams=4)
    keyed, plain = ring.park(HEAD, b"x", key="gemma-3-270m"), ring.park(HEAD)
    assert (keyed.key, plain.key) == ("gemma-3-270m", "")
    core = RingCore(max_streams=4)
    stream_id, _ = core.park(HEAD, key="qwen")
    assert core.key(stream_id) == "qwen"
    core.cancel(stream_id)
    assert core.key(stream_id) is None
    with pytest.raises(TypeError):
        core.park(HEAD, key=None)  # type: ignore[arg-type]


def test_the_routing_key_stays_at_the_ingress() -> None:
    """Not on the wire yet: a worker's ``Assign`` is the frame the previous version sent."""
    core = RingCore(max_streams=4)
    core.attach(Attach("w", 1))
    core.claim("w", Claim(1))
    stream_id, (effect,) = core.park(HEAD, b"{}", key="gemma")
    assert effect.message == Assign(stream_id, HEAD, b"{}")
    assert b"gemma" not in encode(effect.message)
