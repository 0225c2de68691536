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
from functools import partial
from io import BytesIO
from pathlib import Path

import pytest
import trio

from llmtrio.api import CHAT_PATH
from llmtrio.ring import (
    Assign,
    Attach,
    Claim,
    ClaimedStream,
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

from .._helpers import eventually
from .test_ring_protocol import decode_all
from .test_ring_remote import Pki, pki, start_ingress, worker

__all__ = ["pki"]  # the fixture, used here as in test_ring_remote

ROOT = Path(__file__).resolve().parents[2]
PREVIOUS = "4b3693f8ea2b8bd7f72c5e01b834dbdd982dc023"
"""The commit issue 16 started from: ends without outcomes, protocol version 1."""

HEAD = RequestHead("POST", CHAT_PATH, [])
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


# -- across versions, over the real control channel ---------------------------------------------

PREVIOUS_WORKER = """
import os, sys, trio
import llmtrio
from llmtrio.ring import client_ssl_context, connect_ring
assert llmtrio.__file__.startswith(os.getcwd()), llmtrio.__file__  # the previous version

async def main(url, cert, ca):
    context = client_ssl_context(cert, None, ca)
    async with connect_ring([url], context, worker_id="old", max_inflight=2) as link:
        async def slot():
            while True:
                claimed = await link.claim()
                with claimed:
                    await claimed.send_head(200, [("x-worker", "old")])
                    for i in range(12):
                        await claimed.send(b"%d;" % i)
                    await claimed.end(claimed.body)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(slot)
            nursery.start_soon(slot)

trio.run(main, *sys.argv[1:])
"""

PREVIOUS_INGRESS = """
import json, os, sys, trio
import llmtrio
from llmtrio.ring import ControlConfig, RequestHead, Ring, serve_control, server_ssl_context
assert llmtrio.__file__.startswith(os.getcwd()), llmtrio.__file__  # the previous version

async def main(cert, ca):
    ring = Ring(max_streams=16, response_buffer=2)
    context = server_ssl_context(cert, cert, ca)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_control, ring, ControlConfig(context, port=0, credits=3))
        print(url, flush=True)
        with trio.fail_after(30):
            while not ring.stats().workers:
                await trio.sleep(0.01)
            bodies = []
            for i in range(5):
                with ring.park(RequestHead("POST", "/x"), b"r%d" % i) as stream:
                    await stream.response_head()
                    bodies.append(b"".join([chunk async for chunk in stream.body()]).decode())
        print(json.dumps(bodies), flush=True)
        nursery.cancel_scope.cancel()

trio.run(main, *sys.argv[1:])
"""


async def next_line(stream: trio.abc.ReceiveStream, pending: bytearray) -> str:
    """The next line ``stream`` writes; what is read past it stays in ``pending``."""
    while b"\n" not in pending:
        data = await stream.receive_some()
        if not data:
            raise EOFError(f"the stream ended after {bytes(pending)!r}")
        pending += data
    line, _, rest = bytes(pending).partition(b"\n")
    pending[:] = rest
    return line.decode()


async def start_previous(
    nursery: trio.Nursery, previous: Path, script: str, *args: object
) -> trio.Process:
    """Run ``script`` on the previous version, its output piped; killed with ``nursery``."""
    command = [sys.executable, "-c", script, *map(str, args)]
    env = {**os.environ, "PYTHONPATH": str(previous)}
    start = partial(
        trio.run_process, command, check=False, cwd=previous, env=env, stdout=subprocess.PIPE
    )
    process: trio.Process = await nursery.start(start)
    return process


async def test_a_worker_of_the_previous_version_serves_this_ingress(
    previous: Path, pki: Pki
) -> None:
    ring = Ring(max_streams=16, response_buffer=2)
    async with trio.open_nursery() as nursery:
        url = await start_ingress(nursery, pki, ring, credits=3)
        await start_previous(
            nursery, previous, PREVIOUS_WORKER, url, pki.worker("old"), pki.ingress_ca
        )
        await eventually(lambda: ring.stats().workers, within=30)
        with trio.fail_after(30):
            streams = [ring.park(HEAD, b"r%d" % i) for i in range(5)]
            for i, stream in enumerate(streams):
                head = await stream.response_head()
                assert dict(head.headers)["x-worker"] == "old"
                body = b"".join([chunk async for chunk in stream.body()])
                assert body == b"".join(b"%d;" % n for n in range(12)) + b"r%d" % i
                assert stream.outcome is None  # it states none
        nursery.cancel_scope.cancel()


async def test_this_worker_serves_an_ingress_of_the_previous_version(
    previous: Path, pki: Pki
) -> None:
    async def answer(claimed: ClaimedStream) -> None:
        await claimed.send_head(200, [("x-worker", "new")])
        for n in range(12):
            await claimed.send(b"%d;" % n)
        await claimed.end(claimed.body, outcome=STOP)

    async with trio.open_nursery() as nursery:
        ingress = await start_previous(
            nursery, previous, PREVIOUS_INGRESS, pki.ingress, pki.worker_ca
        )
        assert ingress.stdout is not None
        pending = bytearray()
        with trio.fail_after(60):
            url = await next_line(ingress.stdout, pending)
            async with worker(pki, [url], "new", answer):
                output = await next_line(ingress.stdout, pending)
        assert json.loads(output) == [
            "".join(f"{n};" for n in range(12)) + f"r{i}" for i in range(5)
        ]
        nursery.cancel_scope.cancel()
