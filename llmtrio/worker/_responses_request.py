"""A Responses API request body in (``POST /v1/responses``), an engine request out. Pure.

The fields are read and checked as the field table (``llmtrio.api._fields``, endpoint
``responses``) says; what is left here is what the table cannot say: which kind of item an
``input`` item is, the tools a request offers among those it sends (only ``function`` tools
run here: the others are left out of what the model is offered, with a warning, as clients
such as Codex send ``web_search`` and ``namespace`` tools with every request), the flat
``tool_choice`` and ``text.format``, and rules across fields. The request is templated as the
same conversation in chat completions would be, so prompt reuse works across both APIs.

Stateless: nothing is stored, so what refers to a stored response (``previous_response_id``,
``conversation``, an ``item_reference`` item) is a 400 naming it. Every refusal is an
:class:`ApiError` (400) naming the field.
"""

from __future__ import annotations

import json
import logging
from typing import Any, TypeGuard

import attrs

from ..api import (
    AUDIO_PARTS,
    IMAGE_PARTS,
    RESPONSES_FORMAT,
    RESPONSES_IMAGE_PART,
    ApiError,
    Body,
    RequestLimits,
    check,
    checked_text,
    invalid_request,
    invalid_type,
    invalid_value,
    missing,
    read,
    show,
)
from ..engine import (
    JSON_OBJECT_GRAMMAR,
    MEDIA_MARKER,
    TEXT_INPUT,
    ChatMessage,
    GenerateRequest,
    InvalidRequestError,
    Media,
    Sampling,
    ToolCall,
)
from ._audio import audio_from_part
from ._encoding import from_engine_error
from ._features import ToolChoice
from ._images import image_from_part
from ._reasoning import Reasoning, for_effort
from ._requests import json_body, reject_refused
from ._responses_tools import OfferedTool, flat_name, parse_responses_tools

__all__ = ["LOGPROBS_INCLUDE", "ResponsesRequest", "naming_input", "parse_responses_request"]

#: The ``type`` of the Responses API's image and audio parts.
_IMAGE = IMAGE_PARTS[Body.RESPONSES]
_AUDIO = AUDIO_PARTS[Body.RESPONSES]

logger = logging.getLogger("llmtrio.worker")

_NO_LIMITS = RequestLimits()
#: What ``include`` names to have each ``output_text`` part carry its log-probabilities.
LOGPROBS_INCLUDE = "message.output_text.logprobs"
# Text parts are joined as chat's are (llama.cpp's server joins them so before templating).
_PART_SEPARATOR = "\n"
_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text")
#: Fields that change nothing here, accepted (checked for their type) and ignored.
_ACCEPTED = (
    "store",
    "user",
    "stream_options",
    "prompt_cache_key",
    "prompt_cache_retention",
    "prompt_cache_options",
    "safety_identifier",
    "service_tier",
    "truncation",
)


@attrs.frozen
class ResponsesRequest:
    """A parsed ``POST /v1/responses`` (or ``/v1/responses/input_tokens``) body.

    ``tools`` says which tools the reply may call and how (by the names the model sees);
    ``offered`` names each of them back as the client named it; ``max_tool_calls`` bounds
    the calls the output keeps (``None``: no bound); ``logprobs``: the ``output_text`` parts
    carry log-probabilities; ``echo``: the request's settings as the response object repeats
    them (``tools``, ``tool_choice``, ``text``, ``reasoning``, ``metadata``, ...).
    """

    model: str | None
    generate: GenerateRequest
    stream: bool = False
    tools: ToolChoice = attrs.field(factory=ToolChoice)
    offered: dict[str, OfferedTool] = attrs.field(factory=dict)
    max_tool_calls: int | None = None
    logprobs: bool = False
    echo: dict[str, Any] = attrs.field(factory=dict)

    @property
    def call_limit(self) -> int | None:
        """The most function calls the output keeps (``None``: any number)."""
        if not self.tools.parallel:
            return 1 if self.max_tool_calls is None else min(1, self.max_tool_calls)
        return self.max_tool_calls


