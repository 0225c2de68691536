"""Where a worker dials: ingress URLs, the names in them, and what those names resolve to.

An ingress URL names one ingress (``wss://10.0.0.5:9443``) or a DNS name that may stand for
many (``wss://llmtrio-control:9443``: in Kubernetes, a headless Service with one address per
ingress replica). A worker dials every address the name resolves to, verifying each ingress's
certificate against the *name*, and resolves the name again every ``resolve_interval``:

- an address that appears is dialed;
- an address that disappears is not dialed again, but a connection open to it is kept: that
  ingress may be draining (Kubernetes drops terminating pods from DNS) with parked requests
  still waiting for workers, so the worker claims from it until the ingress itself detaches;
- a failed lookup (a DNS server that does not answer) changes nothing; a name that has no
  address any more (``NXDOMAIN``: every ingress gone) is an empty answer.

:func:`follow` keeps those connections (``_remote`` serves each one); the rules themselves are
in :class:`AddressBook`, plain data.
"""

from __future__ import annotations

import ipaddress
import logging
import random
import socket
from collections.abc import Awaitable, Callable, Iterable, Iterator
from urllib.parse import urlsplit

import attrs
import trio
from trio_websocket import ConnectionClosed, HandshakeError

from ._errors import ControlRefusedError, ProtocolError

__all__ = ["DialConfig"]  # the rest serve _remote.py, inside the ring room

logger = logging.getLogger("llmtrio.ring.remote")

BACKOFF_FIRST_S = 0.2
BACKOFF_MAX_S = 10.0
STABLE_S = 5.0  # a connection that lasted this long resets the backoff
RESOLVE_LIMIT_S = 10.0  # a lookup that takes longer counts as failed

#: getaddrinfo errors that mean "this name has no address", not "the resolver failed".
_NO_ADDRESS = frozenset(
    code for code in (getattr(socket, "EAI_NONAME", None), getattr(socket, "EAI_NODATA", None))
    if code is not None
)  # fmt: skip


def _positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value > 0:
        raise ValueError(f"{attribute.name} must be more than 0, not {value!r}")


@attrs.frozen
class DialConfig:
    """How a worker reaches its ingresses.

    ``resolve_interval``: seconds between two lookups of an ingress name. ``ingress_timeout``:
    seconds an attached ingress may answer no ping before the worker gives it up (a partition
    breaks no TCP connection: without this, a worker would hold the streams of an ingress it
    can no longer hear until the kernel's TCP timeout, many minutes later), cancels what it
    was generating for it and dials it again. ``handshake_timeout``: seconds for one dial (TCP,
    TLS and the WebSocket handshake); a dial into a black hole gives up after it and retries.
    """

    resolve_interval: float = attrs.field(default=10.0, validator=_positive)
    ingress_timeout: float = attrs.field(default=10.0, validator=_positive)
    handshake_timeout: float = attrs.field(default=5.0, validator=_positive)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@attrs.frozen
class IngressURL:
    """``wss://HOST:PORT`` (port 443 when absent): one ingress, or a name for several."""

    host: str
    port: int

    @classmethod
    def parse(cls, url: str) -> IngressURL:
        """Error handling: ``ValueError`` naming the URL when it is not ``wss://HOST[:PORT]``."""
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            port = -1
        if parts.scheme != "wss" or not parts.hostname or port == -1:
            raise ValueError(f"an ingress URL looks like wss://HOST:PORT, not {url!r}")
        return cls(parts.hostname, port or 443)

    @property
    def is_name(self) -> bool:
        """Whether the host is a name to resolve (not an IP address)."""
        return not _is_address(self.host)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


async def resolve(host: str, port: int) -> tuple[str, ...]:
    """The addresses ``host`` resolves to now, each once, in the resolver's order, of one
    address family: that of the first answer (on a dual-stack cluster each pod has an IPv4
    and an IPv6 address; dialing both would attach to every ingress twice). An empty tuple
    when the name has no address (``NXDOMAIN``).

    Error handling: ``OSError`` (``socket.gaierror``) when the lookup itself failed (no
    answer from the resolver): the caller keeps what it knew.
    """
    try:
        infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        if exc.errno in _NO_ADDRESS:
            return ()
        raise
    if not infos:
        return ()
    family = infos[0][0]
    return tuple(dict.fromkeys(str(info[4][0]) for info in infos if info[0] == family))


