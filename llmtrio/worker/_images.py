"""Image parts of a request, for every API that takes them (chat completions' ``image_url``,
the Responses API's ``input_image``, Anthropic's ``image`` blocks): one function each for a
URL and for bytes already taken out of a base64 field, their refusals 400s naming the part.

An ``http(s)`` URL of a host the server fetches from (``--allowed-media-domains``) is a
:class:`RemoteImage` after the parse (which is pure: its host checked, nothing fetched);
the endpoint's ``run`` fetches the request's remote images (:func:`fetch_remote_images`,
``_fetch``) before it submits the work, so that the worker, which holds the limits, does the
fetching, and the ingress never reads a body.

An image in a message is :data:`MEDIA_MARKER` in its text, where the image goes, and the
:class:`Image` in ``ChatMessage.images`` (in the markers' order)::

    image = image_from_part(url, "input[0].content[1].image_url", limits)
    ChatMessage("user", MEDIA_MARKER + "\\n" + text, media=[image])
"""

from __future__ import annotations

import ssl

import attrs
import trio

from ..api import ApiError, RequestLimits, invalid_request
from ..engine import (
    Engine,
    GenerateRequest,
    Image,
    InvalidRequestError,
    decode_image,
    image_from_url,
)
from ._fetch import check_url, fetch_bytes, is_remote

__all__ = [
    "RemoteImage",
    "fetch_image",
    "fetch_remote_images",
    "image_from_bytes",
    "image_from_part",
    "remote_image",
]


@attrs.frozen(eq=False)
class RemoteImage(Image):
    """An image part's ``http(s)`` URL, its host allowed, not yet fetched: it stands in a
    message's ``images`` from the parse until :func:`fetch_remote_images` replaces it."""

    url: str = attrs.field(default="", kw_only=True)
    limits: RequestLimits = attrs.field(factory=RequestLimits, kw_only=True, repr=False)

    def pixels(self) -> bytes:
        raise RuntimeError(f"the image at {self.param!r} was never fetched")


def image_from_part(url: str, param: str, limits: RequestLimits) -> Image:
    """An image part's URL (a ``data:`` URI with base64 PNG, JPEG, WebP or GIF), its header
    read and checked against ``limits.max_image_pixels``; decoded later, by the engine. An
    ``http(s)`` URL is a :func:`remote_image`.

    Error handling: :class:`ApiError` (400, ``invalid_value``) naming ``param``."""
    if is_remote(url):
        return remote_image(url, param, limits)
    try:
        return image_from_url(url, max_pixels=limits.max_image_pixels, param=param)
    except InvalidRequestError as exc:
        raise _refusal(exc) from None


def image_from_bytes(data: bytes, param: str, limits: RequestLimits) -> Image:
    """An image's bytes (an Anthropic ``base64`` source, decoded from base64), as
    :func:`image_from_part` checks them.

    Error handling: :class:`ApiError` (400, ``invalid_value``) naming ``param``."""
    try:
        return decode_image(data, max_pixels=limits.max_image_pixels, param=param)
    except InvalidRequestError as exc:
        raise _refusal(exc) from None


def remote_image(url: str, param: str, limits: RequestLimits) -> RemoteImage:
    """An ``http(s)`` image URL, to be fetched before the work is submitted: its host checked
    now against ``limits.allowed_media_domains``.

    Error handling: :class:`ApiError` (400, ``invalid_value``) naming ``param``: remote
    URLs off (no allowed hosts), another scheme, a host not allowed."""
    if not limits.allowed_media_domains:
        raise invalid_request(
            f"Invalid '{param}': image URLs are not fetched by this server (it allows no "
            "hosts: --allowed-media-domains); send the image's bytes inline (base64).",
            param=param,
            code="invalid_value",
        )
    check_url(url, limits.allowed_media_domains, param)
    return RemoteImage(0, 0, "", param, url=url, limits=limits)


async def fetch_image(
    url: str, param: str, limits: RequestLimits, *, ssl_context: ssl.SSLContext | None = None
) -> Image:
    """The image at ``url`` (``_fetch.fetch_bytes``), its type sniffed from its bytes and its
    header checked as :func:`image_from_bytes` does.

    Error handling: :class:`ApiError` (400) naming ``param``."""
    return image_from_bytes(
        await fetch_bytes(url, param, limits, ssl_context=ssl_context), param, limits
    )


async def fetch_remote_images(generate: GenerateRequest, engine: Engine) -> GenerateRequest:
    """``generate`` with its :class:`RemoteImage` parts fetched, all at once (the first
    refusal, in the parts' order, cancels the others). Nothing is fetched when the engine
    will refuse the images anyway (a model without a projector, more than ``--max-images``):
    its own refusal comes at ``submit``, before any image is read.

    Resource handling: cancelling it cancels every fetch (their connections are closed).

    Error handling: :class:`ApiError` (400) naming the first part refused."""
    messages = generate.messages or ()
    remote = [i for m in messages for i in m.images if isinstance(i, RemoteImage)]
    count = sum(len(m.images) for m in messages)
    if not remote or not engine.takes_images or count > engine.config.max_images:
        return generate
    found: dict[int, Image] = {}
    refusals: dict[int, ApiError] = {}
    async with trio.open_nursery() as nursery:

        async def fetch(index: int, image: RemoteImage) -> None:
            try:
                found[id(image)] = await fetch_image(image.url, image.param, image.limits)
            except ApiError as refusal:
                refusals[index] = refusal
                nursery.cancel_scope.cancel()

        for index, image in enumerate(remote):
            nursery.start_soon(fetch, index, image)
    if refusals:
        raise refusals[min(refusals)]
    fetched = [
        attrs.evolve(m, media=[found.get(id(i), i) for i in m.media]) if m.images else m
        for m in messages
    ]
    return attrs.evolve(generate, messages=fetched)


def _refusal(exc: InvalidRequestError) -> ApiError:
    # The message names the part too: Anthropic's error shape has no ``param``.
    return invalid_request(f"Invalid '{exc.param}': {exc}", param=exc.param, code="invalid_value")