def parse_responses_request(body: bytes, limits: RequestLimits = _NO_LIMITS) -> ResponsesRequest:
    """Parse and validate a Responses API request body.

    Honoured: ``input`` (a string, or items: messages of role ``user``, ``system``,
    ``developer`` or ``assistant`` with a string or ``input_text``/``output_text`` parts,
    a user message's ``input_image`` parts with a ``data:`` URI for a model with a vision
    projector (``detail`` accepted; a ``file_id`` is a 400 naming it) and its
    ``input_audio`` parts (base64 WAV, MP3 or FLAC) for a model with an audio projector,
    ``function_call`` and ``function_call_output`` items; ``reasoning`` items are ignored, as
    templates drop earlier turns' reasoning), ``instructions`` (a system message first),
    ``tools`` (``function`` ones), ``tool_choice``, ``parallel_tool_calls``,
    ``max_tool_calls``, ``text.format`` (through chat's grammar path), ``max_output_tokens``
    (the server's default when absent), ``temperature``, ``top_p``, ``top_logprobs`` with
    ``include: ["message.output_text.logprobs"]``, ``stream``, ``metadata`` (echoed) and
    ``reasoning.effort`` (``none``/``minimal``: thinking off; otherwise on with the budget of
    ``worker._reasoning``). A forced tool call or a JSON format turns thinking off: the grammar
    holds from the first token. Refused with a 400 naming them: ``previous_response_id``,
    ``conversation``, ``background: true``, ``background_options``, ``prompt``, ``image``,
    file parts. The other fields of the table are accepted and ignored.

    Error handling: raises :class:`ApiError`, 400 naming the offending field in ``param``.
    """
    data = json_body(body)
    reject_refused(data, Body.RESPONSES, limits)
    model = read(data, Body.RESPONSES, "model", limits)
    instructions = read(data, Body.RESPONSES, "instructions", limits)
    messages = [ChatMessage("system", instructions)] if instructions else []
    messages += _parse_input(data, limits)
    if not messages:
        raise invalid_value(
            "input", "empty array. Expected at least one input item.", "empty_array"
        )
    max_output: int | None = read(data, Body.RESPONSES, "max_output_tokens", limits)
    sampling = {
        name: value
        for name in ("temperature", "top_p")
        if (value := read(data, Body.RESPONSES, name, limits)) is not None
    }
    parsed_tools = parse_responses_tools(data, limits)
    tools = parsed_tools.choice
    max_tool_calls = read(data, Body.RESPONSES, "max_tool_calls", limits)
    if max_tool_calls == 0:
        tools = attrs.evolve(tools, mode="none", forced=())
    output_format, format_echo = _parse_format(data, limits)
    if tools.forced:
        output_format = {}  # a forced call wins over the format of a plain reply
    effort, reasoning = _parse_reasoning(data, limits)
    if output_format or tools.forced:
        reasoning = Reasoning(think=False)
    include = read(data, Body.RESPONSES, "include", limits) or []
    top_logprobs = read(data, Body.RESPONSES, "top_logprobs", limits)
    logprobs = LOGPROBS_INCLUDE in include
    stream = read(data, Body.RESPONSES, "stream", limits) or False
    metadata = read(data, Body.RESPONSES, "metadata", limits)
    for name in _ACCEPTED:
        read(data, Body.RESPONSES, name, limits)  # accepted, checked for their type
    try:
        generate = GenerateRequest(
            messages=messages,
            # A request that names no limit gets the server's default, as parse_max_tokens
            # gives chat's.
            max_tokens=max_output if max_output is not None else limits.default_max_tokens,
            sampling=Sampling(**sampling),
            think=reasoning.think,
            reasoning_budget=reasoning.budget if reasoning.think else None,
            logprobs=(top_logprobs or 0) if logprobs else None,
            **output_format,
            **tools.generate_options(),
        )
    except InvalidRequestError as exc:
        raise naming_input(from_engine_error(exc)) from None
    echo = {
        "instructions": instructions,
        "max_output_tokens": max_output,
        "max_tool_calls": max_tool_calls,
        "metadata": metadata or {},
        "parallel_tool_calls": tools.parallel,
        "reasoning": {"effort": effort, "summary": None},
        "temperature": generate.sampling.temperature,
        "text": {"format": format_echo},
        "tool_choice": parsed_tools.choice_echo,
        "tools": parsed_tools.echo,
        "top_logprobs": top_logprobs or 0,
        "top_p": generate.sampling.top_p,
        "user": data.get("user"),
    }
    return ResponsesRequest(
        model=model,
        generate=generate,
        stream=stream,
        tools=tools,
        offered=parsed_tools.offered,
        max_tool_calls=max_tool_calls,
        logprobs=logprobs,
        echo=echo,
    )


def naming_input(error: ApiError) -> ApiError:
    """``error`` naming ``input`` where the engine names chat's ``messages`` (a prompt too
    long for the context, a bad message)."""
    if error.param == "messages":
        error.param = "input"
        error.message = error.message.replace("messages", "input")
    return error


# -- input -------------------------------------------------------------------------------------


