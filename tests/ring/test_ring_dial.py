"""A worker that finds every ingress behind one name: ``connect_ring`` with ``wss://NAME:PORT``.

Ingresses listen on 127.0.0.1, .2 and .3 (all loopback on Linux) on one port, as the replicas
behind a Kubernetes headless Service do on their pod addresses, with real TLS: each ingress's
certificate is for the name, not the address. The name's answer comes from a resolver of the
test's own (trio's custom hostname resolver), changed while the worker runs. The rules the
worker follows are also checked on ``AddressBook`` alone. (The same with a real resolver, a
test host's hosts file: ``tests/ring/test_netns.py``.)
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trustme

from llmtrio.ring import (
    ControlConfig,
    DialConfig,
    RemoteLink,
    Ring,
    client_ssl_context,
    connect_ring,
    serve_control,
    server_ssl_context,
)
from llmtrio.ring._dial import AddressBook, IngressURL, resolve

from .._helpers import HEAD, eventually, read_all
from .test_ring_remote import echo_as, serve_slots

NAME = "ingress.test"
FAST = DialConfig(resolve_interval=0.05, handshake_timeout=5)

Answer = list[str] | socket.gaierror


class Resolver(trio.abc.HostnameResolver):
    """Answers for the names in ``answers`` (IPv4 addresses, or an error to raise)."""

    def __init__(self) -> None:
        self.answers: dict[str, Answer] = {}
        self.lookups = 0

    async def getaddrinfo(
        self,
        host: bytes | None,
        port: bytes | str | int | None,
        family: int = 0,
        type: int = 0,
        proto: int = 0,
        flags: int = 0,
    ) -> list[tuple[socket.AddressFamily, socket.SocketKind, int, str, tuple[str, int]]]:
        await trio.lowlevel.checkpoint()
        self.lookups += 1
        name = host.decode() if isinstance(host, bytes) else str(host)
        answer = self.answers.get(name, socket.gaierror(socket.EAI_NONAME, "no such name"))
        if isinstance(answer, socket.gaierror):
            raise answer
        number = int(port) if port is not None else 0
        return [
            (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, number))
            for address in answer
        ]

    async def getnameinfo(
        self, sockaddr: tuple[str, int] | tuple[str, int, int, int], flags: int
    ) -> tuple[str, str]:
        raise NotImplementedError


@pytest.fixture
async def resolver() -> AsyncIterator[Resolver]:
    resolver = Resolver()
    trio.socket.set_custom_hostname_resolver(resolver)
    yield resolver
    trio.socket.set_custom_hostname_resolver(None)


@pytest.fixture
def cas(tmp_path: Path) -> tuple[trustme.CA, trustme.CA]:
    ingress_ca, worker_ca = trustme.CA(), trustme.CA()
    ingress_ca.cert_pem.write_to_path(str(tmp_path / "ingress-ca.pem"))
    worker_ca.cert_pem.write_to_path(str(tmp_path / "worker-ca.pem"))
    return ingress_ca, worker_ca


class Ingresses:
    """Rings behind control listeners on 127.0.0.N, one port (the one the first listener got
    from the system); each can be stopped and started again."""

    def __init__(
        self, nursery: trio.Nursery, tmp: Path, cas: tuple[trustme.CA, trustme.CA]
    ) -> None:
        self._nursery = nursery
        self._tmp = tmp
        self._ingress_ca, _ = cas
        #: 0 until the first listener is up.
        self.port = 0
        self.rings: dict[str, Ring] = {}
        self._scopes: dict[str, trio.CancelScope] = {}

    async def start(self, address: str, *, name: str = NAME) -> Ring:
        cert = self._tmp / f"ingress-{address}.pem"
        self._ingress_ca.issue_cert(name).private_key_and_cert_chain_pem.write_to_path(str(cert))
        context = server_ssl_context(cert, cert, self._tmp / "worker-ca.pem")
        ring = self.rings.setdefault(address, Ring(max_streams=8))
        config = ControlConfig(context, host=address, port=self.port, worker_timeout=5)

        async def run(*, task_status: trio.TaskStatus[str]) -> None:
            with trio.CancelScope() as scope:
                self._scopes[address] = scope
                await serve_control(ring, config, task_status=task_status)

        url: str = await self._nursery.start(run)  # wss://ADDRESS:PORT, the port bound
        self.port = int(url.rsplit(":", 1)[1])
        return ring

    def stop(self, address: str) -> None:
        self._scopes.pop(address).cancel()

    def attached(self, address: str) -> int:
        return len(self.rings[address].stats().workers)


@asynccontextmanager
async def named_worker(
    tmp: Path, worker_ca: trustme.CA, url: str, config: DialConfig = FAST
) -> AsyncIterator[RemoteLink]:
    cert = tmp / "worker.pem"
    worker_ca.issue_cert("worker").private_key_and_cert_chain_pem.write_to_path(str(cert))
    context = client_ssl_context(cert, None, tmp / "ingress-ca.pem")
    async with (
        connect_ring([url], context, worker_id="w", max_inflight=2, config=config) as link,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(serve_slots, link, echo_as("w"))
        yield link
        nursery.cancel_scope.cancel()


async def served(ring: Ring) -> bytes:
    with trio.fail_after(10):
        _, body = await read_all(ring.park(HEAD, b"hi"))
    return body


async def test_every_address_of_the_name_is_dialed_and_followed(
    tmp_path: Path, cas: tuple[trustme.CA, trustme.CA], resolver: Resolver
) -> None:
    async with trio.open_nursery() as nursery:
        ingresses = Ingresses(nursery, tmp_path, cas)
        a, b, c = "127.0.0.1", "127.0.0.2", "127.0.0.3"
        for address in (a, b, c):
            await ingresses.start(address)
        resolver.answers[NAME] = [a, b]
        url = f"wss://{NAME}:{ingresses.port}"
        async with named_worker(tmp_path, cas[1], url) as link:
            await eventually(lambda: ingresses.attached(a) == 1 and ingresses.attached(b) == 1)
            assert link.attached == 2
            for address in (a, b):
                assert await served(ingresses.rings[address]) == b"0:hi;1:hi;2:hi;"

            # An ingress added, one removed: the new one is dialed; the removed one is kept,
            # and claimed from (a draining ingress still has requests parked).
            resolver.answers[NAME] = [b, c]
            await eventually(lambda: ingresses.attached(c) == 1)
            lookups = resolver.lookups
            await eventually(lambda: resolver.lookups > lookups + 2)
            assert ingresses.attached(a) == 1
            assert await served(ingresses.rings[a]) == b"0:hi;1:hi;2:hi;"

            # Once that ingress detaches, it is not dialed again, even when it comes back at
            # its address; the others go on.
            ingresses.stop(a)
            await eventually(lambda: link.attached == 2)
            await ingresses.start(a)
            lookups = resolver.lookups
            await eventually(lambda: resolver.lookups > lookups + 10)
            assert ingresses.attached(a) == 0
            assert (ingresses.attached(b), ingresses.attached(c)) == (1, 1)

            # Listed again: dialed again.
            resolver.answers[NAME] = [a, b, c]
            await eventually(lambda: ingresses.attached(a) == 1)
            assert link.attached == 3
        nursery.cancel_scope.cancel()


async def test_a_failed_lookup_keeps_the_addresses_and_an_empty_answer_drops_them(
    tmp_path: Path,
    cas: tuple[trustme.CA, trustme.CA],
    resolver: Resolver,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with trio.open_nursery() as nursery:
        ingresses = Ingresses(nursery, tmp_path, cas)
        a = "127.0.0.1"
        await ingresses.start(a)
        resolver.answers[NAME] = [a]
        async with named_worker(tmp_path, cas[1], f"wss://{NAME}:{ingresses.port}") as link:
            await eventually(lambda: ingresses.attached(a) == 1)
            # The resolver stops answering: the address is still dialed after a loss.
            resolver.answers[NAME] = socket.gaierror(socket.EAI_AGAIN, "temporary failure")
            lookups = resolver.lookups
            await eventually(lambda: resolver.lookups > lookups + 2)
            assert "cannot resolve ingress.test" in caplog.text
            ingresses.stop(a)
            await eventually(lambda: link.attached == 0)
            await ingresses.start(a)
            await eventually(lambda: ingresses.attached(a) == 1)
            # The name has no address any more (every ingress gone): nothing is dialed again.
            del resolver.answers[NAME]
            lookups = resolver.lookups
            await eventually(lambda: resolver.lookups > lookups + 2)
            ingresses.stop(a)
            await eventually(lambda: link.attached == 0)
            await ingresses.start(a)
            lookups = resolver.lookups
            await eventually(lambda: resolver.lookups > lookups + 5)
            assert ingresses.attached(a) == 0
        nursery.cancel_scope.cancel()


async def test_each_ingress_is_verified_against_the_name(
    tmp_path: Path,
    cas: tuple[trustme.CA, trustme.CA],
    resolver: Resolver,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "llmtrio.ring")
    async with trio.open_nursery() as nursery:
        ingresses = Ingresses(nursery, tmp_path, cas)
        good, impostor = "127.0.0.1", "127.0.0.2"
        await ingresses.start(good)
        await ingresses.start(impostor, name="elsewhere.test")  # right CA, wrong name
        resolver.answers[NAME] = [good, impostor]
        async with named_worker(tmp_path, cas[1], f"wss://{NAME}:{ingresses.port}"):
            await eventually(lambda: ingresses.attached(good) == 1)
            await eventually(lambda: "Hostname mismatch" in caplog.text)
            assert ingresses.attached(impostor) == 0
            assert f"ingress {NAME}:{ingresses.port} at {impostor}: TLS handshake" in caplog.text
        nursery.cancel_scope.cancel()


async def test_a_name_resolves_to_one_family_each_address_once(resolver: Resolver) -> None:
    class DualStack(Resolver):
        async def getaddrinfo(  # type: ignore[override]
            self, host: bytes | None, port: object, *args: object
        ) -> list[tuple[socket.AddressFamily, socket.SocketKind, int, str, tuple[object, ...]]]:
            await trio.lowlevel.checkpoint()
            v6 = (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fd00::1", 9443, 0, 0))
            v4 = (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.1", 9443))
            v4b = (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.2", 9443))
            return [v4, v6, v4, v4b]

    trio.socket.set_custom_hostname_resolver(DualStack())
    assert await resolve("dual.test", 9443) == ("10.0.0.1", "10.0.0.2")
    trio.socket.set_custom_hostname_resolver(resolver)
    assert await resolve("nowhere.test", 9443) == ()  # NXDOMAIN: no address
    resolver.answers["flaky.test"] = socket.gaierror(socket.EAI_AGAIN, "try again")
    with pytest.raises(OSError, match="try again"):
        await resolve("flaky.test", 9443)


def test_the_address_book_rules() -> None:
    book = AddressBook(IngressURL.parse("wss://control:9443"))
    started, gone = book.update(["10.0.0.1", "10.0.0.2"])
    assert [d.address for d in started] == ["10.0.0.1", "10.0.0.2"] and gone == []
    first, second = started
    assert first.name == "control:9443 at 10.0.0.1" and first.server_hostname == "control"
    # Gone from the answer: not listed (its task stops redialing), its connection untouched.
    started, gone = book.update(["10.0.0.2", "10.0.0.3"])
    assert [d.address for d in started] == ["10.0.0.3"] and gone == [first]
    assert not first.listed and second.listed
    # Back before its task ended: the same dialer, listed again (no second connection).
    started, gone = book.update(["10.0.0.1", "10.0.0.2", "10.0.0.3"])
    assert started == [] and gone == [] and first.listed
    # Back after its task ended: a new dialer.
    book.update(["10.0.0.2", "10.0.0.3"])
    first.done = True
    book.update(["10.0.0.2", "10.0.0.3"])
    assert "10.0.0.1" not in [d.address for d in book.dialers]  # forgotten once done
    started, _ = book.update(["10.0.0.1", "10.0.0.2", "10.0.0.3"])
    assert [d.address for d in started] == ["10.0.0.1"] and started[0] is not first


@pytest.mark.parametrize(
    ("url", "parsed", "is_name"),
    [
        ("wss://control.ns.svc:9443", ("control.ns.svc", 9443), True),
        ("wss://10.1.2.3:9443", ("10.1.2.3", 9443), False),
        ("wss://[fd00::5]:9443", ("fd00::5", 9443), False),
        ("wss://control", ("control", 443), True),
    ],
)
def test_ingress_urls(url: str, parsed: tuple[str, int], is_name: bool) -> None:
    target = IngressURL.parse(url)
    assert (target.host, target.port) == parsed
    assert target.is_name is is_name


@pytest.mark.parametrize("url", ["https://control:9443", "wss://:9443", "wss://control:port"])
def test_malformed_ingress_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError, match="looks like wss://HOST:PORT"):
        IngressURL.parse(url)


def test_dial_settings_must_be_positive() -> None:
    with pytest.raises(ValueError, match="resolve_interval must be more than 0"):
        DialConfig(resolve_interval=0)
