"""Audio parts of a request (chat completions' and the Responses API's ``input_audio``): the
part checked against the field table, its base64 decoded and the file's header read
(``llmtrio.engine.decode_audio``: its length checked against ``--max-audio-seconds`` before
anything is decoded), its refusals 400s naming the part.

An audio file in a message is :data:`MEDIA_MARKER` in its text, where it goes, and the
:class:`Audio` in ``ChatMessage.media`` (in the markers' order), as an image is."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from ..api import INPUT_AUDIO_PART, ApiError, RequestLimits, check, invalid_request
from ..engine import Audio, InvalidRequestError, decode_audio

__all__ = ["audio_from_bytes", "audio_from_part"]


def audio_from_part(part: Any, at: str, limits: RequestLimits) -> Audio:
    """An ``input_audio`` part at ``at`` (``{"type": "input_audio", "input_audio": {"data":
    base64, "format": ...}}``) as an :class:`Audio`, its header read and checked.

    Error handling: :class:`ApiError` (400, ``invalid_value``) naming the part: a part of
    the wrong shape, bad base64, bytes that are no WAV, MP3 or FLAC file, a truncated file,
    audio with no samples or longer than ``limits.max_audio_seconds``."""
    checked = check(INPUT_AUDIO_PART, part, limits, at)
    param = f"{at}.input_audio.data"
    try:
        data = base64.b64decode(checked["input_audio"]["data"], validate=True)
    except (binascii.Error, ValueError):
        raise invalid_request(
            f"Invalid '{param}': the audio's base64 is malformed.",
            param=param,
            code="invalid_value",
        ) from None
    return audio_from_bytes(data, param, limits)


def audio_from_bytes(data: bytes, param: str, limits: RequestLimits) -> Audio:
    """An audio file's bytes (an uploaded file, or a part's decoded base64), its header read
    and checked.

    Error handling: :class:`ApiError` (400, ``invalid_value``) naming ``param``."""
    try:
        return decode_audio(data, max_seconds=limits.max_audio_seconds, param=param)
    except InvalidRequestError as exc:
        raise _refusal(exc) from None


def _refusal(exc: InvalidRequestError) -> ApiError:
    return invalid_request(f"Invalid '{exc.param}': {exc}", param=exc.param, code="invalid_value")