def _parse_input(data: dict[str, Any], limits: RequestLimits) -> list[ChatMessage]:
    """``input``: a string (one user message) or items, as chat messages: an assistant
    message's text and the function calls after it are one assistant message, each
    ``function_call_output`` a tool message."""
    value = data.get("input")  # its shape is parsed here (a string or items)
    if value is None:
        raise missing("input")
    if isinstance(value, str):
        return [ChatMessage("user", checked_text(value, "input"))]
    if not isinstance(value, list):
        raise invalid_type("input", "a string or an array of input items", value)
    if len(value) > limits.max_messages:
        raise invalid_value(
            "input",
            f"array too long. Expected an array with maximum length {limits.max_messages}, "
            f"but got an array with length {len(value)} instead.",
            "array_above_max_length",
        )
    messages: list[ChatMessage] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid_type(where, "an object", item)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            _add_message(messages, item, where, limits)
        elif kind == "function_call":
            _add_call(messages, item, where)
        elif kind == "custom_tool_call":
            _add_call(messages, item, where, custom=True)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            call_id = _string(item, "call_id", where)
            output = _text(item.get("output"), f"{where}.output")
            messages.append(ChatMessage("tool", output, tool_call_id=call_id))
        elif kind == "reasoning":
            continue  # earlier turns' reasoning: the templates drop it
        elif kind == "item_reference":
            raise invalid_value(
                f"{where}.type", "'item_reference' refers to stored items; nothing is stored here."
            )
        elif kind is None:
            raise missing(f"{where}.type")
        else:
            raise invalid_value(
                f"{where}.type",
                f"{show(kind)}: this server takes 'message', 'function_call', "
                "'function_call_output', 'custom_tool_call', 'custom_tool_call_output' and "
                "'reasoning' items.",
            )
    return messages


def _add_message(
    messages: list[ChatMessage], item: dict[str, Any], where: str, limits: RequestLimits
) -> None:
    role = item.get("role")
    if role is None:
        raise missing(f"{where}.role")
    if role not in _ROLES:
        raise invalid_value(
            f"{where}.role",
            f"{show(role)}. Supported values are: 'user', 'system', 'developer' and 'assistant'.",
        )
    value = item.get("content")
    if role == "user" and _has_media(value):
        content, media = _media_content(value, f"{where}.content", limits)
        messages.append(ChatMessage("user", content, media=media))
        return
    content = _text(value, f"{where}.content")
    if role == "assistant" and messages and _open_assistant(messages[-1]):
        last = messages[-1]
        messages[-1] = attrs.evolve(last, content=_join(last.content, content))
        return
    messages.append(ChatMessage("system" if role == "developer" else role, content))


def _add_call(
    messages: list[ChatMessage], item: dict[str, Any], where: str, *, custom: bool = False
) -> None:
    """A ``function_call`` (or ``custom_tool_call``) item: a call of the assistant message it
    follows, else of a new one, named as the model sees the tool (``namespace.name``). A
    custom tool's ``input`` is shown to the template as its one parameter
    (:data:`TEXT_INPUT`), as the model was shown the tool."""
    name = _string(item, "name", where)
    namespace = item.get("namespace")
    if namespace is not None:
        namespace = _string(item, "namespace", where)
    field = "input" if custom else "arguments"
    arguments = item.get(field)
    if arguments is None:
        raise missing(f"{where}.{field}")
    if not isinstance(arguments, str):
        expected = "a string" if custom else "a string (JSON text)"
        raise invalid_type(f"{where}.{field}", expected, arguments)
    if custom:
        arguments = json.dumps({TEXT_INPUT: checked_text(arguments, f"{where}.input")})
    call = ToolCall(_string(item, "call_id", where), flat_name(name, namespace), arguments)
    if messages and messages[-1].role == "assistant":
        last = messages[-1]
        messages[-1] = attrs.evolve(last, tool_calls=(*last.tool_calls, call))
    else:
        messages.append(ChatMessage("assistant", "", tool_calls=[call]))


def _has_media(value: object) -> TypeGuard[list[Any]]:
    return isinstance(value, list) and any(
        isinstance(part, dict) and part.get("type") in (_IMAGE, _AUDIO) for part in value
    )


