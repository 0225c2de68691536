"""Remote images: an ``http(s)`` URL's bytes, fetched from the hosts the operator allows
(``--allowed-media-domains``, :attr:`RequestLimits.allowed_media_domains`) and no others.

The rules, each checked at every hop of a redirect chain:

- the scheme is ``http`` or ``https``; the URL holds no user name or password;
- the host is allowed: listed by name (or as an IP address, exactly as the URL writes it),
  or matched by a pattern (``*.example.com``: its subdomains, not itself; ``*``: any host);
- the name is resolved once, and the connection goes to an address of that answer (no
  second lookup a DNS rebinding could answer differently); ``https`` is checked against the
  host name (SNI and the certificate), not the address;
- a host matched only by a pattern must resolve to public addresses only: a loopback,
  private, link-local (169.254.0.0/16: cloud metadata services), shared, reserved or
  multicast address refuses the fetch (one such address among public ones too). A host
  listed by name may resolve anywhere: the operator named it;
- at most :data:`MAX_REDIRECTS` redirects; the whole fetch, redirects included, within
  ``media_fetch_timeout`` seconds; at most ``max_media_fetch_bytes`` bytes (refused from a
  ``Content-Length`` before reading, or once the body grows past it); an answer other than
  200 or a redirect is refused with its status.

What the bytes are is not taken from ``Content-Type``: the caller sniffs them
(``llmtrio.engine.decode_image``). Every refusal is an :class:`ApiError` (400,
``invalid_value``) naming the request's part.

Pure: :func:`check_url` (the URL and its host against the list) and :func:`is_public`. The
fetch (:func:`fetch_bytes`) runs on Trio sockets with ``h11``; cancelling it closes its
connection.
"""

from __future__ import annotations

import functools
import ipaddress
import ssl
import urllib.parse
from typing import Final, Literal

import attrs
import h11
import trio

from ..api import ApiError, RequestLimits, invalid_request

__all__ = ["MAX_REDIRECTS", "Target", "check_url", "fetch_bytes", "is_public", "is_remote"]

#: Redirects followed before a fetch is refused.
MAX_REDIRECTS: Final = 5
_REDIRECTS: Final = frozenset({301, 302, 303, 307, 308})
_USER_AGENT: Final = "llmtrio (image fetch)"
_CHUNK: Final = 65536
_FLAG: Final = "--allowed-media-domains"
#: What a request target keeps as written (RFC 3986's pchar, and "%" for what is escaped).
_PATH_SAFE: Final = "/%:@!$&'()*+,;=-._~"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def is_remote(url: str) -> bool:
    """Whether ``url`` is an ``http(s)`` URL (what this module fetches)."""
    return url[:8].lower().startswith(("http://", "https://"))


@attrs.frozen
class Target:
    """One hop's URL, checked: its host (lower case, IPv6 without brackets, no trailing
    dot), port, the request target (path and query) and ``authority`` (the ``Host``
    header). ``listed``: the host is named in the list (it may resolve anywhere), not only
    matched by a pattern (public addresses only)."""

    url: str
    https: bool
    host: str
    port: int
    target: str
    authority: str
    listed: bool


def host_rule(host: str, allowed: tuple[str, ...]) -> Literal["listed", "pattern"] | None:
    """How ``host`` is allowed: ``"listed"`` by name, by a ``"pattern"``, or not (``None``)."""
    if host in allowed:
        return "listed"
    for entry in allowed:
        if entry == "*":
            return "pattern"
        if entry.startswith("*.") and host.endswith(entry[1:]) and not _is_address(host):
            return "pattern"
    return None


