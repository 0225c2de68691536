"""Remote image URLs (``llmtrio.worker._fetch``, ``_images``): the host rules, redirects hop
by hop, the address pinned from one lookup, TLS against the name, the size cap, the timeout,
the type sniffed from the bytes; against loopback servers these tests start (port 0), names
resolved by a resolver of their own (trio's custom hostname resolver). No model."""

from __future__ import annotations

import ipaddress
import json
import socket
import ssl
from collections.abc import Awaitable, Callable
from functools import partial
from types import SimpleNamespace
from typing import Any

import attrs
import pytest
import trio
import trustme

from llmtrio.api import ApiError
from llmtrio.engine import GenerateRequest
from llmtrio.worker import RequestLimits
from llmtrio.worker._chat_request import parse_chat_request
from llmtrio.worker._fetch import check_url, is_public
from llmtrio.worker._images import RemoteImage, fetch_image, fetch_remote_images

from .._vision import png

PNG = png(1, (16, 12))
PARAM = "messages[0].content[0].image_url.url"

Route = Callable[[trio.abc.Stream], Awaitable[None]]


def reply(body: bytes, content_type: str = "image/png", *, status: str = "200 OK") -> Route:
    async def send(stream: trio.abc.Stream) -> None:
        head = f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
        head += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        await stream.send_all(head.encode() + body)

    return send


def redirect(location: str, status: int = 302) -> Route:
    async def send(stream: trio.abc.Stream) -> None:
        head = f"HTTP/1.1 {status} Moved\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n"
        await stream.send_all(head.encode())

    return send


@attrs.define
class Server:
    """A loopback HTTP(S) server answering ``GET PATH`` with ``routes[PATH]``; it records each
    request's path and ``Host`` header, and sets ``closed`` when a client hangs up on it."""

    routes: dict[str, Route]
    port: int = 0
    requests: list[tuple[str, str]] = attrs.Factory(list)
    connections: int = 0
    sni: list[str | None] = attrs.Factory(list)
    received: trio.Event = attrs.Factory(trio.Event)
    closed: trio.Event = attrs.Factory(trio.Event)

    async def handle(self, stream: trio.abc.Stream) -> None:
        self.connections += 1
        data = b""
        try:
            while b"\r\n\r\n" not in data:
                chunk = await stream.receive_some(4096)
                if not chunk:
                    return
                data += chunk
            lines = data.split(b"\r\n\r\n")[0].decode().split("\r\n")
            path = lines[0].split(" ")[1]
            headers = dict(line.lower().split(": ", 1) for line in lines[1:])
            self.requests.append((path, headers.get("host", "")))
            self.received.set()
            route = self.routes.get(path, reply(b"no", "text/plain", status="404 Not Found"))
            await route(stream)
        except trio.BrokenResourceError:
            pass
        finally:
            await trio.aclose_forcefully(stream)


@pytest.fixture
async def serve(nursery: trio.Nursery) -> Callable[..., Awaitable[Server]]:
    async def start(routes: dict[str, Route], tls: ssl.SSLContext | None = None) -> Server:
        server = Server(routes)
        if tls is None:
            (listener,) = await nursery.start(
                partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1")
            )
        else:

            def sni(_sock: object, name: str | None, _context: object) -> None:
                server.sni.append(name)

            tls.sni_callback = sni  # type: ignore[assignment]
            (listener,) = await nursery.start(
                partial(trio.serve_ssl_over_tcp, server.handle, 0, tls, host="127.0.0.1")
            )
            listener = listener.transport_listener
        server.port = listener.socket.getsockname()[1]
        return server

    return start


@attrs.define
class Resolver(trio.abc.HostnameResolver):
    """Names to addresses, a list per lookup (the last repeats); ``lookups`` in order."""

    names: dict[str, list[list[str]]]
    lookups: list[str] = attrs.Factory(list)

    async def getaddrinfo(
        self, host: bytes | None, port: bytes | str | int | None, family: int = 0,
        type: int = 0, proto: int = 0, flags: int = 0,
    ) -> list[tuple[Any, ...]]:  # fmt: skip
        name = (host or b"").decode()
        self.lookups.append(name)
        answers = self.names.get(name)
        if answers is None:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        addresses = answers[min(self.lookups.count(name), len(answers)) - 1]
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, int(port or 0)))
            for address in addresses
        ]

    async def getnameinfo(self, sockaddr: Any, flags: int) -> tuple[str, str]:
        raise NotImplementedError


