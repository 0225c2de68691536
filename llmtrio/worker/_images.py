"""Image parts of a request, for every API that takes them (chat completions' ``image_url``,
the Responses API's ``input_image``, Anthropic's ``image`` blocks): one function each for a
URL and for bytes already taken out of a base64 field, their refusals 400s naming the part.

An image in a message is :data:`MEDIA_MARKER` in its text, where the image goes, and the
:class:`Image` in ``ChatMessage.images`` (in the markers' order)::

    image = image_from_part(url, "input[0].content[1].image_url", limits)
    ChatMessage("user", MEDIA_MARKER + "\\n" + text, images=[image])
"""

from __future__ import annotations

from .._field_spec import RequestLimits
from .._openai_errors import OpenAIError, invalid_request
from ..engine import Image, InvalidRequestError, decode_image, image_from_url

__all__ = ["image_from_bytes", "image_from_part"]


def image_from_part(url: str, param: str, limits: RequestLimits) -> Image:
    """An image part's URL (a ``data:`` URI with base64 PNG, JPEG, WebP or GIF), its header
    read and checked against ``limits.max_image_pixels``; decoded later, by the engine.

    Error handling: :class:`OpenAIError` (400, ``invalid_value``) naming ``param``."""
    try:
        return image_from_url(url, max_pixels=limits.max_image_pixels, param=param)
    except InvalidRequestError as exc:
        raise _refusal(exc) from None


def image_from_bytes(data: bytes, param: str, limits: RequestLimits) -> Image:
    """An image's bytes (an Anthropic ``base64`` source, decoded from base64), as
    :func:`image_from_part` checks them.

    Error handling: :class:`OpenAIError` (400, ``invalid_value``) naming ``param``."""
    try:
        return decode_image(data, max_pixels=limits.max_image_pixels, param=param)
    except InvalidRequestError as exc:
        raise _refusal(exc) from None


def _refusal(exc: InvalidRequestError) -> OpenAIError:
    # The message names the part too: Anthropic's error shape has no ``param``.
    return invalid_request(f"Invalid '{exc.param}': {exc}", param=exc.param, code="invalid_value")
