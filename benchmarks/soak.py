"""A bounded soak with chaos: a real ring of processes under mixed load, with a worker killed
and an ingress restarted mid-run; at the end every request is accounted for and nothing leaks.

    python benchmarks/soak.py --requests 3000 --duration 900 --model path/to/gemma.gguf

It stops by itself (after ``--requests`` requests or ``--duration`` seconds, whichever comes
first). On loopback:

- two ingresses, ``llmtrio serve --no-local-worker`` with a control listener, and two
  ``llmtrio worker`` processes attached to both, over mutual TLS (trustme: one CA for the
  ingresses, another for the workers), on the gemma test model by default;
- ``--concurrency`` clients send chat and text completions, streamed and not, of mixed prompt
  and output sizes, to either ingress (only to those a load balancer would pick: not one that
  is draining or down); ``--abort`` of them hang up on purpose (mid-stream, or before the
  answer of a request that does not stream);
- chaos: at a quarter of the run worker ``w1`` is SIGKILLed and started again; at half, ingress
  ``i1`` is restarted the way a deploy does it (taken out of the pool, SIGTERM: it drains, exits
  0, and comes back on the same ports; the workers reattach by themselves). A request that
  ingress refused, or closed its kept-alive connection under before answering (the race every
  HTTP/1.1 server has when it closes an idle connection), is sent to the other ingress, as a
  load balancer does; the report counts them. The same from a server not going down is an
  unaccounted request.

With ``--netns`` (root; ``ip netns``), the same ring runs on test hosts of its own
(``tests/_netns.py``: network namespaces on a bridge, nothing of the host's touched): each
ingress and worker on a host, the clients on another; the workers find both ingresses behind
one name (their hosts' files) and the ingresses serve HTTPS. The chaos is a partition every
``--partition-every`` seconds: a worker host's link is cut (w0 and w1 in turn) for
``--partition-for`` seconds, longer than the timeouts at both ends (5 s), then healed; the
report says how long each worker took from the heal to be attached to both ingresses again.

    sudo python benchmarks/soak.py --netns --duration 900 --requests 100000

At the end it prints every request's outcome (completed; an error in OpenAI's shape, by HTTP
status and code, or as an error event in a stream; aborted by its client), checks that
``/health`` shows nothing parked, nothing serving and no slot in use, and compares the open
files and threads of the processes that lived through the whole run (ingress ``i0``, worker
``w0``) with what they had before the load, once idle again; RSS growth is reported. It exits
non-zero on an unaccounted request (a transport error, a truncated stream, a body not in
OpenAI's shape, a hang), on a non-idle end, or on growth in files or threads.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import re
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs
import httpx
import trio
import trustme

ROOT = Path(__file__).resolve().parent.parent
CHAT, TEXT = "/v1/chat/completions", "/v1/completions"
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "the",
    "lazy",
    "dog",
    "while",
    "a",
    "cat",
    "sleeps",
    "in",
    "the",
    "warm",
    "sun",
]


# ----------------------------------------------------------------------------------------------
# Processes


@attrs.define
class Proc:
    """A ``llmtrio`` process logging to a file."""

    name: str
    args: list[str]
    log: Path
    prefix: Sequence[str] = ()  # ip netns exec HOST: where it runs
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                [*self.prefix, sys.executable, "-m", "llmtrio", *self.args],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    async def wait_for(self, pattern: str, limit_s: float = 120, *, after: int = 0) -> None:
        """Wait until the log (from byte ``after`` on) matches ``pattern``."""
        with trio.fail_after(limit_s):
            while not re.search(pattern, self.text()[after:]):
                assert self.popen is not None
                if self.popen.poll() is not None:
                    raise RuntimeError(f"{self.name} exited: {self.text()[-2000:]}")
                await trio.sleep(0.05)

    async def wait_exit(self, limit_s: float) -> int:
        assert self.popen is not None
        with trio.fail_after(limit_s):
            while (code := self.popen.poll()) is None:  # noqa: ASYNC110 (another process)
                await trio.sleep(0.05)
        return code

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(timeout=30)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


NAME = "ingress.lt19"  # the one name for both ingresses, on test hosts


def _netns_module() -> ModuleType:
    """``tests/_netns.py``, the test hosts (loaded by path: this is a script, not a package)."""
    path = ROOT / "tests" / "_netns.py"
    spec = importlib.util.spec_from_file_location("llmtrio_test_hosts", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # attrs resolves the classes' annotations through it
    spec.loader.exec_module(module)
    return module


@attrs.define
class Cluster:
    """Two ingresses and two workers, their certificates in ``tmp``; on test hosts with
    ``topology`` (a ``tests._netns.Topology`` with hosts i0, i1, w0, w1 and c)."""

    tmp: Path
    model: Path
    slots: int
    ctx_size: int
    cache_ram: int
    topology: Any = None
    ingresses: dict[str, Proc] = attrs.field(factory=dict)
    urls: dict[str, str] = attrs.field(factory=dict)
    workers: dict[str, Proc] = attrs.field(factory=dict)
    up: set[str] = attrs.field(factory=set)  # the ingresses a load balancer would pick
    going_down: set[str] = attrs.field(factory=set)  # signalled to stop, not yet back
    verify: ssl.SSLContext | bool = True

    @classmethod
    def create(
        cls,
        tmp: Path,
        model: Path,
        slots: int,
        ctx_size: int,
        cache_ram: int,
        topology: Any = None,
    ) -> Cluster:
        ingress_ca, worker_ca = trustme.CA(), trustme.CA()
        ingress_ca.cert_pem.write_to_path(str(tmp / "ingress-ca.pem"))
        worker_ca.cert_pem.write_to_path(str(tmp / "worker-ca.pem"))
        hosts = topology.hosts if topology is not None else {}
        names = [NAME, *(hosts[name].address for name in ("i0", "i1"))] if hosts else []
        ingress_ca.issue_cert("127.0.0.1", *names).private_key_and_cert_chain_pem.write_to_path(
            str(tmp / "ingress.pem")
        )
        cluster = cls(tmp, model, slots, ctx_size, cache_ram, topology)
        controls = []
        for name in ("i0", "i1"):
            if hosts:  # HTTPS off loopback, on the host's address; fixed ports
                address, http, control = hosts[name].address, 8443, 9443
                cluster.urls[name] = f"https://{address}:{http}"
                cluster.verify = ssl.create_default_context(cafile=str(tmp / "ingress-ca.pem"))
                listen = [
                    "--host=0.0.0.0",
                    f"--tls-cert={tmp / 'ingress.pem'}",
                    f"--tls-key={tmp / 'ingress.pem'}",
                    "--control-host=0.0.0.0",
                ]
            else:
                http, control = _free_port(), _free_port()
                cluster.urls[name] = f"http://127.0.0.1:{http}"
                controls.append(f"--ingress-url=wss://127.0.0.1:{control}")
                listen = []
            cluster.ingresses[name] = Proc(
                name,
                [
                    "serve",
                    "--no-local-worker",
                    f"--port={http}",
                    f"--control-port={control}",
                    *listen,
                    f"--control-cert={tmp / 'ingress.pem'}",
                    f"--control-key={tmp / 'ingress.pem'}",
                    f"--control-ca={tmp / 'worker-ca.pem'}",
                    "--worker-timeout=5",
                    "--cancel-ack-timeout=5",
                    "--graceful-timeout=5",
                    "--park-timeout=30",
                    "--ring-streams=128",
                ],
                tmp / f"{name}.log",
                hosts[name].prefix() if hosts else (),
            )
        if hosts:  # one name for both ingresses, resolved from each worker host's hosts file
            controls = [f"--ingress-url=wss://{NAME}:9443", "--resolve-interval=2"]
            for name in ("w0", "w1"):
                hosts[name].write_hosts({NAME: [hosts["i0"].address, hosts["i1"].address]})
        for name in ("w0", "w1"):
            cert = tmp / f"{name}.pem"
            worker_ca.issue_cert(name).private_key_and_cert_chain_pem.write_to_path(str(cert))
            cluster.workers[name] = Proc(
                name,
                [
                    "worker",
                    *controls,
                    f"--tls-cert={cert}",
                    f"--ca={tmp / 'ingress-ca.pem'}",
                    f"--model={model}",
                    f"--max-inflight={slots}",
                    f"--ctx-size={ctx_size}",
                    f"--cache-ram={cache_ram}",
                    "--threads=1",
                    "--graceful-timeout=5",
                    "--ingress-timeout=5",
                ],
                tmp / f"{name}.log",
                hosts[name].prefix() if hosts else (),
            )
        return cluster

    async def start_ingress(self, name: str) -> None:
        proc = self.ingresses[name]
        mark = len(proc.text()) if proc.log.exists() else 0
        proc.start()
        await proc.wait_for(r"serving .*? on https?://", after=mark)
        await proc.wait_for(r"control listener for workers on wss://", after=mark)

    async def start_worker(self, name: str) -> None:
        proc = self.workers[name]
        mark = len(proc.text()) if proc.log.exists() else 0
        proc.start()
        await proc.wait_for(r"worker ready", after=mark)

    async def health(self, client: httpx.AsyncClient, name: str) -> dict[str, Any]:
        response = await client.get(self.urls[name] + "/health", timeout=10)
        data: dict[str, Any] = response.json()
        return data

    async def wait_attached(self, client: httpx.AsyncClient, limit_s: float = 60) -> None:
        """Until every ingress has both workers attached."""
        with trio.fail_after(limit_s):
            for name in self.ingresses:
                while len((await self.health(client, name))["workers"]) < len(self.workers):  # noqa: ASYNC110
                    await trio.sleep(0.1)

    def stop(self) -> None:
        for proc in [*self.ingresses.values(), *self.workers.values()]:
            proc.kill()


# ----------------------------------------------------------------------------------------------
# Load


@attrs.define
class Tally:
    outcomes: Counter[str] = attrs.field(factory=Counter)
    unaccounted: list[str] = attrs.field(factory=list)
    sent: int = 0
    tokens: int = 0
    refused: int = 0  # connections refused by an ingress going down, sent again elsewhere

    def add(self, outcome: str, detail: str = "") -> None:
        self.outcomes[outcome] += 1
        if outcome.startswith("UNACCOUNTED"):
            self.unaccounted.append(f"{outcome}: {detail}"[:500])


def _is_openai_error(value: object) -> bool:
    if not isinstance(value, dict) or not isinstance(value.get("error"), dict):
        return False
    error = value["error"]
    return isinstance(error.get("message"), str) and isinstance(error.get("type"), str)


def _request(rng: random.Random, max_tokens: int) -> tuple[str, dict[str, Any]]:
    size = rng.choice([3, 10, 40, 150])  # words of prompt
    prompt = " ".join(rng.choice(WORDS) for _ in range(size))
    body: dict[str, Any] = {
        "max_tokens": rng.randint(1, max_tokens),
        "temperature": rng.choice([0, 0.7]),
        "stream": rng.random() < 0.5,
        "ignore_eos": rng.random() < 0.5,
    }
    if rng.random() < 0.6:
        return CHAT, {**body, "messages": [{"role": "user", "content": prompt}]}
    return TEXT, {**body, "prompt": prompt}


class NotAnswered(Exception):
    """The connection failed before a byte of the answer came back: refused, or reset or
    closed under the request (the race of a kept-alive connection that the server closes as
    the request is sent, RFC 9112 9.3.1). Raised for the caller, who knows whether that
    ingress was going down."""


async def _one(
    client: httpx.AsyncClient,
    url: str,
    path: str,
    body: dict[str, Any],
    tally: Tally,
    rng: random.Random,
    *,
    abort: bool = False,
) -> None:
    """Send one request and tally its outcome; ``abort``: hang up on purpose.

    Error handling: :class:`NotAnswered` when the connection failed before the answer began
    (nothing listens at ``url``, or it closed the connection under the request)."""
    answered = False
    try:
        if not body["stream"]:
            with trio.move_on_after(rng.uniform(0.01, 0.5) if abort else 300) as scope:
                async with client.stream("POST", url + path, json=body) as response:
                    answered = True
                    await response.aread()
            if scope.cancelled_caught:
                tally.add("aborted" if abort else "UNACCOUNTED hang", path)
                return
            _tally_json(response, tally)
            return
        with trio.fail_after(300):
            async with client.stream("POST", url + path, json=body) as response:
                answered = True
                if response.status_code != 200:
                    await response.aread()
                    _tally_json(response, tally)
                    return
                events: list[str] = []
                leave_after = rng.randint(1, 4) if abort else None
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
                        if leave_after is not None and len(events) >= leave_after:
                            tally.add("aborted")
                            return
        _tally_events(events, tally)
    except trio.TooSlowError:
        tally.add("UNACCOUNTED hang", path)
    except httpx.ConnectError as exc:
        raise NotAnswered(repr(exc)) from exc
    except httpx.HTTPError as exc:
        if not answered and isinstance(exc, httpx.NetworkError | httpx.RemoteProtocolError):
            raise NotAnswered(repr(exc)) from exc
        tally.add(f"UNACCOUNTED transport {type(exc).__name__}", f"{url}{path}: {exc!r}")


def _tally_json(response: httpx.Response, tally: Tally) -> None:
    try:
        data = response.json()
    except ValueError:
        tally.add(f"UNACCOUNTED {response.status_code} not JSON", response.text[:200])
        return
    if response.status_code == 200 and isinstance(data, dict) and data.get("choices"):
        tally.add("completed")
        tally.tokens += int(data.get("usage", {}).get("completion_tokens", 0))
    elif response.status_code >= 400 and _is_openai_error(data):
        tally.add(f"error {response.status_code} {data['error'].get('code')}")
    else:
        tally.add(f"UNACCOUNTED {response.status_code}", response.text[:200])


def _tally_events(events: list[str], tally: Tally) -> None:
    if events and events[-1] == "[DONE]":
        tally.add("completed (stream)")
        tally.tokens += len(events) - 1
        return
    try:
        last = json.loads(events[-1]) if events else None
    except ValueError:
        last = None
    if _is_openai_error(last):
        assert isinstance(last, dict)
        tally.add(f"error event {last['error'].get('code')}")
    else:
        tally.add("UNACCOUNTED truncated stream", "|".join(events[-3:]))


# ----------------------------------------------------------------------------------------------
# Leaks


@attrs.frozen
class Usage:
    fds: int
    threads: int
    rss_kib: int


def usage(pid: int) -> Usage:
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    return Usage(len(os.listdir(f"/proc/{pid}/fd")), len(os.listdir(f"/proc/{pid}/task")), rss)


async def settled(pid: int, baseline: Usage, limit_s: float = 20) -> Usage:
    """The process's usage once its files and threads came back to ``baseline`` (closing
    sockets and idle worker threads take a moment), or after ``limit_s``."""
    with trio.move_on_after(limit_s):
        while True:
            now = usage(pid)
            if now.fds <= baseline.fds and now.threads <= baseline.threads:
                return now
            await trio.sleep(0.2)
    return usage(pid)


async def idle(cluster: Cluster, client: httpx.AsyncClient, limit_s: float = 60) -> list[str]:
    """Wait until every ingress shows nothing parked, serving or in use; what is still busy."""
    busy: list[str] = []
    with trio.move_on_after(limit_s):
        while True:
            busy = []
            for name in cluster.ingresses:
                health = await cluster.health(client, name)
                ring = health["ring"]
                if ring["parked"] or ring["serving"]:
                    busy.append(f"{name}: ring {ring}")
                for worker in health["workers"]:
                    capacity = worker["capacity"] or {}
                    if worker["held"] or capacity.get("inflight"):
                        busy.append(f"{name}: worker {worker['id']} {worker}")
            if not busy:
                return busy
            await trio.sleep(0.2)
    return busy


# ----------------------------------------------------------------------------------------------
# The run


@attrs.frozen
class SoakConfig:
    model: Path
    requests: int = 3000
    duration: float = 900.0
    concurrency: int = 8
    max_tokens: int = 24
    abort: float = 0.1
    slots: int = 4
    ctx_size: int = 1024
    cache_ram: int = 1024  # MiB of prompt snapshots per worker (the engine's default)
    seed: int = 0
    chaos: bool = True
    progress: bool = False  # a line on stderr every 5% of the requests
    netns: bool = False  # on test hosts, with partitions as the chaos
    partition_every: float = 60.0
    partition_for: float = 8.0


@attrs.define
class SoakResult:
    tally: Tally
    seconds: float
    kills: int
    restarts: int
    leaks: list[str]
    busy: list[str]
    usage: dict[str, tuple[Usage, Usage]]
    exit_codes: dict[str, int]
    caches: dict[str, Any] = attrs.field(factory=dict)
    """Each worker's prompt cache at the end, as ``/health`` shows it."""
    reattached: list[tuple[str, float]] = attrs.field(factory=list)
    """On test hosts: each partitioned worker, and the seconds from the heal until it was
    attached to both ingresses again."""

    @property
    def ok(self) -> bool:
        return (
            not self.tally.unaccounted
            and not self.leaks
            and not self.busy
            and all(code == 0 for code in self.exit_codes.values())
        )

    def _chaos(self) -> str:
        if not self.reattached:
            return (
                f"chaos: {self.kills} worker SIGKILLed and restarted, {self.restarts} ingress "
                f"restarted (SIGTERM, drain; exit codes {self.exit_codes})"
            )
        times = [seconds for _, seconds in self.reattached]
        return (
            f"chaos: {len(times)} worker hosts partitioned and healed; from the heal to attached "
            f"to both ingresses again: median {statistics.median(times):.1f}s, min "
            f"{min(times):.1f}s, max {max(times):.1f}s"
        )

    def report(self) -> str:
        sent = self.tally.sent
        lines = [
            f"requests: {sent} in {self.seconds:.0f}s ({sent / self.seconds:.1f}/s), "
            f"{self.tally.tokens} tokens out",
            self._chaos(),
            "outcomes:",
            *(f"  {count:6d}  {outcome}" for outcome, count in sorted(self.tally.outcomes.items())),
            f"accounted for: {sent - len(self.tally.unaccounted)} of {sent} "
            f"({self.tally.refused} refused or closed unanswered by the restarting ingress, "
            "sent again elsewhere)",
            f"end state: {'idle' if not self.busy else 'BUSY: ' + '; '.join(self.busy)}",
        ]
        for name, (before, after) in self.usage.items():
            lines.append(
                f"{name}: fds {before.fds} -> {after.fds}, threads {before.threads} -> "
                f"{after.threads}, RSS {before.rss_kib / 1024:.1f} -> {after.rss_kib / 1024:.1f} "
                f"MiB ({(after.rss_kib - before.rss_kib) / 1024:+.1f})"
            )
        for name, cache in sorted(self.caches.items()):
            lines.append(
                f"{name} prompt cache: {cache['hits']} hits, {cache['cached_tokens']} tokens "
                f"reused, {cache['bytes'] / 2**20:.1f} MiB of snapshots held"
            )
        lines.append(f"leaks: {len(self.leaks)}" + "".join(f"\n  {leak}" for leak in self.leaks))
        lines.extend(f"  {line}" for line in self.tally.unaccounted[:20])
        lines.append("PASS" if self.ok else "FAIL")
        return "\n".join(lines)


