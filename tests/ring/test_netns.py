"""Faults a network makes, on test hosts of the project's own (``tests/_netns.py``): ingresses,
workers and a client each on a host (a network namespace) on one bridge, real processes, real
TLS, the gemma test model. A link set down is a partition: no FIN, no RST, packets vanish.

- a worker host partitioned mid-stream, then healed: its started stream fails cleanly, an
  unstarted one goes to the other worker, the partitioned worker gives up the ingress it cannot
  hear and re-attaches after the heal, and nothing leaks on either side;
- a worker host that vanishes for good is declared dead within ``--worker-timeout``;
- an ingress partitioned from both workers: the other ingress's clients see nothing, and the
  workers come back to it by themselves;
- a black hole at a worker's first dial: the dial gives up within its bound and retries;
- workers following one name for every ingress (each host's hosts file, rewritten while they
  run): an ingress added and one rolled away under load, nothing lost.

Needs root and ``ip netns`` (CI runs as root); skipped with the reason otherwise.
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import os
import re
import signal
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import attrs
import httpx
import pytest

from llmtrio.api import CHAT_PATH

from .._helpers import wait_until
from .._netns import Host, Topology, unavailable
from .._procs import Proc, Ring

_WHY = unavailable()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_WHY is not None, reason=f"no test hosts: {_WHY}"),
]

NAME = "ingress.lt19"
PUBLIC, CONTROL, METRICS = 8443, 9443, 9090
TIMEOUT_S = 3  # --worker-timeout at the ingresses, --ingress-timeout at the workers
T = TypeVar("T")


@attrs.define
class NetIngress:
    host: Host
    proc: Proc
    ca: Path

    @property
    def url(self) -> str:
        return f"https://{self.host.address}:{PUBLIC}"

    @property
    def control(self) -> str:
        return f"wss://{self.host.address}:{CONTROL}"


@attrs.define
class Net:
    """The hosts, the processes on them, and a client host's threads."""

    topology: Topology
    ring: Ring
    pool: concurrent.futures.ThreadPoolExecutor
    tls: ssl.SSLContext

    def ingress(self, role: str, *extra: str) -> NetIngress:
        host = self.topology.hosts[role]
        cert = self.ring.tmp / f"{role}.pem"
        issued = self.ring.ingress_ca.issue_cert(NAME, host.address)
        issued.private_key_and_cert_chain_pem.write_to_path(str(cert))
        proc = self.ring.spawn(
            role,
            "serve", "--no-local-worker", "--host=0.0.0.0", f"--port={PUBLIC}",
            f"--tls-cert={cert}", f"--tls-key={cert}",
            "--control-host=0.0.0.0", f"--control-port={CONTROL}",
            f"--control-cert={cert}", f"--control-key={cert}",
            f"--control-ca={self.ring.tmp / 'worker-ca.pem'}",
            f"--worker-timeout={TIMEOUT_S}", "--cancel-ack-timeout=3", "--graceful-timeout=2",
            *extra,
            prefix=host.prefix(),
        )  # fmt: skip
        proc.wait_for(r"serving .*? on https://")
        proc.wait_for(r"control listener for workers on wss://")
        return NetIngress(host, proc, self.ring.tmp / "ingress-ca.pem")

    def worker(self, role: str, urls: list[str], *extra: str) -> Proc:
        return self.ring.spawn(
            role,
            "worker", *(f"--ingress-url={url}" for url in urls),
            f"--tls-cert={self.ring.certificate(role)}", f"--ca={self.ring.tmp / 'ingress-ca.pem'}",
            f"--model={self.ring.gemma}", "--max-inflight=2", "--ctx-size=1024", "--threads=1",
            f"--ingress-timeout={TIMEOUT_S}", "--resolve-interval=0.5",
            *extra,
            prefix=self.topology.hosts[role].prefix(),
        )  # fmt: skip

    def call(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        """Run ``fn`` on the client host and wait for it."""
        return self.pool.submit(fn, *args, **kwargs).result()

    def health(self, ingress: NetIngress) -> dict[str, Any]:
        def get() -> dict[str, Any]:
            data: dict[str, Any] = httpx.get(
                ingress.url + "/health", verify=self.tls, timeout=10
            ).json()
            return data

        return self.call(get)

    def workers(self, ingress: NetIngress) -> dict[str, dict[str, Any]]:
        return {str(w["id"]).split("#")[0]: w for w in self.health(ingress)["workers"]}

    def wait_workers(self, ingress: NetIngress, names: set[str], timeout: float = 90) -> float:
        """Wait until exactly ``names`` are attached to ``ingress``; the seconds it took."""
        started = time.monotonic()
        wait_until(
            lambda: set(self.workers(ingress)) == names,
            lambda: f"{ingress.host.role}: {names} attached: {self.workers(ingress)}",
            within=timeout,
        )
        return time.monotonic() - started


@pytest.fixture
def net(tmp_path: Path, gemma_path: Path) -> Iterator[Net]:
    roles = ["i0", "i1", "i2", "w0", "w1", "c"]
    with Topology.opened(roles) as topology, Ring.opened(tmp_path, gemma_path) as ring:
        tls = ssl.create_default_context(cafile=str(tmp_path / "ingress-ca.pem"))
        with topology.hosts["c"].clients(16) as pool:
            yield Net(topology, ring, pool, tls)
    # Ring.opened killed the processes before the hosts went away.


@attrs.frozen
class Result:
    status: int
    worker: str
    events: list[object]  # the SSE events; or the JSON body alone, not streamed
    streamed: bool
    ended_at: float

    @property
    def completed(self) -> bool:
        """A whole answer: ``[DONE]`` after no error, or a JSON body with choices."""
        if self.status != 200 or not self.events:
            return False
        if self.streamed:
            return self.events[-1] == "[DONE]" and self.error_code is None
        body = self.events[0]
        return isinstance(body, dict) and bool(body.get("choices"))

    @property
    def error_code(self) -> str | None:
        errors = [e for e in self.events if isinstance(e, dict) and "error" in e]
        return str(errors[-1]["error"].get("code")) if errors else None


def chat(
    net: Net,
    url: str,
    max_tokens: int,
    *,
    stream: bool = True,
    first: Callable[[], None] = lambda: None,
) -> Result:
    """One chat completion, on the client host: its status, worker and events (the JSON body
    as the only event when not streamed); ``first`` is called at the first token."""
    body = {
        "messages": [{"role": "user", "content": "Once upon a time"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": stream,
    }
    with (
        httpx.Client(verify=net.tls, timeout=120) as client,
        client.stream("POST", url + CHAT_PATH, json=body) as response,
    ):
        worker = response.headers.get("x-llmtrio-worker", "").split("#")[0]
        if not stream or response.status_code != 200:
            response.read()
            status, body = response.status_code, response.json()
            return Result(status, worker, [body], False, time.monotonic())
        events: list[object] = []
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append("[DONE]" if line == "data: [DONE]" else json.loads(line[6:]))
            if len(events) == 1:
                first()
    return Result(200, worker, events, True, time.monotonic())


def open_files(proc: Proc) -> int:
    return len(os.listdir(f"/proc/{proc.popen.pid}/fd"))


def wait_files_settled(proc: Proc, baseline: int) -> None:
    """Wait until ``proc`` has no more open files than ``baseline`` (sockets take a moment to
    close)."""
    wait_until(
        lambda: open_files(proc) <= baseline,
        lambda: f"{proc.name}: {baseline} open files, not {open_files(proc)}",
        within=30,
        every=0.2,
    )


def idle(net: Net, ingress: NetIngress) -> dict[str, Any]:
    """``ingress``'s /health once nothing is parked, served, held or in flight."""

    def quiet() -> dict[str, Any] | None:
        health = net.health(ingress)
        ring, workers = health["ring"], health["workers"]
        busy = (
            ring["parked"]
            or ring["serving"]
            or any(w["held"] or (w["capacity"] or {}).get("inflight") for w in workers)
        )
        return None if busy else health

    return wait_until(quiet, lambda: f"idle: {net.health(ingress)}", within=30, every=0.1)


def test_a_worker_host_partitioned_mid_stream_then_healed(net: Net) -> None:
    i0 = net.ingress("i0")
    w0 = net.worker("w0", [i0.control], f"--metrics-port={METRICS}", "--metrics-host=0.0.0.0")
    net.wait_workers(i0, {"w0"})
    assert net.call(chat, net, i0.url, 4).completed
    idle(net, i0)
    files = {"i0": open_files(i0.proc), "w0": open_files(w0)}

    # A stream started on w0; w1 joins; w0's cable is cut.
    out = concurrent.futures.Future[None]()
    doomed = net.pool.submit(chat, net, i0.url, 1000, first=lambda: out.set_result(None))
    out.result(timeout=120)
    w1 = net.worker("w1", [i0.control])
    net.wait_workers(i0, {"w0", "w1"})
    net.topology.cut("w0")
    cut_at = time.monotonic()
    # Sent during the partition: w0 still has a free slot claimed, so the ring may hand this
    # one to w0, which never starts it: it is requeued to w1 when w0 is declared dead.
    unstarted = net.pool.submit(chat, net, i0.url, 8, stream=False)

    failed = doomed.result(timeout=120)
    assert failed.worker == "w0" and failed.error_code == "worker_failed", failed.events[-3:]
    served = unstarted.result(timeout=120)
    assert served.status == 200 and served.worker == "w1", served
    i0.proc.wait_for(r"worker w0#\d+: silent for 3s: declared dead")
    # The worker gives up the ingress it cannot hear, and cancels what it generated for it.
    w0.wait_for(rf"ingress {re.escape(i0.host.address)}:{CONTROL}: .*answered no ping for 3s")
    assert failed.ended_at - cut_at < 30  # the worker timeout, not TCP's (many minutes)

    net.topology.heal("w0")
    reattached = net.wait_workers(i0, {"w0", "w1"})
    print(f"\nw0 re-attached {reattached:.1f}s after the heal")
    health = idle(net, i0)
    workers = {str(w["id"]).split("#")[0]: w for w in health["workers"]}
    assert workers["w0"]["held"] == 0 and workers["w0"]["capacity"]["inflight"] == 0
    assert net.call(chat, net, i0.url, 4).completed
    idle(net, i0)
    wait_files_settled(i0.proc, files["i0"])
    wait_files_settled(w0, files["w0"])
    w1.stop()


def test_a_worker_host_that_vanishes_is_declared_dead_within_the_worker_timeout(
    net: Net,
) -> None:
    i0 = net.ingress("i0")
    net.worker("w0", [i0.control])
    net.wait_workers(i0, {"w0"})
    out = concurrent.futures.Future[None]()
    doomed = net.pool.submit(chat, net, i0.url, 1000, first=lambda: out.set_result(None))
    out.result(timeout=120)
    net.topology.cut("w0")  # for good
    cut_at = time.monotonic()
    failed = doomed.result(timeout=120)
    assert failed.error_code == "worker_failed", failed.events[-3:]
    assert failed.ended_at - cut_at < 30  # TIMEOUT_S after its last heartbeat; TCP: minutes
    i0.proc.wait_for(r"worker w0#\d+: silent for 3s: declared dead")
    assert net.workers(i0) == {}


def test_an_ingress_partitioned_from_the_workers_costs_the_other_ingress_nothing(
    net: Net,
) -> None:
    i0, i1 = net.ingress("i0"), net.ingress("i1")
    workers = [net.worker(role, [i0.control, i1.control]) for role in ("w0", "w1")]
    for ingress in (i0, i1):
        net.wait_workers(ingress, {"w0", "w1"})

    # Requests to i1 all along, while i0 is cut off for twice the timeouts, then healed.
    stop = concurrent.futures.Future[None]()

    def keep_asking() -> list[Result]:
        results = []
        while not stop.done():
            results.append(chat(net, i1.url, 24))
        return results

    load = [net.pool.submit(keep_asking) for _ in range(3)]
    try:
        time.sleep(2)
        net.topology.cut("i0")
        for proc in workers:
            proc.wait_for(rf"ingress {re.escape(i0.host.address)}:{CONTROL}: .*answered no ping")
        net.topology.heal("i0")
        reattached = net.wait_workers(i0, {"w0", "w1"})
        print(f"\nboth workers back on i0 {reattached:.1f}s after the heal")
    finally:
        stop.set_result(None)
    results = [result for future in load for result in future.result(timeout=300)]
    assert len(results) >= 3
    assert all(result.completed for result in results), [r for r in results if not r.completed]
    idle(net, i0)
    idle(net, i1)


def test_a_black_hole_at_the_first_dial_times_out_and_retries(net: Net) -> None:
    i0 = net.ingress("i0")
    net.topology.black_hole("w0", "i0")  # dropped, not refused: no answer at all
    w0 = net.worker("w0", [i0.control])
    bound = rf"ingress {re.escape(i0.host.address)}:{CONTROL}: no control handshake .* within 5s"
    w0.wait_for(bound, 120)
    assert net.workers(i0) == {}
    # Retried after its backoff, and again given up within the bound.
    tries = len(re.findall(bound, w0.text()))
    wait_until(lambda: len(re.findall(bound, w0.text())) > tries, within=60, every=0.1)
    net.topology.unblock("w0", "i0")
    net.wait_workers(i0, {"w0"})
    assert net.call(chat, net, i0.url, 4).completed


def test_workers_follow_one_name_through_a_rolling_restart_under_load(net: Net) -> None:
    """Each worker host resolves ``ingress.lt19`` from its own hosts file (a real resolver:
    glibc's); an ingress is added, and one rolled away (out of the load balancer, SIGTERM,
    gone from the name) while requests run; every request completes."""
    i0, i1 = net.ingress("i0", "--graceful-timeout=60"), net.ingress("i1")
    names = {NAME: [i0.host.address, i1.host.address]}
    workers = []
    for role in ("w0", "w1"):
        net.topology.hosts[role].write_hosts(names)
        workers.append(net.worker(role, [f"wss://{NAME}:{CONTROL}"]))
    for ingress in (i0, i1):
        net.wait_workers(ingress, {"w0", "w1"})

    # A load balancer of the test's own: it sends to the ingresses it has in `up`, and sends
    # again elsewhere what one refuses as it goes away (a 503 shutting_down or a refused
    # connection: never processed).
    up = [i0, i1]
    lock = threading.Lock()  # `up` and `sending` change together
    sending: collections.Counter[str] = collections.Counter()  # the load's, by host
    resent = 0
    results: list[Result] = []
    stop = concurrent.futures.Future[None]()

    def client(seed: int) -> None:
        nonlocal resent
        turn = seed
        while not stop.done():
            turn += 1
            with lock:
                target = up[turn % len(up)]
                sending[target.host.role] += 1
            try:
                result = chat(net, target.url, 8, stream=turn % 2 == 0)
            except httpx.ConnectError:
                result = None
            finally:
                with lock:
                    sending[target.host.role] -= 1
            if result is None or (result.status == 503 and "shutting_down" in str(result)):
                assert target not in up, result  # only the ingress taken out refuses
                resent += 1
                continue
            results.append(result)

    load = [net.pool.submit(client, seed) for seed in range(6)]  # more than the 4 slots
    try:
        time.sleep(3)
        # An ingress added: both workers find it.
        i2 = net.ingress("i2")
        names[NAME].append(i2.host.address)
        for role in ("w0", "w1"):
            net.topology.hosts[role].write_hosts(names)
        net.wait_workers(i2, {"w0", "w1"})
        up.append(i2)
        time.sleep(2)
        # i0 rolled away as Kubernetes does it: out of the Service (its name and the
        # balancer), then SIGTERMed; it drains what it holds and exits 0. Requests still
        # parked on it need workers: the workers no longer dial it, but keep claiming from it
        # until it detaches.
        with lock:
            up.remove(i0)
        names[NAME].remove(i0.host.address)
        for role in ("w0", "w1"):
            net.topology.hosts[role].write_hosts(names)
        gone = rf"ingress {NAME}:{CONTROL} at {re.escape(i0.host.address)} is gone from DNS"
        for proc in workers:
            proc.wait_for(gone)

        def in_i0() -> int:
            """Requests i0 holds, parked or being served."""
            ring = net.health(i0)["ring"]
            return int(ring["parked"]) + int(ring["serving"])

        # The load's last requests to i0 end first, so that i0 then holds late requests only
        # (counting the load's as late ones sent the SIGTERM before a late one had arrived).
        wait_until(
            lambda: not (sending["i0"] or in_i0()),
            lambda: f"the load's requests to i0 ended: {net.health(i0)}",
            every=0.02,
        )
        late = [net.pool.submit(chat, net, i0.url, 8, stream=False) for _ in range(6)]

        def arrived() -> int:
            """Late requests in i0 (parked or served) or answered already: one still
            connecting at the SIGTERM would be refused (a 503), not drained."""
            return in_i0() + sum(f.done() for f in late)

        # Some of them wait on i0 for a slot.
        wait_until(lambda: arrived() >= len(late), lambda: net.health(i0), within=30, every=0.02)
        i0.proc.popen.send_signal(signal.SIGTERM)
        late_results = [future.result(timeout=180) for future in late]
        assert all(result.completed for result in late_results), [
            (result.status, result.error_code, result.completed) for result in late_results
        ]
        assert i0.proc.popen.wait(timeout=120) == 0, i0.proc.text()[-2000:]
        time.sleep(2)
    finally:
        stop.set_result(None)
        for future in load:
            future.result(timeout=300)
    lost = [r for r in results if not r.completed]
    print(f"\n{len(results)} requests, {resent} refused by the ingress going away and sent again")
    assert len(results) >= 12 and lost == []
    # i0 is not dialed again (its address left the name); the others serve on.
    for ingress in (i1, i2):
        assert set(net.workers(ingress)) == {"w0", "w1"}
        idle(net, ingress)
