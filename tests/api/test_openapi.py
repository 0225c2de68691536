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

from llmtrio.api import (
    ANTHROPIC_ERRORS,
    ROUTES,
    RequestLimits,
    error_family,
    openapi,
    request_schema,
)
from llmtrio.api import _errors as errors
from llmtrio.ring import RingConfig
from llmtrio.web import ServeConfig
from llmtrio.web._auth import OPEN_PATHS

from .._helpers import engine_config
from .._procs import Ring
from .._server import LiveServer, start_server

MAX_TOKENS = 8
SCHEMA = schemathesis.openapi.from_dict(openapi())
# Examples per operation of the route table (the server serves a chat model: embeddings and
# reranking requests are refused, in a documented way; tests/worker/test_rerank_api.py runs the
# reranking routes against a reranking model).
EXAMPLES = {
    "createChatCompletion": 30,
    "createCompletion": 30,
    "createEmbedding": 4,
    "createResponse": 20,
    "countResponseInputTokens": 10,
    "tokenize": 12,
    "detokenize": 12,
    "listModels": 5,
    "health": 5,
    "openapi": 2,
    "createMessage": 20,
    "countMessageTokens": 10,
    "loadModel": 4,
    "unloadModel": 4,
    "rerank": 4,
    "rerankUnversioned": 2,
    "rerankV2": 4,
    "score": 4,
    # the server has no --lora-dir: every load is refused, in a documented way
    "loadLoraAdapter": 4,
    "unloadLoraAdapter": 4,
    # forms; the served model takes no audio: every one is refused, in a documented way
    "createTranscription": 6,
    "createTranslation": 4,
}
OPERATIONS = [(route.method, route.path, EXAMPLES[route.operation_id]) for route in ROUTES]


def test_the_document_is_valid_openapi_3_1() -> None:
    document = openapi()
    jsonschema.Draft202012Validator(OPENAPI_31).validate(document)
    assert document["openapi"] == "3.1.0"
    # Every reference resolves.
    text = repr(document)
    for name in document["components"]["schemas"]:
        assert name in text
    for ref in _refs(document):
        target: Any = document
        for key in ref.removeprefix("#/").split("/"):
            target = target[key]
    # Keys are optional: the empty requirement comes first; health and models stay open.
    assert document["security"][0] == {}
    assert document["paths"]["/health"]["get"]["security"] == [{}]


def test_the_operations_are_the_route_tables() -> None:
    document = openapi()
    operations = {
        (method.upper(), path): operation["operationId"]
        for path, item in document["paths"].items()
        for method, operation in item.items()
    }
    assert operations == {(route.method, route.path): route.operation_id for route in ROUTES}
    for route in ROUTES:
        operation = document["paths"][route.path][route.method.lower()]
        assert operation["summary"] == route.summary
        # Open routes need no key, in the document and at the ingress alike.
        assert (operation.get("security") == [{}]) is route.open
        assert (route.path in OPEN_PATHS) is route.open
        body = operation.get("requestBody")
        if route.endpoint is None:
            assert body is None
        else:
            media_type = "multipart/form-data" if route.form else "application/json"
            name = body["content"][media_type]["schema"]["$ref"].rsplit("/", 1)[1]
            schema = document["components"]["schemas"][name]
            fields = request_schema(route.endpoint, RequestLimits())["properties"]
            assert schema["properties"] == fields