async def soak(config: SoakConfig, tmp: Path) -> SoakResult:
    """Run the soak in ``tmp`` (certificates, logs); every process is killed on the way out
    (and, on test hosts, the hosts removed)."""
    if not config.netns:
        return await _soak(config, tmp, None)
    netns = _netns_module()
    why = netns.unavailable()
    if why is not None:
        raise RuntimeError(f"--netns: {why}")
    with (
        netns.Topology.opened(["i0", "i1", "w0", "w1", "c"]) as topology,
        # This thread (Trio's) is the client host meanwhile: its connections start there.
        netns.entered(topology.hosts["c"].namespace),
    ):
        result: SoakResult = await _soak(config, tmp, topology)
        return result


async def _soak(config: SoakConfig, tmp: Path, topology: Any) -> SoakResult:
    rng = random.Random(config.seed)
    cluster = Cluster.create(
        tmp, config.model, config.slots, config.ctx_size, config.cache_ram, topology
    )
    tally = Tally()
    kills = restarts = 0
    reattached: list[tuple[str, float]] = []
    exit_codes: dict[str, int] = {}
    verify = cluster.verify
    try:
        async with trio.open_nursery() as nursery:
            for name in cluster.ingresses:
                nursery.start_soon(cluster.start_ingress, name)
        async with trio.open_nursery() as nursery:
            for name in cluster.workers:
                nursery.start_soon(cluster.start_worker, name)
        cluster.up = set(cluster.ingresses)
        limits = httpx.Limits(max_connections=config.concurrency * 2)
        async with httpx.AsyncClient(timeout=120, limits=limits, verify=verify) as client:
            await cluster.wait_attached(client)
            # Warm up, then take the survivors' baseline with no client connected.
            async with trio.open_nursery() as nursery:
                for i in range(2 * config.concurrency):
                    url = cluster.urls[f"i{i % 2}"]
                    path, body = _request(rng, config.max_tokens)
                    nursery.start_soon(_one, client, url, path, body, Tally(), rng)
        async with httpx.AsyncClient(timeout=120, verify=verify) as probe:
            assert not await idle(cluster, probe)
        survivors = {"i0": cluster.ingresses["i0"].pid, "w0": cluster.workers["w0"].pid}
        await trio.sleep(1)
        baseline = {name: usage(pid) for name, pid in survivors.items()}

        started = trio.current_time()
        deadline = started + config.duration
        limits = httpx.Limits(max_connections=config.concurrency * 2)
        # No transport timeout shorter than _one's own hang bound (300 s): on a machine loaded
        # enough for a request to take minutes, a client giving up early is no lost request.
        async with httpx.AsyncClient(timeout=300, limits=limits, verify=verify) as client:
            send, receive = trio.open_memory_channel[int](0)
            sent_all = trio.Event()

            async def clients() -> None:
                async def one_client() -> None:
                    async for _ in receive:
                        path, body = _request(rng, config.max_tokens)
                        abort = rng.random() < config.abort
                        while True:
                            name = rng.choice(sorted(cluster.up))
                            url = cluster.urls[name]
                            try:
                                await _one(client, url, path, body, tally, rng, abort=abort)
                            except NotAnswered as exc:
                                if name not in cluster.going_down:
                                    tally.add("UNACCOUNTED not answered", f"{url}{path}: {exc}")
                                    break
                                # Sent as the ingress went down, and refused or closed under
                                # the request before any answer (the drain answers every
                                # request it reads): as a load balancer does, try another.
                                tally.refused += 1
                                continue
                            break

                async with trio.open_nursery() as nursery:
                    for _ in range(config.concurrency):
                        nursery.start_soon(one_client)

            async def partitions() -> None:
                """A worker host cut off every ``partition_every`` seconds, w0 and w1 in turn,
                for ``partition_for``; then the time until it is back on both ingresses."""
                turn = 0
                async with httpx.AsyncClient(timeout=10, verify=verify) as probe:
                    while True:
                        await trio.sleep(config.partition_every)
                        name = f"w{turn % 2}"
                        turn += 1
                        topology.cut(name)
                        try:
                            await trio.sleep(config.partition_for)
                        finally:  # the run's end never leaves a host cut off
                            topology.heal(name)
                        healed = trio.current_time()
                        with trio.move_on_after(120):
                            for ingress in cluster.ingresses:
                                while not any(  # noqa: ASYNC110 (another process's state)
                                    str(w["id"]).startswith(f"{name}#")
                                    for w in (await cluster.health(probe, ingress))["workers"]
                                ):
                                    await trio.sleep(0.05)
                            reattached.append((name, trio.current_time() - healed))

            async def chaos() -> None:
                nonlocal kills, restarts
                if not config.chaos:
                    return
                if topology is not None:
                    with trio.move_on_at(deadline):
                        async with trio.open_nursery() as nursery:
                            nursery.start_soon(partitions)
                            await sent_all.wait()
                            nursery.cancel_scope.cancel()
                    return
                while tally.sent < config.requests // 4:
                    if sent_all.is_set():
                        return
                    await trio.sleep(0.1)
                worker = cluster.workers["w1"]
                worker.popen.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
                await worker.wait_exit(30)
                kills += 1
                await cluster.start_worker("w1")
                while tally.sent < config.requests // 2:
                    if sent_all.is_set():
                        return
                    await trio.sleep(0.1)
                # A rolling restart: SIGTERM; out of the pool once its /health says draining
                # (requests sent meanwhile get 503 shutting_down); back on the same ports.
                ingress = cluster.ingresses["i1"]
                cluster.going_down.add("i1")
                ingress.popen.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
                async with httpx.AsyncClient(timeout=10, verify=verify) as probe:
                    while ingress.popen.poll() is None:  # type: ignore[union-attr]
                        try:
                            if (await cluster.health(probe, "i1"))["status"] == "draining":
                                break
                        except httpx.HTTPError:
                            break
                        await trio.sleep(0.05)
                cluster.up.discard("i1")
                exit_codes["i1"] = await ingress.wait_exit(60)
                await cluster.start_ingress("i1")
                async with httpx.AsyncClient(timeout=10, verify=verify) as probe:
                    await cluster.wait_attached(probe)
                cluster.up.add("i1")
                cluster.going_down.discard("i1")
                restarts += 1

            async with trio.open_nursery() as nursery:
                nursery.start_soon(clients)
                nursery.start_soon(chaos)
                async with send:
                    for i in range(config.requests):
                        if trio.current_time() > deadline:
                            break
                        await send.send(i)
                        tally.sent += 1
                        if config.progress and tally.sent % max(1, config.requests // 20) == 0:
                            print(
                                f"{trio.current_time() - started:6.0f}s {tally.sent} sent, "
                                f"{dict(tally.outcomes)}",
                                file=sys.stderr,
                                flush=True,
                            )
                sent_all.set()
        seconds = trio.current_time() - started
        missing = tally.sent - sum(tally.outcomes.values())
        if missing:
            tally.add("UNACCOUNTED no outcome", f"{missing} requests")
        async with httpx.AsyncClient(timeout=10, verify=verify) as probe:
            busy = await idle(cluster, probe)
            caches = {
                str(worker["id"]).split("#")[0]: (worker["capacity"] or {}).get("prompt_cache")
                for worker in (await cluster.health(probe, "i0"))["workers"]
            }
        leaks = []
        after = {}
        for name, pid in survivors.items():
            after[name] = await settled(pid, baseline[name])
            if after[name].fds > baseline[name].fds:
                leaks.append(f"{name}: open files {baseline[name].fds} -> {after[name].fds}")
            if after[name].threads > baseline[name].threads:
                leaks.append(f"{name}: threads {baseline[name].threads} -> {after[name].threads}")
        # Every process shuts down cleanly: the ingresses drain, the workers detach.
        for proc in [*cluster.ingresses.values(), *cluster.workers.values()]:
            proc.popen.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        for proc in [*cluster.ingresses.values(), *cluster.workers.values()]:
            exit_codes[f"{proc.name} at the end"] = await proc.wait_exit(60)
        return SoakResult(
            tally,
            seconds,
            kills,
            restarts,
            leaks,
            busy,
            {name: (baseline[name], after[name]) for name in survivors},
            exit_codes,
            {name: cache for name, cache in caches.items() if cache is not None},
            reattached,
        )
    finally:
        cluster.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a GGUF file (default: the gemma test model)")
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--duration", type=float, default=900, help="seconds at most")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--abort", type=float, default=0.1, help="share of client aborts")
    parser.add_argument("--slots", type=int, default=4, help="slots per worker")
    parser.add_argument(
        "--cache-ram", type=int, default=1024, help="MiB of prompt snapshots per worker"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--netns", action="store_true", help="on test hosts (root), with partitions as chaos"
    )
    parser.add_argument("--partition-every", type=float, default=60, help="seconds (--netns)")
    parser.add_argument("--partition-for", type=float, default=8, help="seconds (--netns)")
    parser.add_argument("--keep", action="store_true", help="keep the logs (printed path)")
    args = parser.parse_args()
    if args.model is None:
        from llmtrio.engine import demo_model_path

        args.model = demo_model_path()
    config = SoakConfig(
        model=args.model,
        requests=args.requests,
        duration=args.duration,
        concurrency=args.concurrency,
        max_tokens=args.max_tokens,
        abort=args.abort,
        slots=args.slots,
        cache_ram=args.cache_ram,
        seed=args.seed,
        progress=True,
        netns=args.netns,
        partition_every=args.partition_every,
        partition_for=args.partition_for,
    )
    tmp = Path(tempfile.mkdtemp(prefix="llmtrio-soak-"))
    # A SIGTERM (a timeout's) unwinds like Ctrl-C, so that the processes started are stopped.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    started = time.monotonic()
    result = trio.run(soak, config, tmp)
    print(result.report())
    print(f"wall time {time.monotonic() - started:.0f}s; logs in {tmp}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