def check_url(url: str, allowed: tuple[str, ...], param: str, *, hop: str = "") -> Target:
    """``url`` checked against the scheme and host rules (see the module's doc); ``hop``
    says, in a refusal, which redirect it came from.

    Error handling: :class:`ApiError` naming ``param``."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        raise _refused(param, f"{hop}the URL is malformed") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise _refused(param, f"{hop}only http(s) URLs are fetched, not {scheme or url[:16]!r}")
    if parts.username is not None or parts.password is not None:
        raise _refused(param, f"{hop}the URL holds a user name or password")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise _refused(param, f"{hop}the URL has no host")
    if not host.isascii():
        raise _refused(param, f"{hop}write the host name in its ASCII (punycode) form")
    rule = host_rule(host, allowed)
    if rule is None:
        raise _refused(
            param, f"{hop}the host {host!r} is not one this server fetches images from ({_FLAG})"
        )
    authority = urllib.parse.quote(parts.netloc.rpartition("@")[2], safe=":[]")
    path = urllib.parse.quote(parts.path or "/", safe=_PATH_SAFE)
    query = urllib.parse.quote(parts.query, safe=_PATH_SAFE + "?")
    target = path + (f"?{query}" if query else "")
    https = scheme == "https"
    default_port = 443 if https else 80
    return Target(url, https, host, port or default_port, target, authority, rule == "listed")


def is_public(address: IPAddress) -> bool:
    """Whether ``address`` is a public unicast address (an IPv4-mapped IPv6 address is
    judged as the IPv4 address it maps)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


async def fetch_bytes(
    url: str, param: str, limits: RequestLimits, *, ssl_context: ssl.SSLContext | None = None
) -> bytes:
    """The body ``url`` answers, following redirects, under the rules of the module's doc.
    ``ssl_context`` checks ``https`` servers (default: the system's trusted CAs).

    Resource handling: each hop's connection is closed before the next opens; cancelling
    the fetch closes the one open.

    Error handling: :class:`ApiError` (400) naming ``param`` for every refusal, a
    failure to resolve or connect, a bad TLS certificate, a response that is not HTTP, and
    the timeout."""
    context = ssl_context or _system_context()
    body: bytes | None = None
    with trio.move_on_after(limits.media_fetch_timeout):
        body = await _follow(url, param, limits, context)
    if body is None:
        raise _refused(
            param,
            f"fetching the image took longer than {limits.media_fetch_timeout:g} s "
            "(--media-fetch-timeout)",
        )
    return body


async def _follow(url: str, param: str, limits: RequestLimits, context: ssl.SSLContext) -> bytes:
    target = check_url(url, limits.allowed_media_domains, param)
    for redirects in range(MAX_REDIRECTS + 1):
        addresses = await _resolve(target, param)
        status, location, body = await _get(target, addresses, param, limits, context)
        if status == 200:
            return body
        if status not in _REDIRECTS:
            raise _refused(param, f"{target.url!r} answered HTTP {status}")
        if location is None:
            raise _refused(param, f"{target.url!r} answered HTTP {status} with no Location")
        if redirects == MAX_REDIRECTS:
            break
        following = urllib.parse.urljoin(target.url, location)
        target = check_url(
            following, limits.allowed_media_domains, param, hop=f"redirected to {following!r}: "
        )
    raise _refused(param, f"more than {MAX_REDIRECTS} redirects")


async def _resolve(target: Target, param: str) -> list[tuple[int, tuple[object, ...]]]:
    """The target's addresses (family and socket address), from one lookup, each checked."""
    try:
        infos = await trio.socket.getaddrinfo(
            target.host, target.port, type=trio.socket.SOCK_STREAM
        )
    except (OSError, UnicodeError) as exc:  # socket.gaierror, a label IDNA refuses
        raise _refused(param, f"the host {target.host!r} could not be resolved ({exc})") from None
    addresses: list[tuple[int, tuple[object, ...]]] = []
    for family, _, _, _, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).partition("%")[0])
        if not target.listed and not is_public(address):
            raise _refused(
                param,
                f"the host {target.host!r} resolves to {address}, a loopback, private, "
                "link-local or reserved address, which only a host listed by name may "
                f"({_FLAG})",
            )
        if (family, sockaddr) not in addresses:
            addresses.append((family, sockaddr))
    if not addresses:
        raise _refused(param, f"the host {target.host!r} has no address")
    return addresses


