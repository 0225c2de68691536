"""Chat completions' ``image_url`` parts over HTTP, through the ring: gemma-3-270m with a
random-weight ``gemma3`` projector (tests/_projector.py), with the official ``openai``
client and raw bodies; refusals are 400s naming the part (413 over the body limits)."""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from PIL import Image as PILImage

from llmtrio.web import ServeConfig
from llmtrio.worker import RequestLimits

from .._projector import GEMMA3_IMAGE_TOKENS
from .._server import LiveServer
from .._vision import PROMPT, FileServer, data_uri, file_server, png, vision_server


def image_part(data: bytes, **extra: object) -> dict[str, object]:
    return {"type": "image_url", "image_url": {"url": data_uri(data), **extra}}


def user(*parts: dict[str, object]) -> list[dict[str, object]]:
    return [{"role": "user", "content": [*parts, {"type": "text", "text": PROMPT}]}]


#: Image URLs the server fetches: the loopback file server's (listed by its address).
IMAGES = {"a.png": png(1), "b.png": png(2), "page.html": b"<!doctype html><p>not an image"}


@pytest.fixture(scope="module")
def images() -> Iterator[FileServer]:
    with file_server(IMAGES) as served:
        yield served


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, gemma_path: Path) -> Iterator[LiveServer]:
    with vision_server(
        tmp_path_factory.mktemp("vision-api"),
        gemma_path,
        max_images=3,
        serve=ServeConfig(port=0, max_body_bytes=4096, max_image_body_bytes=2 * 2**20),
        limits=RequestLimits(max_image_pixels=512 * 512, allowed_media_domains=("127.0.0.1",)),
    ) as live:
        yield live


def post(server: LiveServer, body: dict[str, object]) -> httpx.Response:
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)


def chat(messages: list[dict[str, object]], **fields: object) -> dict[str, object]:
    return {"model": "gemma", "messages": messages, "max_tokens": 6, "temperature": 0, **fields}


def test_openai_client_image_url(server: LiveServer) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    reply = client.chat.completions.create(
        model="gemma",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": PROMPT},
                    {"type": "image_url", "image_url": {"url": data_uri(png(1)), "detail": "low"}},
                ],
            }
        ],
        max_tokens=6,
        temperature=0,
    )
    assert reply.choices[0].message.content
    text_only = client.chat.completions.create(
        model="gemma",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=6,
        temperature=0,
    )
    assert reply.usage is not None and text_only.usage is not None
    # the image's embeddings, its begin/end-of-image tokens, and the newline joining parts
    assert reply.usage.prompt_tokens >= text_only.usage.prompt_tokens + GEMMA3_IMAGE_TOKENS + 2


def test_same_image_twice_is_cached_and_images_differ(server: LiveServer) -> None:
    first = post(server, chat(user(image_part(png(2)))))
    assert first.status_code == 200, first.text
    answer = first.json()["choices"][0]["message"]["content"]
    follow = user(image_part(png(2)))
    follow += [
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And the colours?"},
    ]
    second = post(server, chat(follow))
    assert second.status_code == 200, second.text
    details = second.json()["usage"]["prompt_tokens_details"]
    assert details["cached_tokens"] > GEMMA3_IMAGE_TOKENS
    answers = {
        post(server, chat(user(image_part(png(seed))))).json()["choices"][0]["message"]["content"]
        for seed in (3, 4, 5, 6)
    }
    assert len(answers) > 1, "different images should give different answers"


def test_several_images_and_formats(server: LiveServer) -> None:
    rng = np.random.default_rng(9)
    photo = PILImage.fromarray(rng.integers(0, 256, (24, 24, 3), dtype=np.uint8))
    parts = []
    for fmt, media_type in (("JPEG", "image/jpeg"), ("WEBP", "image/webp"), ("GIF", "image/gif")):
        out = io.BytesIO()
        photo.save(out, fmt)
        parts.append(
            {"type": "image_url", "image_url": {"url": data_uri(out.getvalue(), media_type)}}
        )
    response = post(server, chat(user(*parts)))
    assert response.status_code == 200, response.text
    one = post(server, chat(user(parts[0])))
    extra = response.json()["usage"]["prompt_tokens"] - one.json()["usage"]["prompt_tokens"]
    # two more images, each its tokens, its begin/end-of-image tokens and a joining newline
    assert extra >= 2 * (GEMMA3_IMAGE_TOKENS + 2)


def refusal(response: httpx.Response, status: int = 400) -> tuple[str, str]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    return error.get("param") or "", error["message"]


def test_image_to_text_only_model(server: LiveServer) -> None:
    param, message = refusal(post(server, {**chat(user(image_part(png(1)))), "model": "text-only"}))
    assert param == "messages"
    assert "takes no images" in message


def test_not_an_image(server: LiveServer) -> None:
    body = chat(user({"type": "image_url", "image_url": {"url": data_uri(b"%PDF-1.4 hi")}}))
    param, message = refusal(post(server, body))
    assert param == "messages[0].content[0].image_url.url"
    assert "not a PNG, JPEG, WebP or GIF" in message


