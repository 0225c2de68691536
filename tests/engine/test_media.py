"""Image decoding (``llmtrio.engine``'s ``decode_image``, ``image_from_url``): formats,
refusals, and random or truncated bytes (hypothesis), without a model."""

from __future__ import annotations

import base64
import io
import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image as PILImage

from llmtrio.engine import InvalidRequestError, decode_image, image_from_url

LIMIT = 2**25


def photo(width: int = 20, height: int = 12, seed: int = 0) -> PILImage.Image:
    rng = np.random.default_rng(seed)
    return PILImage.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def encoded(image: PILImage.Image, fmt: str, **options: object) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def png_header(width: int, height: int) -> bytes:
    """A PNG's signature and IHDR chunk (8-bit RGB), and a tiny IDAT: what Pillow's open
    reads is the size, whatever follows."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64))


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_formats_decode_to_rgb(fmt: str) -> None:
    source = photo()
    image = decode_image(encoded(source, fmt), max_pixels=LIMIT, param="messages[0].content[1]")
    assert (image.width, image.height) == (20, 12)
    pixels = image.pixels()
    assert len(pixels) == 20 * 12 * 3
    if fmt == "PNG":  # lossless
        assert pixels == source.tobytes()


def test_gif_first_frame() -> None:
    frames = [PILImage.new("RGB", (8, 8), color) for color in ((255, 0, 0), (0, 0, 255))]
    out = io.BytesIO()
    frames[0].save(out, "GIF", save_all=True, append_images=frames[1:])
    pixels = decode_image(out.getvalue(), max_pixels=LIMIT, param="p").pixels()
    assert pixels[:3] == bytes((255, 0, 0))


def test_same_bytes_same_digest_other_bytes_other() -> None:
    a = decode_image(encoded(photo(seed=1), "PNG"), max_pixels=LIMIT, param="p")
    b = decode_image(encoded(photo(seed=1), "PNG"), max_pixels=LIMIT, param="p")
    c = decode_image(encoded(photo(seed=2), "PNG"), max_pixels=LIMIT, param="p")
    assert a.digest == b.digest != c.digest


def test_not_an_image_names_the_part() -> None:
    with pytest.raises(InvalidRequestError, match="not a PNG, JPEG, WebP or GIF") as caught:
        decode_image(b"%PDF-1.4 hello", max_pixels=LIMIT, param="messages[0].content[1]")
    assert caught.value.param == "messages[0].content[1]"


def test_bmp_is_refused_whatever_its_name() -> None:
    with pytest.raises(InvalidRequestError, match="not a PNG"):
        decode_image(encoded(photo(), "BMP"), max_pixels=LIMIT, param="p")


def test_truncated_png_fails_when_decoded() -> None:
    data = encoded(photo(64, 64), "PNG")
    image = decode_image(data[: len(data) // 2], max_pixels=LIMIT, param="messages[0].content[0]")
    with pytest.raises(InvalidRequestError, match="could not be decoded") as caught:
        image.pixels()
    assert caught.value.param == "messages[0].content[0]"


def test_bomb_refused_from_its_header() -> None:
    with pytest.raises(InvalidRequestError, match="more than the 1000000 pixels"):
        decode_image(png_header(50_000, 50_000), max_pixels=1_000_000, param="p")
    # beyond Pillow's own bomb limit too: still our refusal, not Pillow's exception
    with pytest.raises(InvalidRequestError, match="pixels this server takes"):
        decode_image(png_header(2**16, 2**16), max_pixels=LIMIT, param="p")


def test_data_uri() -> None:
    data = encoded(photo(), "PNG")
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    assert image_from_url(url, max_pixels=LIMIT, param="p").width == 20
    # the declared type is not trusted: the bytes decide
    url = "data:image/jpeg;base64," + base64.b64encode(data).decode()
    assert image_from_url(url, max_pixels=LIMIT, param="p").pixels() == photo().tobytes()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("https://example.com/cat.png", "not fetched"),
        ("data:image/png;base64", "no ','"),
        ("data:text/plain;base64,aGk=", "not an image type"),
        ("data:image/png,rawbytes", "must be base64"),
        ("data:image/png;base64,@@@", "malformed"),
    ],
)
def test_bad_urls(url: str, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message) as caught:
        image_from_url(url, max_pixels=LIMIT, param="messages[0].content[0].image_url.url")
    assert caught.value.param == "messages[0].content[0].image_url.url"


def _decode_all(data: bytes) -> None:
    """Only ever an :class:`InvalidRequestError` (or an image), whatever the bytes."""
    try:
        image = decode_image(data, max_pixels=1 << 20, param="p")
        assert len(image.pixels()) == image.width * image.height * 3
    except InvalidRequestError:
        pass


_SEEDS = [encoded(photo(16, 16), fmt) for fmt in ("PNG", "JPEG", "WEBP", "GIF")]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=512))
def test_fuzz_random_bytes(data: bytes) -> None:
    _decode_all(data)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(_SEEDS), st.integers(0, 4000), st.binary(max_size=8), st.integers(0, 4000))
def test_fuzz_truncated_and_corrupted(seed: bytes, cut: int, junk: bytes, at: int) -> None:
    data = seed[: cut % (len(seed) + 1)]
    at %= len(data) + 1
    _decode_all(data[:at] + junk + data[at + len(junk) :])