@pytest.fixture
async def resolver() -> Resolver:
    names = {
        "images.test": [["127.0.0.1"]],
        "other.test": [["127.0.0.1"]],
        "metadata.test": [["169.254.169.254"]],
        "mixed.test": [["93.184.216.34", "10.1.2.3"]],
    }
    resolver = Resolver(names)
    trio.socket.set_custom_hostname_resolver(resolver)  # this test's run only
    return resolver


def limits(*hosts: str, **values: Any) -> RequestLimits:
    return RequestLimits(allowed_media_domains=hosts, **values)


async def refused(url: str, rules: RequestLimits, **options: Any) -> str:
    with pytest.raises(ApiError) as error:
        await fetch_image(url, PARAM, rules, **options)
    assert error.value.status == 400 and error.value.param == PARAM
    message = error.value.message
    assert message.startswith(f"Invalid '{PARAM}': ")
    return message


# -- pure: the URL and its host ------------------------------------------------------------


def test_host_rules() -> None:
    allowed = RequestLimits(allowed_media_domains=["Images.Example.", "*.cdn.example,10.0.0.7"])
    assert allowed.allowed_media_domains == ("images.example", "*.cdn.example", "10.0.0.7")
    hosts = allowed.allowed_media_domains
    assert check_url("https://IMAGES.example/a.png?x=1", hosts, PARAM).listed
    target = check_url("http://a.cdn.example:8080/p", hosts, PARAM)
    assert (target.host, target.port, target.target, target.listed) == (
        "a.cdn.example", 8080, "/p", False,
    )  # fmt: skip
    assert check_url("http://10.0.0.7/", hosts, PARAM).listed
    spaced = check_url("http://images.example/a b/ü.png?q=1 2#part", hosts, PARAM)
    assert spaced.target == "/a%20b/%C3%BC.png?q=1%202"  # what h11 may send
    for url, reason in (
        ("http://cdn.example/a.png", "'cdn.example' is not one this server fetches"),
        ("http://images.example.evil/a", "not one this server fetches"),
        ("ftp://images.example/a.png", "only http(s) URLs"),
        ("http://user:pw@images.example/a.png", "user name or password"),
        ("http://images.example:99999/", "malformed"),
        ("http://bücher.example/a.png", "ASCII (punycode) form"),
    ):
        with pytest.raises(ApiError) as error:
            check_url(url, hosts, PARAM)
        assert reason in error.value.message and error.value.param == PARAM, url
    with pytest.raises(ValueError, match="not a host name"):
        RequestLimits(allowed_media_domains=("images.example:8080",))


def test_public_addresses() -> None:
    for text in ("93.184.216.34", "2606:4700::1111"):
        assert is_public(ipaddress.ip_address(text)), text
    for text in (
        "127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1",
        "0.0.0.0", "224.0.0.1", "::1", "fe80::1", "fd00::1", "::ffff:127.0.0.1", "240.0.0.1",
    ):  # fmt: skip
        assert not is_public(ipaddress.ip_address(text)), text


def test_remote_urls_are_off_by_default_and_checked_at_the_parse() -> None:
    def body(url: str) -> bytes:
        part = {"type": "image_url", "image_url": {"url": url}}
        return json.dumps({"messages": [{"role": "user", "content": [part]}]}).encode()

    with pytest.raises(ApiError) as error:
        parse_chat_request(body("http://images.test/a.png"))
    assert error.value.param == PARAM and "--allowed-media-domains" in error.value.message
    with pytest.raises(ApiError) as error:
        parse_chat_request(body("http://other.test/a.png"), limits("images.test"))
    assert "'other.test' is not one this server fetches" in error.value.message
    request = parse_chat_request(body("http://images.test/a.png"), limits("images.test"))
    assert request.generate.messages is not None
    (image,) = request.generate.messages[0].images
    assert isinstance(image, RemoteImage) and image.url == "http://images.test/a.png"
    assert image.param == PARAM


# -- fetches -------------------------------------------------------------------------------

Serve = Callable[..., Awaitable[Server]]