@attrs.define(eq=False)
class Dialer:
    """One address to keep a connection to, on behalf of ``url``.

    ``listed``: in the name's last answer. A dialer stops redialing once it is not, but a
    connection it has open is not touched. ``done``: its task has returned (a later answer
    that lists the address again starts a new one).
    """

    url: IngressURL
    address: str
    listed: bool = True
    done: bool = False

    @property
    def server_hostname(self) -> str:
        """The name the ingress's certificate is verified against (and the WebSocket's Host)."""
        return self.url.host

    @property
    def name(self) -> str:
        """For logs: ``NAME:PORT at ADDRESS``, or ``ADDRESS:PORT`` for a URL with an address."""
        if not self.url.is_name:
            return str(self.url)
        return f"{self.url} at {self.address}"


@attrs.define(eq=False)
class AddressBook:
    """The dialers of one ingress name, updated from each answer (sans-IO: the caller starts
    the tasks of the dialers :meth:`update` returns)."""

    url: IngressURL
    _dialers: dict[str, Dialer] = attrs.field(init=False, factory=dict)

    @property
    def dialers(self) -> tuple[Dialer, ...]:
        return tuple(self._dialers.values())

    def update(self, found: Iterable[str]) -> tuple[list[Dialer], list[Dialer]]:
        """Take a new answer; returns the dialers to start (new addresses, and addresses
        listed again whose last dialer has ended) and those that left the answer."""
        found = list(found)
        started: list[Dialer] = []
        gone: list[Dialer] = []
        for address in found:
            dialer = self._dialers.get(address)
            if dialer is None or dialer.done:
                dialer = Dialer(self.url, address)
                self._dialers[address] = dialer
                started.append(dialer)
            else:
                dialer.listed = True
        for address, dialer in list(self._dialers.items()):
            if address in found:
                continue
            if dialer.listed:
                dialer.listed = False
                gone.append(dialer)
            if dialer.done:
                del self._dialers[address]
        return started, gone


def _backoff(failures: int, ceiling: float = BACKOFF_MAX_S) -> float:
    """Jittered exponential backoff: 0.2 s doubling up to ``ceiling``, times 0.5 to 1."""
    delay: float = min(ceiling, BACKOFF_FIRST_S * 2.0 ** max(0, failures - 1))
    return delay * random.uniform(0.5, 1.0)


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    """The exceptions in ``group`` and in the groups nested in it (a session's nurseries
    nest), so that a log names each one rather than "Exceptions from Trio nursery"."""
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc


Session = Callable[[Dialer], Awaitable[None]]


async def follow(
    url: IngressURL, config: DialConfig, session: Session, closing: Callable[[], bool]
) -> None:
    """Keep a ``session`` with every ingress ``url`` stands for until ``closing()``: one
    address, or every address its name resolves to, looked up again every
    ``config.resolve_interval`` (the rules: :class:`AddressBook`)."""
    if not url.is_name:
        await keep_connected(Dialer(url, url.host), session, closing)
        return
    book = AddressBook(url)
    failures = 0
    async with trio.open_nursery() as nursery:
        while not closing():
            found: tuple[str, ...] | None = None
            try:
                with trio.fail_after(RESOLVE_LIMIT_S):
                    found = await resolve(url.host, url.port)
            except (OSError, trio.TooSlowError) as exc:
                logger.warning(
                    "cannot resolve %s: %s (keeping the %d addresses it had)",
                    url,
                    str(exc) or "no answer in time",
                    sum(d.listed for d in book.dialers),
                )
            if found is not None:
                started, gone = book.update(found)
                for dialer in started:
                    logger.info("ingress %s: dialing", dialer.name)
                    nursery.start_soon(keep_connected, dialer, session, closing)
                for dialer in gone:
                    logger.info(
                        "ingress %s is gone from DNS: not dialed again (a connection open to "
                        "it serves on until that ingress detaches)",
                        dialer.name,
                    )
            if found:
                failures = 0
                await trio.sleep(config.resolve_interval)
            else:  # nothing to dial (yet): look again sooner
                failures += 1
                await trio.sleep(_backoff(failures, config.resolve_interval))
        nursery.cancel_scope.cancel()


async def keep_connected(dialer: Dialer, session: Session, closing: Callable[[], bool]) -> None:
    """Run ``session(dialer)`` again after each loss, with jittered exponential backoff, while
    the address is listed; a connection already open is never cut because its address left
    the name's answer (``session`` returns when the ingress closes it)."""
    failures = 0
    try:
        while not closing() and dialer.listed:
            started = trio.current_time()
            try:
                await session(dialer)
            except* (
                OSError,
                ControlRefusedError,
                HandshakeError,
                ConnectionClosed,
                ProtocolError,
            ) as group:
                logger.warning("ingress %s: %s", dialer.name, "; ".join(map(str, _leaves(group))))
            if closing() or not dialer.listed:
                return
            failures = 0 if trio.current_time() - started > STABLE_S else failures + 1
            await trio.sleep(_backoff(failures))
    finally:
        dialer.done = True