async def _connect(
    target: Target, addresses: list[tuple[int, tuple[object, ...]]], param: str
) -> trio.SocketStream:
    """A connection to the first of ``addresses`` that answers (they are tried in order)."""
    failure: OSError | None = None
    for family, sockaddr in addresses:
        sock = trio.socket.socket(family, trio.socket.SOCK_STREAM)
        try:
            await sock.connect(sockaddr)
        except OSError as exc:
            sock.close()
            failure = exc
            continue
        except BaseException:
            sock.close()
            raise
        return trio.SocketStream(sock)
    raise _refused(
        param, f"could not connect to {target.host!r} port {target.port} ({failure})"
    ) from None


async def _get(
    target: Target,
    addresses: list[tuple[int, tuple[object, ...]]],
    param: str,
    limits: RequestLimits,
    context: ssl.SSLContext,
) -> tuple[int, str | None, bytes]:
    """One GET: its status, its ``Location`` (for a redirect), and its body (for a 200)."""
    stream: trio.abc.Stream = await _connect(target, addresses, param)
    if target.https:
        stream = trio.SSLStream(stream, context, server_hostname=target.host, https_compatible=True)
    async with stream:
        try:
            return await _exchange(stream, target, param, limits.max_media_fetch_bytes)
        except trio.BrokenResourceError as exc:
            reason = exc.__cause__ or exc
            raise _refused(param, f"the connection to {target.host!r} failed ({reason})") from None
        except h11.RemoteProtocolError as exc:
            raise _refused(param, f"{target.url!r} did not answer valid HTTP ({exc})") from None
        except h11.LocalProtocolError as exc:
            raise _refused(param, f"the URL cannot be sent as an HTTP request ({exc})") from None


async def _exchange(
    stream: trio.abc.Stream, target: Target, param: str, most: int
) -> tuple[int, str | None, bytes]:
    connection = h11.Connection(h11.CLIENT)
    request = h11.Request(
        method="GET",
        target=target.target,
        headers=[
            ("Host", target.authority),
            ("User-Agent", _USER_AGENT),
            ("Accept", "image/*"),
            ("Accept-Encoding", "identity"),
            ("Connection", "close"),
        ],
    )
    await stream.send_all(
        (connection.send(request) or b"") + (connection.send(h11.EndOfMessage()) or b"")
    )
    event = await _next_event(connection, stream)
    while isinstance(event, h11.InformationalResponse):
        event = await _next_event(connection, stream)
    if not isinstance(event, h11.Response):
        raise _refused(param, f"{target.url!r} closed the connection without answering")
    headers = {name.decode().lower(): value.decode("latin-1") for name, value in event.headers}
    if event.status_code != 200:
        return event.status_code, headers.get("location"), b""
    length = headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > most:
        raise _too_large(param, most)
    body = bytearray()
    while True:
        event = await _next_event(connection, stream)
        if isinstance(event, h11.Data):
            body += event.data
            if len(body) > most:
                raise _too_large(param, most)
        elif isinstance(event, h11.EndOfMessage):
            return 200, None, bytes(body)
        else:
            raise _refused(param, f"{target.url!r} closed the connection before the image's end")


async def _next_event(connection: h11.Connection, stream: trio.abc.Stream) -> object:
    while True:
        event = connection.next_event()
        if event is not h11.NEED_DATA:
            return event
        connection.receive_data(bytes(await stream.receive_some(_CHUNK)))


@functools.cache
def _system_context() -> ssl.SSLContext:
    """The system's trusted CAs (read once: loading them costs milliseconds)."""
    return ssl.create_default_context()


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _too_large(param: str, most: int) -> ApiError:
    return _refused(param, f"the image is larger than {most} bytes (--max-media-fetch-bytes)")


def _refused(param: str, reason: str) -> ApiError:
    # The message names the part too: Anthropic's error shape has no ``param``.
    return invalid_request(f"Invalid '{param}': {reason}.", param=param, code="invalid_value")