async def test_a_png_is_fetched_and_sniffed_from_its_bytes(serve: Serve) -> None:
    server = await serve(
        {"/a.png": reply(PNG), "/mislabelled": reply(PNG, "text/html"),
         "/page": reply(b"<!doctype html><title>x</title>", "image/png")}
    )  # fmt: skip
    base = f"http://127.0.0.1:{server.port}"
    rules = limits("127.0.0.1")
    image = await fetch_image(f"{base}/a.png", PARAM, rules)
    assert (image.width, image.height, image.param) == (16, 12, PARAM)
    assert len(image.pixels()) == 16 * 12 * 3
    assert (await fetch_image(f"{base}/mislabelled", PARAM, rules)).digest == image.digest
    assert "not a PNG, JPEG, WebP or GIF" in await refused(f"{base}/page", rules)
    assert "answered HTTP 404" in await refused(f"{base}/gone", rules)
    assert [path for path, _ in server.requests] == ["/a.png", "/mislabelled", "/page", "/gone"]
    assert server.requests[0][1] == f"127.0.0.1:{server.port}"


async def test_redirects_are_checked_hop_by_hop(serve: Serve, resolver: Resolver) -> None:
    routes: dict[str, Route] = {"/a.png": reply(PNG)}
    server = await serve(routes)
    port = server.port
    routes["/one"] = redirect("/two", 301)  # relative, same host
    routes["/two"] = redirect(f"http://other.test:{port}/a.png", 307)  # another listed host
    routes["/away"] = redirect(f"http://elsewhere.test:{port}/a.png")
    routes["/loop"] = redirect("/loop")
    rules = limits("images.test", "other.test")
    image = await fetch_image(f"http://images.test:{port}/one", PARAM, rules)
    assert image.width == 16
    assert server.requests == [
        ("/one", f"images.test:{port}"),
        ("/two", f"images.test:{port}"),
        ("/a.png", f"other.test:{port}"),
    ]
    message = await refused(f"http://images.test:{port}/away", rules)
    assert f"redirected to 'http://elsewhere.test:{port}/a.png'" in message
    assert "'elsewhere.test' is not one this server fetches" in message
    assert "elsewhere.test" not in resolver.lookups  # refused before any lookup
    assert "more than 5 redirects" in await refused(f"http://images.test:{port}/loop", rules)
    assert server.requests.count(("/loop", f"images.test:{port}")) == 6


async def test_the_size_cap(serve: Serve) -> None:
    async def unannounced(stream: trio.abc.Stream) -> None:  # no Content-Length: read to EOF
        await stream.send_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + PNG * 4)

    server = await serve({"/a.png": reply(PNG), "/big": reply(PNG * 4), "/stream": unannounced})
    rules = limits("127.0.0.1", max_media_fetch_bytes=len(PNG))
    base = f"http://127.0.0.1:{server.port}"
    assert (await fetch_image(f"{base}/a.png", PARAM, rules)).width == 16  # exactly the cap
    for path in ("/big", "/stream"):
        message = await refused(base + path, rules)
        assert f"larger than {len(PNG)} bytes (--max-media-fetch-bytes)" in message


async def test_the_timeout_and_cancellation(serve: Serve) -> None:
    async def hang(stream: trio.abc.Stream) -> None:
        await trio.sleep_forever()

    async def trickle(stream: trio.abc.Stream) -> None:
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10000\r\n\r\n" + PNG[:8])
        await trio.sleep_forever()

    async def wait_for_hangup(stream: trio.abc.Stream) -> None:
        assert await stream.receive_some(100) == b""
        server.closed.set()

    server = await serve({"/hang": hang, "/trickle": trickle, "/watch": wait_for_hangup})
    rules = limits("127.0.0.1", media_fetch_timeout=0.3)
    base = f"http://127.0.0.1:{server.port}"
    for path in ("/hang", "/trickle"):
        assert "took longer than 0.3 s" in await refused(base + path, rules)
    # a cancelled fetch closes its connection
    server.received = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(fetch_image, f"{base}/watch", PARAM, limits("127.0.0.1"))
        await server.received.wait()
        nursery.cancel_scope.cancel()
    with trio.fail_after(10):
        await server.closed.wait()


async def test_tls_is_checked_against_the_name(serve: Serve, resolver: Resolver) -> None:
    ca = trustme.CA()
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("images.test").configure_cert(tls)
    server = await serve({"/a.png": reply(PNG)}, tls)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    rules = limits("images.test", "other.test")
    image = await fetch_image(
        f"https://images.test:{server.port}/a.png", PARAM, rules, ssl_context=client
    )
    assert image.width == 16
    assert server.sni == ["images.test"]  # the name, though the connection went to 127.0.0.1
    # the same address under another name: its certificate does not match
    message = await refused(f"https://other.test:{server.port}/a.png", rules, ssl_context=client)
    assert "certificate" in message and "'other.test'" in message
    # a CA the client does not trust
    message = await refused(f"https://images.test:{server.port}/a.png", rules)
    assert "certificate verify failed" in message
    assert server.requests == [("/a.png", f"images.test:{server.port}")]


