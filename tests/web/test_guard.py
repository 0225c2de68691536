"""Browser-origin protection as a pure policy: which origins and host names are served."""

from __future__ import annotations

import pytest

from llmtrio.web._guard import OriginPolicy

LOOPBACK = OriginPolicy(loopback_listener=True, bound_host="127.0.0.1")


@pytest.mark.parametrize(
    "origin",
    [
        "http://localhost",
        "http://localhost:3000",
        "https://localhost:8443",
        "http://127.0.0.1:8080",
        "http://127.9.9.9",
        "http://[::1]:5173",
        "http://app.localhost:3000",
        "HTTP://LOCALHOST:3000/",
    ],
)
def test_loopback_origins_are_allowed(origin: str) -> None:
    assert LOOPBACK.allows_origin(origin, scheme="http", host="127.0.0.1:8080")


@pytest.mark.parametrize(
    "origin",
    [
        "https://evil.example",
        "http://localhost.evil.example",
        "http://127.0.0.1.evil.example",
        "null",
        "file://",
        "chrome-extension://abcdef",
        "http://10.0.0.1",
    ],
)
def test_other_origins_are_refused(origin: str) -> None:
    assert not LOOPBACK.allows_origin(origin, scheme="http", host="127.0.0.1:8080")
    refusal = LOOPBACK.refusal("POST", "http", {"host": "127.0.0.1:8080", "origin": origin})
    assert refusal is not None
    assert (refusal.status, refusal.code) == (403, "origin_not_allowed")


def test_the_servers_own_origin_is_allowed_whatever_its_name() -> None:
    policy = OriginPolicy(loopback_listener=False, bound_host="0.0.0.0")
    headers = {"host": "llm.example.com", "origin": "https://llm.example.com"}
    assert policy.refusal("POST", "https", headers) is None
    assert policy.refusal("POST", "http", headers) is not None  # another scheme, another origin


def test_allowed_origins_and_the_wildcard() -> None:
    listed = OriginPolicy(["https://App.Example.com/"], bound_host="127.0.0.1")
    assert listed.allows_origin("https://app.example.com", scheme="http", host=None)
    assert not listed.allows_origin("https://other.example.com", scheme="http", host=None)
    everyone = OriginPolicy(["*"], bound_host="127.0.0.1")
    assert everyone.allows_origin("https://anything.example", scheme="http", host=None)


@pytest.mark.parametrize(
    "host, served",
    [
        ("127.0.0.1:8080", True),
        ("localhost:8080", True),
        ("[::1]:8080", True),
        ("LOCALHOST", True),
        ("attacker.example", False),
        ("attacker.example:8080", False),
        ("127.0.0.1.nip.io", False),
        (None, True),  # HTTP/1.0 without Host
    ],
)
def test_a_loopback_listener_answers_loopback_host_names_only(
    host: str | None, served: bool
) -> None:
    assert LOOPBACK.allows_host(host) is served
    headers = {} if host is None else {"host": host}
    refusal = LOOPBACK.refusal("GET", "http", headers)
    assert (refusal is None) is served
    if refusal is not None:
        assert (refusal.status, refusal.code) == (403, "host_not_allowed")


def test_the_bound_name_is_served_and_off_loopback_any_host_is() -> None:
    named = OriginPolicy(loopback_listener=True, bound_host="devbox.internal")
    assert named.allows_host("devbox.internal:8080")
    assert OriginPolicy(loopback_listener=False).allows_host("anything.example")


def test_cors_headers_for_allowed_requests_and_preflights() -> None:
    headers = {
        "origin": "http://localhost:3000",
        "access-control-request-method": "POST",
        "access-control-request-headers": "content-type, authorization",
    }
    assert OriginPolicy.is_preflight("OPTIONS", headers)
    assert not OriginPolicy.is_preflight("POST", headers)
    preflight = dict(LOOPBACK.preflight_headers(headers))
    assert preflight["access-control-allow-origin"] == "http://localhost:3000"
    assert "POST" in preflight["access-control-allow-methods"]
    assert preflight["access-control-allow-headers"] == "content-type, authorization"
    assert LOOPBACK.cors_headers({}) == []
