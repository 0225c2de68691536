"""``GET /openapi.json``: a valid OpenAPI 3.1 document, and the server keeps its promises.

Schemathesis generates requests from the document, valid ones and invalid ones, and sends
them to ``llmtrio serve`` on the gemma test model: every answer must be a 2xx or a 4xx in
OpenAI's error shape (never a 5xx, never a hang), with a documented status, content type and
body. Generation is kept short by capping ``max_tokens`` in what is sent (the document
itself promises the real bounds)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.specs.openapi.definitions import OPENAPI_31

from llmtrio._routes import CHAT_PATH, COMPLETIONS_PATH
from llmtrio.ring import RingConfig
from llmtrio.web import ServeConfig
from llmtrio.web._openapi import openapi

from ._helpers import engine_config
from ._procs import Ring
from ._server import LiveServer, start_server

MAX_TOKENS = 8
SCHEMA = schemathesis.openapi.from_dict(openapi())
OPERATIONS = [
    ("POST", CHAT_PATH, 30),
    ("POST", COMPLETIONS_PATH, 30),
    ("GET", "/v1/models", 5),
    ("GET", "/health", 5),
    ("GET", "/openapi.json", 2),
]


def test_the_document_is_valid_openapi_3_1() -> None:
    document = openapi()
    jsonschema.Draft202012Validator(OPENAPI_31).validate(document)
    assert document["openapi"] == "3.1.0"
    # Every reference resolves.
    text = repr(document)
    for name in document["components"]["schemas"]:
        assert name in text
    for ref in _refs(document):
        assert ref.removeprefix("#/components/schemas/") in document["components"]["schemas"]
    # Keys are optional: the empty requirement comes first; health and models stay open.
    assert document["security"][0] == {}
    assert document["paths"]["/health"]["get"]["security"] == [{}]


def _refs(value: object) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "$ref":
                yield item
            else:
                yield from _refs(item)
    elif isinstance(value, list):
        for item in value:
            yield from _refs(item)


@pytest.fixture(scope="module")
def server(gemma_path: Path) -> Iterator[LiveServer]:
    server = start_server(
        engine_config(gemma_path, max_inflight=2, ctx_size=512),
        ServeConfig(host="127.0.0.1", port=0, ring=RingConfig(max_streams=8), graceful_timeout=1),
    )
    yield server
    server.stop()


def test_the_server_serves_the_document(server: LiveServer) -> None:
    response = httpx.get(server.url + "/openapi.json", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == openapi()


def _short(body: Any) -> Any:
    """``body`` with generation capped at ``MAX_TOKENS`` (whatever else it holds)."""
    if not isinstance(body, dict):
        return body
    body = dict(body)
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_TOKENS:
            body[key] = MAX_TOKENS
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = MAX_TOKENS
    return body


# Invalid requests only where there is something to get wrong: GETs take no parameters.
RUNS = [
    (method, path, examples, mode)
    for method, path, examples in OPERATIONS
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if method == "POST" or mode is GenerationMode.POSITIVE
]


@pytest.mark.slow
@pytest.mark.parametrize(("method", "path", "examples", "mode"), RUNS)
def test_every_generated_request_gets_a_2xx_or_a_4xx_in_openai_shape(
    server: LiveServer, method: str, path: str, examples: int, mode: GenerationMode
) -> None:
    operation = SCHEMA[path][method]
    checks = [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_headers_conformance,
        response_schema_conformance,
    ]
    if mode is GenerationMode.NEGATIVE:
        checks.append(negative_data_rejection)

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=examples // 2 if mode is GenerationMode.NEGATIVE else examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def run(case: schemathesis.Case) -> None:
        case.body = _short(case.body)
        response = case.call(base_url=server.url, timeout=60)  # a hang fails here
        case.validate_response(response, checks=checks)
        if 400 <= response.status_code < 500:
            error = response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}

    run()


def test_the_document_states_the_running_servers_limits(tmp_path: Path, gemma_path: Path) -> None:
    """``serve --max-stop 8`` (and the other request limits) shows in its own document, as the
    bounds its workers check."""
    with Ring.opened(tmp_path, gemma_path) as ring:
        ingress = ring.ingress(
            "limited", "--max-stop=8", "--max-stop-chars=12", "--max-messages=3",
            "--max-tokens-limit=100",
        )  # fmt: skip
        document = httpx.get(ingress.url + "/openapi.json", timeout=30).json()
    schemas = document["components"]["schemas"]
    chat = schemas["ChatCompletionRequest"]["properties"]
    stop = chat["stop"]["anyOf"][0]["anyOf"]
    assert stop[1]["maxItems"] == 8
    assert stop[0]["maxLength"] == stop[1]["items"]["maxLength"] == 12
    assert chat["messages"]["maxItems"] == 3
    for request, field in (("ChatCompletionRequest", "max_tokens"),
                           ("ChatCompletionRequest", "max_completion_tokens"),
                           ("CompletionRequest", "max_tokens")):  # fmt: skip
        assert schemas[request]["properties"][field]["anyOf"][0]["maximum"] == 100
    # The defaults: OpenAI's 4 stop sequences; no token limit but a C int's.
    default = openapi()["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert default["stop"]["anyOf"][0]["anyOf"][1]["maxItems"] == 4
    assert default["max_tokens"]["anyOf"][0]["maximum"] == 2**31 - 1