async def test_the_address_is_pinned_from_one_lookup(serve: Serve, resolver: Resolver) -> None:
    """A name resolved once: a second lookup would answer another address (a DNS rebinding),
    and none is made; the connection goes to the first answer's address."""
    server = await serve({"/a.png": reply(PNG)})
    resolver.names["rebind.test"] = [["127.0.0.1"], ["169.254.169.254"]]
    image = await fetch_image(
        f"http://rebind.test:{server.port}/a.png", PARAM, limits("rebind.test")
    )
    assert image.width == 16
    assert resolver.lookups == ["rebind.test"]
    assert server.connections == 1
    assert server.requests == [("/a.png", f"rebind.test:{server.port}")]


async def test_private_addresses_need_a_host_listed_by_name(
    serve: Serve, resolver: Resolver
) -> None:
    server = await serve({"/a.png": reply(PNG)})
    port = server.port
    anywhere = limits("*")
    for url, address in (
        ("http://metadata.test/latest/meta-data/", "169.254.169.254"),
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254"),
        (f"http://images.test:{port}/a.png", "127.0.0.1"),
        (f"http://127.0.0.1:{port}/a.png", "127.0.0.1"),
        ("http://mixed.test/a.png", "10.1.2.3"),  # one private address among public ones
    ):
        message = await refused(url, anywhere)
        assert f"resolves to {address}, a loopback, private, link-local or reserved" in message
    assert "not one this server fetches" in await refused(
        f"http://images.test:{port}/a.png", limits("*.images.test")
    )
    subdomain = limits("*.test")
    message = await refused(f"http://images.test:{port}/a.png", subdomain)
    assert "resolves to 127.0.0.1" in message
    assert server.connections == 0
    # listed by name (or as the address itself), the operator allows where it resolves
    assert (
        await fetch_image(f"http://images.test:{port}/a.png", PARAM, limits("images.test"))
    ).width == 16
    assert (
        await fetch_image(f"http://127.0.0.1:{port}/a.png", PARAM, limits("127.0.0.1"))
    ).width == 16
    assert server.connections == 2


async def test_a_requests_urls_are_fetched_at_once(serve: Serve) -> None:
    """Both requests are in flight together (each answer waits for the other's arrival),
    the fetched images replace the URLs in order, and the first refusal in the parts' order
    is the request's, the other fetches cancelled."""
    arrived = {"/one": trio.Event(), "/two": trio.Event()}

    def after_both(path: str, body: bytes) -> Route:
        async def send(stream: trio.abc.Stream) -> None:
            arrived[path].set()
            for event in arrived.values():
                await event.wait()
            await reply(body)(stream)

        return send

    async def hang(stream: trio.abc.Stream) -> None:
        await trio.sleep_forever()

    server = await serve(
        {"/one": after_both("/one", PNG), "/two": after_both("/two", png(2, (8, 8))),
         "/hang": hang}
    )  # fmt: skip
    base = f"http://127.0.0.1:{server.port}"
    rules = limits("127.0.0.1", media_fetch_timeout=5)
    engine: Any = SimpleNamespace(takes_images=True, config=SimpleNamespace(max_images=4))

    def request(*paths: str) -> GenerateRequest:
        parts = [{"type": "image_url", "image_url": {"url": base + path}} for path in paths]
        body = json.dumps({"messages": [{"role": "user", "content": parts}]}).encode()
        return parse_chat_request(body, rules).generate

    fetched = await fetch_remote_images(request("/one", "/two"), engine)
    assert fetched.messages is not None
    images = fetched.messages[0].images
    assert [(i.width, i.param) for i in images] == [
        (16, "messages[0].content[0].image_url.url"),
        (8, "messages[0].content[1].image_url.url"),
    ]
    assert not any(isinstance(i, RemoteImage) for i in images)
    with pytest.raises(ApiError) as error:
        await fetch_remote_images(request("/hang", "/missing"), engine)
    assert error.value.param == "messages[0].content[1].image_url.url"
    assert "HTTP 404" in error.value.message
    # the engine would refuse it (more than --max-images): nothing is fetched
    served = len(server.requests)
    many = request("/one", "/two", "/one", "/two", "/one")
    assert await fetch_remote_images(many, engine) is many
    assert len(server.requests) == served
