"""Images in the agents' APIs over HTTP, through the ring: the Responses API's
``input_image`` parts and Anthropic's ``image`` blocks (base64 sources), with the official
``openai`` and ``anthropic`` clients and raw bodies, on gemma-3-270m with a random-weight
``gemma3`` projector (tests/_projector.py). Refusals are 400s in each API's error shape,
naming the part."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from llmtrio.web import ServeConfig
from llmtrio.worker import RequestLimits

from .._projector import GEMMA3_IMAGE_TOKENS
from .._server import LiveServer
from .._vision import PROMPT, FileServer, data_uri, file_server, png, vision_server

#: The image the loopback file server serves (its address is listed).
IMAGE = png(7)


@pytest.fixture(scope="module")
def images() -> Iterator[FileServer]:
    with file_server({"i.png": IMAGE}) as served:
        yield served


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, gemma_path: Path) -> Iterator[LiveServer]:
    with vision_server(
        tmp_path_factory.mktemp("vision-agents"),
        gemma_path,
        max_images=2,
        serve=ServeConfig(port=0, max_image_body_bytes=2 * 2**20),
        limits=RequestLimits(max_image_pixels=512 * 512, allowed_media_domains=("127.0.0.1",)),
    ) as live:
        yield live


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def a_image(data: bytes, media_type: str = "image/png") -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type,
                                        "data": b64(data)}}  # fmt: skip


def r_image(data: bytes) -> dict[str, Any]:
    return {"type": "input_image", "image_url": data_uri(data), "detail": "auto"}


def messages_body(*blocks: dict[str, Any], model: str = "gemma") -> dict[str, Any]:
    content = [*blocks, {"type": "text", "text": PROMPT}]
    return {
        "model": model,
        "max_tokens": 6,
        "temperature": 0,
        "messages": [{"role": "user", "content": content}],
    }


def responses_body(*parts: dict[str, Any], model: str = "gemma") -> dict[str, Any]:
    content = [*parts, {"type": "input_text", "text": PROMPT}]
    return {
        "model": model,
        "max_output_tokens": 6,
        "temperature": 0,
        "input": [{"role": "user", "content": content}],
    }


def post(server: LiveServer, path: str, body: dict[str, Any]) -> httpx.Response:
    headers = {"x-api-key": "none", "anthropic-version": "2023-06-01"}
    return httpx.post(server.url + path, json=body, headers=headers, timeout=120)


def anthropic_text(server: LiveServer, body: dict[str, Any]) -> str:
    response = post(server, "/v1/messages", body)
    assert response.status_code == 200, response.text
    return "".join(b["text"] for b in response.json()["content"] if b["type"] == "text")


def responses_text(server: LiveServer, body: dict[str, Any]) -> str:
    response = post(server, "/v1/responses", body)
    assert response.status_code == 200, response.text
    items = [i for i in response.json()["output"] if i["type"] == "message"]
    return "".join(p["text"] for i in items for p in i["content"] if p["type"] == "output_text")


def test_anthropic_client_image_block(server: LiveServer) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    reply = client.messages.create(
        model="gemma",
        max_tokens=6,
        extra_body={"temperature": 0},  # this client takes no temperature argument
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": PROMPT},
                    {
                        "type": "image",
                        "source": {
                            "type": "base64",
                            "media_type": "image/png",
                            "data": b64(png(1)),
                        },
                    },
                ],
            }
        ],
    )
    assert reply.content and reply.content[0].type == "text"
    text_only = client.messages.create(
        model="gemma",
        max_tokens=6,
        extra_body={"temperature": 0},
        messages=[{"role": "user", "content": PROMPT}],
    )
    # the image's embeddings, its begin/end-of-image tokens, and the newline joining blocks
    assert reply.usage.input_tokens >= text_only.usage.input_tokens + GEMMA3_IMAGE_TOKENS + 2
    counted = post(server, "/v1/messages/count_tokens", messages_body(a_image(png(1))))
    assert counted.status_code == 200, counted.text
    assert counted.json()["input_tokens"] >= text_only.usage.input_tokens + GEMMA3_IMAGE_TOKENS


def test_openai_client_input_image(server: LiveServer) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    reply = client.responses.create(
        model="gemma",
        max_output_tokens=6,
        temperature=0,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": PROMPT},
                    {"type": "input_image", "image_url": data_uri(png(1)), "detail": "low"},
                ],
            }
        ],
    )
    assert reply.output_text
    text_only = client.responses.create(
        model="gemma", max_output_tokens=6, temperature=0, input=PROMPT
    )
    assert reply.usage is not None and text_only.usage is not None
    assert reply.usage.input_tokens >= text_only.usage.input_tokens + GEMMA3_IMAGE_TOKENS + 2


def test_anthropic_images_differ_and_repeat_is_cached(server: LiveServer) -> None:
    answers = {anthropic_text(server, messages_body(a_image(png(seed)))) for seed in (3, 4, 5, 6)}
    assert len(answers) > 1, "different images should give different answers"
    first = messages_body(a_image(png(7)))
    answer = anthropic_text(server, first)
    first["messages"] += [
        {"role": "assistant", "content": answer or "ok"},
        {"role": "user", "content": "And the colours?"},
    ]
    second = post(server, "/v1/messages", first)
    assert second.status_code == 200, second.text
    assert second.json()["usage"]["cache_read_input_tokens"] > GEMMA3_IMAGE_TOKENS


def test_responses_images_differ_and_repeat_is_cached(server: LiveServer) -> None:
    answers = {responses_text(server, responses_body(r_image(png(seed)))) for seed in (3, 4, 5, 6)}
    assert len(answers) > 1, "different images should give different answers"
    first = responses_body(r_image(png(8)))
    answer = responses_text(server, first)
    first["input"] += [
        {"role": "assistant", "content": answer or "ok"},
        {"role": "user", "content": "And the colours?"},
    ]
    second = post(server, "/v1/responses", first)
    assert second.status_code == 200, second.text
    details = second.json()["usage"]["input_tokens_details"]
    assert details["cached_tokens"] > GEMMA3_IMAGE_TOKENS


def test_anthropic_image_in_a_tool_result(server: LiveServer) -> None:
    body = {
        "model": "gemma",
        "max_tokens": 4,
        "temperature": 0,
        "messages": [
            {"role": "user", "content": "Take a photo."},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "t1", "name": "camera", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1",
                 "content": [{"type": "text", "text": "the photo:"}, a_image(png(2))]},
                {"type": "text", "text": PROMPT}]},
        ],
        "tools": [{"name": "camera", "input_schema": {"type": "object"}}],
    }  # fmt: skip
    with_image = post(server, "/v1/messages", body)
    assert with_image.status_code == 200, with_image.text
    body["messages"][2]["content"][0]["content"] = [{"type": "text", "text": "the photo:"}]
    without = post(server, "/v1/messages", body)
    assert without.status_code == 200, without.text
    extra = with_image.json()["usage"]["input_tokens"] - without.json()["usage"]["input_tokens"]
    assert extra >= GEMMA3_IMAGE_TOKENS + 2


def anthropic_refusal(response: httpx.Response) -> str:
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    return str(body["error"]["message"])


def openai_refusal(response: httpx.Response) -> tuple[str, str]:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    return error["param"], error["message"]


def test_anthropic_refusals_name_the_block(server: LiveServer) -> None:
    at = "messages[0].content[0].source"
    bad = anthropic_refusal(post(server, "/v1/messages", messages_body(a_image(b"%PDF-1.4 x"))))
    assert f"{at}.data" in bad and "not a PNG, JPEG, WebP or GIF" in bad
    data = png(3, (64, 64))
    cut = anthropic_refusal(post(server, "/v1/messages", messages_body(a_image(data[:200]))))
    assert f"{at}.data" in cut and "could not be decoded" in cut
    # a JPEG's media_type on PNG bytes: the bytes decide
    mislabelled = post(server, "/v1/messages", messages_body(a_image(png(3), "image/jpeg")))
    assert mislabelled.status_code == 200, mislabelled.text
    usage = mislabelled.json()["usage"]  # the image's prefix may come from the prompt cache
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] > GEMMA3_IMAGE_TOKENS
    url = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    refused = anthropic_refusal(post(server, "/v1/messages", messages_body(url)))
    assert f"{at}.url" in refused and "not one this server fetches images from" in refused
    many = messages_body(*(a_image(png(i, (8, 8))) for i in range(3)))
    assert "more than the 2" in anthropic_refusal(post(server, "/v1/messages", many))
    text_only = messages_body(a_image(png(1)), model="text-only")
    assert "takes no images" in anthropic_refusal(post(server, "/v1/messages", text_only))
    client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as error:
        body = messages_body(a_image(b"not an image"))
        client.messages.create(
            model=body["model"], max_tokens=body["max_tokens"], messages=body["messages"]
        )
    assert f"{at}.data" in error.value.body["error"]["message"]  # type: ignore[index]


def test_responses_refusals_name_the_part(server: LiveServer) -> None:
    at = "input[0].content[0].image_url"
    param, message = openai_refusal(
        post(server, "/v1/responses", responses_body(r_image(b"%PDF-1.4 x")))
    )
    assert param == at and "not a PNG, JPEG, WebP or GIF" in message
    data = png(3, (64, 64))
    param, message = openai_refusal(
        post(server, "/v1/responses", responses_body(r_image(data[:200])))
    )
    assert param == at and "could not be decoded" in message
    file_part = {"type": "input_image", "file_id": "file-1", "detail": "auto"}
    param, _ = openai_refusal(post(server, "/v1/responses", responses_body(file_part)))
    assert param == "input[0].content[0].file_id"
    many = responses_body(*(r_image(png(i, (8, 8))) for i in range(3)))
    param, message = openai_refusal(post(server, "/v1/responses", many))
    assert param == "input" and "more than the 2" in message
    text_only = responses_body(r_image(png(1)), model="text-only")
    param, message = openai_refusal(post(server, "/v1/responses", text_only))
    assert param == "input" and "takes no images" in message
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.create(**responses_body(r_image(b"not an image")))
    assert error.value.param == at


def test_image_urls_in_the_agents_apis(server: LiveServer, images: FileServer) -> None:
    """Anthropic's ``url`` source and the Responses API's ``input_image`` URL are fetched:
    the same answer as the same bytes sent inline."""
    url = images.url("i.png")
    a_url = {"type": "image", "source": {"type": "url", "url": url}}
    r_url = {"type": "input_image", "image_url": url, "detail": "auto"}
    # inline first, twice (the cache warm), then the URL: the same cached prefix each time
    inline = [anthropic_text(server, messages_body(a_image(IMAGE))) for _ in range(2)]
    assert anthropic_text(server, messages_body(a_url)) == inline[1]
    inline = [responses_text(server, responses_body(r_image(IMAGE))) for _ in range(2)]
    assert responses_text(server, responses_body(r_url)) == inline[1]
    counted = post(server, "/v1/messages/count_tokens", messages_body(a_url))
    assert counted.status_code == 200, counted.text
    assert counted.json()["input_tokens"] > GEMMA3_IMAGE_TOKENS
    gone = {"type": "image", "source": {"type": "url", "url": images.url("gone.png")}}
    refused = anthropic_refusal(post(server, "/v1/messages", messages_body(gone)))
    assert "messages[0].content[0].source.url" in refused and "HTTP 404" in refused