def test_the_error_responses_are_the_error_catalogs() -> None:
    """One response per status of ``ERRORS``, listing exactly its codes and types; a ring route
    references every status a request can be refused with (not the URL's 404/405)."""
    document = openapi()
    everything = document["components"]["responses"]
    responses = {name: r for name, r in everything.items() if name.startswith("Error")}
    assert set(responses) == {f"Error{kind.status}" for kind in errors.ERRORS}
    listed = []
    for name, response in responses.items():
        assert response["content"]["application/json"]["schema"]["allOf"][0] == {
            "$ref": "#/components/schemas/Error"
        }
        error = response["content"]["application/json"]["schema"]["allOf"][1]
        error = error["properties"]["error"]["properties"]
        kinds = [kind for kind in errors.ERRORS if f"Error{kind.status}" == name]
        assert error["code"]["enum"] == [kind.code for kind in kinds]
        assert set(error["type"]["enum"]) == {kind.type for kind in kinds}
        assert ("headers" in response) is any(kind.retry_after for kind in kinds)
        for kind in kinds:
            assert (f"``{kind.code}``" if kind.code else "no code") in response["description"]
        listed += error["code"]["enum"]
    assert len(listed) == len(errors.ERRORS)
    request_statuses = {str(kind.status) for kind in errors.ERRORS if not kind.url}
    anthropic = {
        str(ANTHROPIC_ERRORS.status(kind.error(""))) for kind in errors.ERRORS if not kind.url
    }
    for route in ROUTES:
        operation = document["paths"][route.path][route.method.lower()]
        referenced = {
            status: answer["$ref"]
            for status, answer in operation["responses"].items()
            if "$ref" in answer
        }
        if route.ring and route.errors == ANTHROPIC_ERRORS:
            assert referenced == {s: f"#/components/responses/AnthropicError{s}" for s in anthropic}
        elif route.ring:
            assert referenced == {s: f"#/components/responses/Error{s}" for s in request_statuses}
        else:
            assert referenced == {}


def test_anthropics_routes_document_anthropics_error_shape() -> None:
    """The same refusals, in Anthropic's shape and statuses (529 for an overloaded ring)."""
    responses = openapi()["components"]["responses"]
    shaped = {name: r for name, r in responses.items() if name.startswith("AnthropicError")}
    statuses = {int(name.removeprefix("AnthropicError")) for name in shaped}
    expected = {ANTHROPIC_ERRORS.status(kind.error("")) for kind in errors.ERRORS if not kind.url}
    assert statuses == expected and 529 in statuses
    for status, response in ((s, shaped[f"AnthropicError{s}"]) for s in statuses):
        schema = response["content"]["application/json"]["schema"]["allOf"]
        assert schema[0] == {"$ref": "#/components/schemas/AnthropicError"}
        kind = schema[1]["properties"]["error"]["properties"]["type"]["const"]
        assert kind == errors.ANTHROPIC_TYPES[status]


def test_every_error_the_server_builds_is_in_the_catalog() -> None:
    built = [
        errors.model_not_found("m"),
        errors.missing_model(["a"]),
        errors.wrong_model_kind("m", "embedding", "/v1/chat/completions"),
        errors.request_too_large(10),
        errors.not_found("GET", "/x"),
        errors.method_not_allowed("GET", "/v1/completions"),
        errors.ring_full(1),
        errors.no_worker(5.0, 1),
        errors.shutting_down(1, cut=True),
        errors.server_error(),
        errors.model_unavailable("closing"),
        errors.worker_failed(),
        errors.invalid_api_key(),
        errors.rate_limited(10, 6),
        errors.request_timeout(30),
        errors.body_timeout(60),
        errors.HOST_NOT_ALLOWED.error("host"),
        errors.ORIGIN_NOT_ALLOWED.error("origin"),
    ]
    catalog = {(kind.status, kind.type, kind.code) for kind in errors.ERRORS}
    for error in built:
        assert (error.status, error.type, error.code) in catalog, error


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
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_TOKENS:
            body[key] = MAX_TOKENS
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = MAX_TOKENS
    if body.get("max_output_tokens") is None:  # the Responses API's (others ignore it)
        body["max_output_tokens"] = MAX_TOKENS
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
        if 400 <= response.status_code < 500 and error_family(path) == ANTHROPIC_ERRORS:
            answer = response.json()
            assert answer["type"] == "error" and set(answer["error"]) == {"type", "message"}
        elif 400 <= response.status_code < 500:
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