def test_truncated_png(server: LiveServer) -> None:
    data = png(3, (64, 64))
    param, message = refusal(post(server, chat(user(image_part(data[: len(data) // 2])))))
    assert param == "messages[0].content[0].image_url.url"
    assert "could not be decoded" in message
    # the worker goes on serving
    assert post(server, chat(user(image_part(png(3))))).status_code == 200


def png_header(width: int, height: int) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + body))
        return struct.pack(">I", len(body)) + kind + body + crc

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64))


def test_decompression_bomb(server: LiveServer) -> None:
    param, message = refusal(post(server, chat(user(image_part(png_header(40_000, 40_000))))))
    assert param == "messages[0].content[0].image_url.url"
    assert "more than the 262144" in message


def test_too_many_images(server: LiveServer) -> None:
    parts = [image_part(png(i, (8, 8))) for i in range(4)]
    param, message = refusal(post(server, chat(user(*parts))))
    assert param == "messages"
    assert "more than the 3" in message


@pytest.mark.parametrize(
    ("part", "param", "fragment"),
    [
        ({"type": "image_url"}, "messages[0].content[0].image_url", "Missing"),
        ({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
         "messages[0].content[0].image_url.url", "not one this server fetches images from"),
        ({"type": "image_url", "image_url": {"url": data_uri(png(1)), "detail": "max"}},
         "messages[0].content[0].image_url.detail", "Supported values"),
    ],
)  # fmt: skip
def test_bad_parts(server: LiveServer, part: dict[str, object], param: str, fragment: str) -> None:
    got, message = refusal(post(server, chat(user(part))))
    assert got == param
    assert fragment in message


def test_image_in_assistant_message_refused(server: LiveServer) -> None:
    messages = [
        {"role": "user", "content": PROMPT},
        {"role": "assistant", "content": [image_part(png(1))]},
        {"role": "user", "content": PROMPT},
    ]
    param, _ = refusal(post(server, chat(messages)))
    assert param.startswith("messages[1].content[0]")


def test_body_limits(server: LiveServer) -> None:
    # over --max-body-bytes (4096) without an image: 413
    text = chat([{"role": "user", "content": "x" * 8000}])
    refusal(post(server, text), 413)
    # with an image, up to --max-image-body-bytes (2 MiB)
    big = png(5, (200, 200))
    assert len(big) > 4096
    assert post(server, chat(user(image_part(big)))).status_code == 200
    huge = chat(user(image_part(b"\0" * (3 * 2**20))))
    refusal(post(server, huge), 413)


def test_models_say_which_take_images(server: LiveServer) -> None:
    listed = httpx.get(server.url + "/v1/models", timeout=10).json()["data"]
    modalities = {model["id"]: model["input_modalities"] for model in listed}
    assert modalities == {"gemma": ["text", "image"], "text-only": ["text"]}


def test_image_url_is_fetched_as_its_bytes_would_be_sent(
    server: LiveServer, images: FileServer
) -> None:
    """Two http URLs (fetched at once) give the answer and the prompt the same bytes give as
    data URIs, and the prompt cache knows them as the same images. (The bytes go first, to
    warm the cache: a reused prefix changes the batch shapes, and with them a near tie.)"""
    inline = chat(user(image_part(IMAGES["a.png"]), image_part(IMAGES["b.png"])))
    assert post(server, inline).status_code == 200
    sent = post(server, inline)
    urls = [{"type": "image_url", "image_url": {"url": images.url(n)}} for n in ("a.png", "b.png")]
    fetched = post(server, chat(user(*urls)))
    assert sent.status_code == 200 and fetched.status_code == 200, fetched.text
    assert fetched.json()["choices"][0]["message"] == sent.json()["choices"][0]["message"]
    assert fetched.json()["usage"] == sent.json()["usage"]
    details = fetched.json()["usage"]["prompt_tokens_details"]
    assert details["cached_tokens"] > 2 * GEMMA3_IMAGE_TOKENS


def test_image_url_refusals(server: LiveServer, images: FileServer) -> None:
    at = "messages[0].content[0].image_url.url"

    def url_part(url: str) -> dict[str, object]:
        return {"type": "image_url", "image_url": {"url": url}}

    param, message = refusal(post(server, chat(user(url_part(images.url("page.html"))))))
    assert param == at and "not a PNG, JPEG, WebP or GIF" in message
    param, message = refusal(post(server, chat(user(url_part(images.url("gone.png"))))))
    assert param == at and "HTTP 404" in message
    other = f"http://localhost:{images.port}/a.png"  # the same server, under a name not listed
    param, message = refusal(post(server, chat(user(url_part(other)))))
    assert param == at and "'localhost' is not one this server fetches images from" in message
    hits = images.hits
    body = {**chat(user(url_part(images.url("a.png")))), "model": "text-only"}
    param, message = refusal(post(server, body))
    assert param == "messages" and "takes no images" in message
    assert images.hits == hits, "an image the model cannot take is not fetched"
