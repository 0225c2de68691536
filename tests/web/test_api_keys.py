"""API keys on the public listener: Bearer or X-Api-Key, every key compared, 401 in OpenAI's
shape; /health, /v1/models and the page stay open; /metrics and the API need a key; CORS
preflight still works."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from llmtrio.api import CHAT_PATH, COMPLETIONS_PATH, MODELS_LOAD_PATH, MODELS_UNLOAD_PATH
from llmtrio.cli._configs import _api_keys
from llmtrio.cli._main import _parser
from llmtrio.ring import Ring
from llmtrio.web import ApiKeys, ServeConfig, read_key_file

from .._helpers import engine_config, open_ingress
from .._stack import open_stack

HI = [{"role": "user", "content": "Say hi."}]


def test_a_key_is_matched_from_either_header_against_every_key() -> None:
    keys = ApiKeys(["first-key", "second-key"])
    assert keys
    assert not ApiKeys([])
    first = keys.match({"authorization": "Bearer first-key"})
    second = keys.match({"x-api-key": "second-key"})
    assert first is not None and second is not None and first != second
    assert keys.match({"authorization": "bearer  second-key "}) == second
    assert "first-key" not in first  # a name for the key, not the key
    for headers in (
        {},
        {"authorization": "Bearer"},
        {"authorization": "Bearer first-ke"},
        {"authorization": "Bearer first-key2"},
        {"authorization": "Basic first-key"},
        {"x-api-key": ""},
        {"x-api-key": "FIRST-KEY"},
    ):
        assert keys.match(headers) is None, headers


def test_a_key_file_skips_blank_lines_and_comments(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# the team's keys\n\nalpha\n  beta  \n# gamma\n")
    assert read_key_file(path) == ["alpha", "beta"]
    args = _parser().parse_args(
        ["serve", "--api-key", "cli-key", "--api-key-file", str(path), "--model", "m.gguf"]
    )
    assert _api_keys(args) == ["cli-key", "alpha", "beta"]
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n")
    with pytest.raises(ValueError, match="holds no key"):
        _api_keys(_parser().parse_args(["serve", "--api-key-file", str(empty)]))
    with pytest.raises(ValueError, match="cannot read"):
        _api_keys(_parser().parse_args(["serve", "--api-key-file", str(tmp_path / "none")]))


def assert_401(response: httpx.Response) -> None:
    assert response.status_code == 401, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_api_key"
    assert error["type"] == "invalid_request_error"
    assert response.headers["www-authenticate"].startswith("Bearer")


async def test_keys_close_the_api_and_metrics_but_not_health_models_or_the_page() -> None:
    ring = Ring(max_streams=4, park_timeout=0.2)
    config = ServeConfig(host="127.0.0.1", port=0, graceful_timeout=1, api_keys=["k1", "k2"])
    async with open_ingress(ring, config) as server:
        http, url = server.client, server.url
        for path in ("/", "/health", "/v1/models"):
            response = await http.get(url + path)
            assert response.status_code in (200, 503), (path, response.status_code)  # no worker
        for method, path in (
            ("POST", CHAT_PATH),
            ("POST", COMPLETIONS_PATH),
            ("GET", "/metrics"),
            ("POST", MODELS_LOAD_PATH),
            ("POST", MODELS_UNLOAD_PATH),
        ):
            assert_401(await http.request(method, url + path, json={"messages": HI}))
            wrong = {"Authorization": "Bearer k3"}
            assert_401(await http.request(method, url + path, json={}, headers=wrong))
        assert_401(await http.get(url + "/nowhere"))  # no hint of what exists without a key
        metrics = await http.get(url + "/metrics", headers={"X-Api-Key": "k2"})
        assert metrics.status_code == 200
        assert 'llmtrio_http_requests_total{path="/metrics",status="401"' in metrics.text
        # With a key, the API is served (here: no worker, so 503 after the park timeout).
        served = await http.post(
            url + CHAT_PATH, json={"messages": HI}, headers={"X-Api-Key": "k1"}
        )
        assert served.status_code == 503
        # A CORS preflight carries no key and still gets its 204.
        origin = url.replace("127.0.0.1", "localhost")
        preflight = await http.options(
            url + CHAT_PATH,
            headers={
                "Origin": origin,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            },
        )
        assert preflight.status_code == 204
        assert "authorization" in preflight.headers["access-control-allow-headers"]
        # The 401 to a cross-origin page is readable by it (CORS headers on the error).
        refused = await http.post(url + CHAT_PATH, json={}, headers={"Origin": origin})
        assert refused.status_code == 401
        assert refused.headers["access-control-allow-origin"] == origin


async def test_a_key_serves_a_real_completion(gemma_path: Path) -> None:
    engine = engine_config(gemma_path, max_inflight=1, ctx_size=256)
    config = ServeConfig(host="127.0.0.1", port=0, graceful_timeout=1, api_keys=["secret"])
    async with open_stack(engine, config) as stack, httpx.AsyncClient(timeout=60) as http:
        assert_401(await http.post(stack.url + CHAT_PATH, json={"messages": HI, "max_tokens": 2}))
        response = await http.post(
            stack.url + CHAT_PATH,
            json={"messages": HI, "max_tokens": 2},
            headers={"Authorization": "Bearer secret"},
        )
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] >= 1
        await stack.wait_idle()
