"""Property tests (hypothesis): the two parsers that read what strangers send.

- The chat request parser, on any JSON value: it returns a request or raises the OpenAI
  error (400, naming what is wrong), and nothing else.
- The ring's frame decoder, on any bytes in any split: it yields messages or raises
  ``ProtocolError``, and nothing else.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmtrio.api import CHAT_PATH, OPENAI_ERRORS, ApiError
from llmtrio.ring import Assign, FrameDecoder, ProtocolError, RequestHead, encode
from llmtrio.worker._chat_request import ChatCompletionRequest, parse_chat_request

JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
JSON = st.recursive(
    JSON_SCALARS,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)
FIELDS = [
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
    "top_k", "min_p", "seed", "stop", "stream", "stream_options", "n", "think",
    "chat_template_kwargs", "ignore_eos", "logit_bias",
]  # fmt: skip
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "developer", "tool"]) | JSON},
    optional={"content": st.text(max_size=20) | JSON},
)
# Bodies shaped like requests (so the checks past "messages" are reached), and any JSON.
REQUESTS = st.fixed_dictionaries(
    {"messages": st.lists(MESSAGE, min_size=1, max_size=3) | JSON},
    optional={field: JSON for field in FIELDS if field != "messages"},
)


def check(value: Any) -> None:
    try:
        body = json.dumps(value).encode()
    except (ValueError, OverflowError):
        return  # not JSON
    try:
        result = parse_chat_request(body)
    except ApiError as error:
        assert error.status == 400
        assert json.loads(OPENAI_ERRORS.body(error))["error"]["message"]
    else:
        assert isinstance(result, ChatCompletionRequest)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(REQUESTS)
def test_the_chat_parser_returns_a_request_or_an_openai_error(value: dict[str, Any]) -> None:
    check(value)


@settings(max_examples=200, deadline=None)
@given(JSON)
def test_the_chat_parser_on_any_json_value(value: Any) -> None:
    check(value)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_the_chat_parser_on_any_bytes(body: bytes) -> None:
    try:
        parse_chat_request(body)
    except ApiError as error:
        assert error.status == 400


def drive(decoder: FrameDecoder, pieces: list[bytes]) -> None:
    """Feed ``pieces`` then the end of the stream, taking messages as they come."""
    try:
        for piece in [*pieces, b""]:
            decoder.receive_data(piece)
            while decoder.next_message() is not None:
                pass
    except ProtocolError:
        pass


@settings(max_examples=500, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=8))
def test_the_frame_decoder_on_any_bytes(pieces: list[bytes]) -> None:
    drive(FrameDecoder(), pieces)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.integers(min_value=0, max_value=64), st.data())
def test_the_frame_decoder_on_valid_frames_with_noise(
    noise: bytes, cut: int, data: st.DataObject
) -> None:
    """A valid frame, corrupted at one place or followed by noise, and split anywhere."""
    head = RequestHead("POST", CHAT_PATH, (("content-type", "application/json"),))
    frame = bytearray(encode(Assign(7, head, b'{"messages": []}', credits=16)))
    if cut < len(frame) and noise:
        frame[cut] = noise[0]
    stream = bytes(frame) + noise
    splits = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=4)))
    pieces = [stream[a:b] for a, b in zip([0, *splits], [*splits, len(stream)], strict=True)]
    drive(FrameDecoder(), pieces)