def _media_content(value: list[Any], where: str, limits: RequestLimits) -> tuple[str, list[Media]]:
    """A user message's parts with ``input_image`` parts (``RESPONSES_IMAGE_PART``) and
    ``input_audio`` parts (``INPUT_AUDIO_PART``): each a media marker in the text (parts
    joined by newlines) and an :class:`Image` or :class:`Audio`, its header read and
    checked (``worker._images``, ``worker._audio``).

    Error handling: :class:`ApiError` (400) naming the part: a ``file_id``, no
    ``image_url``, a URL neither a ``data:`` URI nor an ``http(s)`` URL of an allowed host,
    bytes that are not an image or an audio file, audio too long."""
    texts: list[str] = []
    media: list[Media] = []
    for i, part in enumerate(value):
        at = f"{where}[{i}]"
        if isinstance(part, dict) and part.get("type") == _AUDIO:
            media.append(audio_from_part(part, at, limits))
            texts.append(MEDIA_MARKER)
            continue
        if not (isinstance(part, dict) and part.get("type") == _IMAGE):
            texts.append(_text_part(part, at))
            continue
        checked = check(RESPONSES_IMAGE_PART, part, limits, at)
        if checked.get("file_id") is not None:
            raise invalid_request(
                f"Unsupported parameter: '{at}.file_id': file ids refer to stored files, and "
                "nothing is stored here; send the image as a data: URI in 'image_url'.",
                param=f"{at}.file_id",
                code="unsupported_parameter",
            )
        url = checked.get("image_url")
        if url is None:
            raise missing(f"{at}.image_url")
        media.append(image_from_part(url, f"{at}.image_url", limits))
        texts.append(MEDIA_MARKER)
    return _PART_SEPARATOR.join(texts), media


def _open_assistant(message: ChatMessage) -> bool:
    """An assistant message more text may join (text comes before a message's calls)."""
    return message.role == "assistant" and not message.tool_calls


def _join(first: str, second: str) -> str:
    return f"{first}{_PART_SEPARATOR}{second}" if first and second else first or second


def _string(item: dict[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if value is None:
        raise missing(f"{where}.{name}")
    if not isinstance(value, str):
        raise invalid_type(f"{where}.{name}", "a string", value)
    return checked_text(value, f"{where}.{name}")


def _text(value: object, where: str) -> str:
    """A message's content or a call's output: a string, or text parts joined."""
    if isinstance(value, str):
        return checked_text(value, where)
    if value is None:
        raise missing(where)
    if not isinstance(value, list):
        raise invalid_type(where, "a string or an array of text parts", value)
    return _PART_SEPARATOR.join(_text_part(part, f"{where}[{j}]") for j, part in enumerate(value))


def _text_part(part: object, at: str) -> str:
    """One text part (``input_text``, ``output_text`` or ``refusal``): its text."""
    if not isinstance(part, dict):
        raise invalid_type(at, "an object", part)
    kind = part.get("type")
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return checked_text(part["refusal"], f"{at}.refusal")
    if kind not in _TEXT_PARTS:
        raise invalid_request(
            f"Invalid value for '{at}.type': {show(kind)}. This server accepts text parts "
            "('input_text', 'output_text'), and image parts ('input_image') in user messages.",
            param=f"{at}.type",
            code="invalid_value",
        )
    text = part.get("text")
    if not isinstance(text, str):
        raise invalid_type(f"{at}.text", "a string", text)
    return checked_text(text, f"{at}.text")


# -- tools, format, reasoning ------------------------------------------------------------------


def _parse_format(data: dict[str, Any], limits: RequestLimits) -> tuple[dict[str, Any], Any]:
    """``text.format``: :class:`GenerateRequest` keyword arguments (``grammar`` or
    ``json_schema``: the same grammar path as chat's ``response_format``), and the format as
    the response echoes it."""
    text = read(data, Body.RESPONSES, "text", limits)
    value = None if text is None else check(RESPONSES_FORMAT, text.get("format"), limits,
                                            "text.format")  # fmt: skip
    if value is None or value["type"] == "text":
        return {}, {"type": "text"}
    if value["type"] == "json_object":
        return {"grammar": JSON_OBJECT_GRAMMAR}, {"type": "json_object"}
    for name in ("name", "schema"):
        if value.get(name) is None:
            raise missing(f"text.format.{name}")
    echo = {
        "type": "json_schema",
        "name": value["name"],
        "schema": value["schema"],
        "strict": value.get("strict"),
        "description": value.get("description"),
    }
    return {"json_schema": value["schema"], "json_schema_strict": value.get("strict") is True}, echo


def _parse_reasoning(data: dict[str, Any], limits: RequestLimits) -> tuple[str | None, Reasoning]:
    """``reasoning.effort``: the effort named (``None``: none) and what it asks for."""
    reasoning = read(data, Body.RESPONSES, "reasoning", limits)
    effort = None if reasoning is None else reasoning.get("effort")
    if effort is None:
        return None, Reasoning()
    return effort, for_effort(effort)
