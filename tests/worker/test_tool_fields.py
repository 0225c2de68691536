"""Tool calling without a model: templates with tools, the Hermes fallback, the output parser,
and the request fields (``tools``, ``tool_choice``, history with calls and results)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from llmtrio.api import ApiError
from llmtrio.engine import (
    ChatMessage,
    InvalidRequestError,
    Tool,
    ToolCall,
    ToolCallParser,
    tool_call_grammar,
)
from llmtrio.engine.generate._chat import ChatTemplate
from llmtrio.worker._chat_request import parse_chat_request
from llmtrio.worker._chat_response import split_tool_calls

# The tools part of Qwen3.5's template (tools listed in the system turn, calls in the
# Qwen3-Coder XML format, results in <tool_response> user turns), condensed for this test.
QWEN35_TOOLS = """
{%- if tools %}
    {{- '<|im_start|>system\\n# Tools\\n\\n' }}
    {{- 'You have access to the following functions:\\n\\n<tools>' }}
    {%- for tool in tools %}
        {{- '\\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\\n</tools>\\n\\nIf you choose to call a function ONLY reply in the following format:'
        '\\n\\n<tool_call>\\n<function=example_function_name>\\n<parameter=example_parameter_1>'
        '\\nvalue_1\\n</parameter>\\n</function>\\n</tool_call>' }}
    {%- if messages[0].role == 'system' %}
        {{- '\\n\\n' + messages[0].content }}
    {%- endif %}
    {{- '<|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' %}
        {{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\\n' + message.content }}
        {%- for tool_call in message.tool_calls or [] %}
            {{- '\\n<tool_call>\\n<function=' + tool_call.function.name + '>\\n' }}
            {%- for name, value in tool_call.function.arguments.items() %}
                {{- '<parameter=' + name + '>\\n' + (value | string) + '\\n</parameter>\\n' }}
            {%- endfor %}
            {{- '</function>\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<|im_start|>user\\n<tool_response>\\n' + message.content }}
        {{- '\\n</tool_response><|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' }}
{%- endif %}
"""

WEATHER = Tool(
    "get_weather",
    "The weather in a city",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 30},
            "unit": {"enum": ["c", "f"]},
            "days": {"type": "integer"},
        },
        "required": ["city", "unit"],
    },
)
TIME = Tool("get_time", "The time", {"type": "object", "properties": {}})


def template(source: str | None) -> ChatTemplate:
    return ChatTemplate(
        source,
        architecture="qwen35",
        bos_token="",
        eos_token="<|im_end|>",
        render_builtin=lambda name, pairs, add_assistant=True: json.dumps(pairs),
    )


def test_qwen35_template_renders_tools_calls_and_results() -> None:
    history = [
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "Weather in Paris?"),
        ChatMessage(
            "assistant",
            "",
            tool_calls=[ToolCall("call_1", "get_weather", '{"city": "Paris", "unit": "c"}')],
        ),
        ChatMessage("tool", "18 degrees", tool_call_id="call_1"),
    ]
    text = template(QWEN35_TOOLS).render(history, think=False, tools=[WEATHER, TIME]).text
    assert text.startswith("<|im_start|>system\n# Tools")
    listed = text.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0].splitlines()
    assert [json.loads(line) for line in listed] == [WEATHER.as_openai(), TIME.as_openai()]
    assert "\n\nBe brief.<|im_end|>" in text
    # The call's arguments reach the template as an object, as Qwen's template expects.
    assert "<function=get_weather>\n<parameter=city>\nParis\n</parameter>" in text
    assert "<|im_start|>user\n<tool_response>\n18 degrees\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_a_template_without_tools_gets_them_described_hermes_style() -> None:
    history = [
        ChatMessage("user", "Weather?"),
        ChatMessage("assistant", "", tool_calls=[ToolCall("c1", "get_weather", '{"city":"Oslo"}')]),
        ChatMessage("tool", "cold", tool_call_id="c1"),
    ]
    pairs = json.loads(template(None).render(history, think=None, tools=[WEATHER]).text)
    roles = [role for role, _ in pairs]
    assert roles == ["system", "user", "assistant", "user"]
    system = pairs[0][1]
    assert "<tools>\n" + json.dumps(WEATHER.as_openai()) + "\n</tools>" in system
    assert '<tool_call>\n{"name": <function-name>' in system
    assert json.loads(pairs[2][1].removeprefix("<tool_call>").removesuffix("</tool_call>")) == {
        "name": "get_weather",
        "arguments": {"city": "Oslo"},
    }
    assert pairs[3][1] == "<tool_response>\ncold\n</tool_response>"


def feed_all(parser: ToolCallParser, text: str, step: int) -> list[str | ToolCall]:
    items: list[str | ToolCall] = []
    for i in range(0, len(text), step):
        items += parser.feed(text[i : i + step])
    return items + parser.flush()


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_parser_finds_json_and_xml_calls_split_anywhere(step: int) -> None:
    text = (
        "Let me look.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>\n'
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
    )
    items = feed_all(ToolCallParser((WEATHER,)), text, step)
    content = "".join(i for i in items if isinstance(i, str))
    calls = [i for i in items if isinstance(i, ToolCall)]
    assert content.strip() == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris", "unit": "c"}),
        ("get_weather", {"city": "New York", "days": 3}),
    ]
    assert len({c.id for c in calls}) == 2


def test_parser_leaves_text_that_is_not_a_call_alone() -> None:
    text = 'a <tool_call>not json</tool_call> and <tool_call>{"name": "nope"}</tool_call> <tool'
    items = feed_all(ToolCallParser((WEATHER,)), text, 2)
    assert "".join(i for i in items if isinstance(i, str)) == text


def body(**fields: Any) -> bytes:
    fields.setdefault("messages", [{"role": "user", "content": "Weather in Paris?"}])
    return json.dumps(fields).encode()


TOOLS_JSON = [WEATHER.as_openai(), TIME.as_openai()]


def test_named_tool_choice_forces_a_call_and_turns_thinking_off() -> None:
    request = parse_chat_request(
        body(tools=TOOLS_JSON, tool_choice={"type": "function", "function": {"name": "get_time"}})
    )
    assert request.tools.mode == "required"
    assert [t.name for t in request.tools.forced] == ["get_time"]
    generate = request.generate
    assert (generate.tool_choice, generate.tool_name, generate.grammar) == (
        "required",
        "get_time",
        None,
    )
    assert generate.think is False
    assert generate.tools == (WEATHER, TIME)
    # A forced call wins over the format of a plain reply.
    both = parse_chat_request(
        body(tools=TOOLS_JSON, tool_choice="required", response_format={"type": "json_object"})
    )
    assert (both.generate.tool_choice, both.generate.grammar) == ("required", None)


def test_auto_none_and_history() -> None:
    auto = parse_chat_request(body(tools=TOOLS_JSON, parallel_tool_calls=False))
    assert auto.tools.mode == "auto" and auto.tools.parses and auto.generate.grammar is None
    assert (auto.generate.tool_choice, auto.generate.parallel_tool_calls) == ("auto", False)
    assert auto.generate.think is None  # a lazy grammar leaves thinking alone
    none = parse_chat_request(body(tools=TOOLS_JSON, tool_choice="none"))
    assert not none.tools.parses and none.generate.tools == ()
    history = parse_chat_request(
        body(
            tools=TOOLS_JSON,
            messages=[
                {"role": "user", "content": "Weather?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_9",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_9", "content": "sunny"},
            ],
        )
    )
    messages = history.generate.messages
    assert messages is not None
    assert messages[1].tool_calls == (ToolCall("call_9", "get_weather", '{"city":"Rome"}'),)
    assert messages[2] == ChatMessage("tool", "sunny", tool_call_id="call_9")


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
        ({"tools": TOOLS_JSON, "tool_choice": "sometimes"}, "tool_choice", "'sometimes'"),
        (
            {"tools": TOOLS_JSON, "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
            "no tool named 'x'",
        ),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type", "'function' tools only"),
        ({"tools": [TIME.as_openai(), TIME.as_openai()]}, "tools", "used twice"),
        (
            {"tools": TOOLS_JSON, "tool_choice": "required", "think": True},
            "think",
            "grammar holds from the first token",
        ),
    ],
)
def test_bad_tool_fields_are_400(fields: dict[str, Any], param: str, words: str) -> None:
    with pytest.raises(ApiError) as info:
        parse_chat_request(body(**fields))
    assert info.value.status == 400
    assert info.value.param == param
    assert words in info.value.message


def test_a_tool_schema_a_grammar_cannot_enforce_is_refused_only_when_strict() -> None:
    schema = {"type": "object", "not": {"required": ["a"]}}
    with pytest.raises(InvalidRequestError, match="'not' is not supported") as info:
        tool_call_grammar([Tool("f", "", schema, strict=True)])
    assert info.value.param == "tools"
    # Not strict: 'not' is relaxed (the arguments are any object), forced or not.
    assert "root ::=" in tool_call_grammar([Tool("f", "", schema)])


def test_split_tool_calls_respects_parallel_tool_calls() -> None:
    call = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    request = parse_chat_request(body(tools=TOOLS_JSON, parallel_tool_calls=False))
    content, calls = split_tool_calls(request, call + "\n" + call)
    assert len(calls) == 1 and content.strip() == ""
    schema = TIME.parameters
    jsonschema.validate(json.loads(calls[0].arguments), schema)


@pytest.mark.parametrize("parameters", [None, {}])
def test_a_function_without_parameters_takes_an_empty_object(parameters: Any) -> None:
    """OpenAI: omitting ``parameters`` defines a function with an empty parameter list, and
    clients write ``"parameters": {}`` for the same. Taken as the empty JSON Schema (any value)
    instead, a forced call's grammar let the model write an array, or run on until
    ``max_tokens`` (seen in test_serve_breadth's forced ``required`` call)."""
    function: dict[str, Any] = {"name": "get_time"}
    if parameters is not None:
        function["parameters"] = parameters
    request = parse_chat_request(
        body(tools=[{"type": "function", "function": function}], tool_choice="required")
    )
    [tool] = request.generate.tools
    assert tool.parameters == {"type": "object", "properties": {}}


# -- one tool-choice rule for the three APIs ---------------------------------------------------


def _chosen(api: str, **fields: Any) -> Any:
    """The tool choice each API's parser makes of ``fields`` (chat, Messages, Responses)."""
    from llmtrio.worker._messages_request import parse_messages_request
    from llmtrio.worker._responses_request import parse_responses_request

    if api == "chat":
        return parse_chat_request(body(**fields)).tools
    if api == "messages":
        data = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        return parse_messages_request(json.dumps({**data, **fields}).encode()).tools
    return parse_responses_request(json.dumps({"input": "hi", **fields}).encode()).tools


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
def test_auto_without_tools_is_no_tools_in_every_api(api: str) -> None:
    """``tool_choice: auto`` with no tools offered answers as ``none`` in all three APIs
    (chat refused it with a 400 while Messages and Responses served it)."""
    choice = {"type": "auto"} if api == "messages" else "auto"
    for fields in ({"tool_choice": choice}, {"tool_choice": choice, "tools": []}):
        chosen = _chosen(api, **fields)
        assert (chosen.mode, chosen.tools, chosen.parses) == ("none", (), False)


@pytest.mark.parametrize(
    ("api", "choice", "param", "words"),
    [
        ("chat", "required", "tool_choice", "'required' needs 'tools'"),
        ("messages", {"type": "any"}, "tool_choice", "'any' needs 'tools'"),
        ("responses", "required", "tool_choice", "'required' needs 'tools'"),
        ("chat", {"type": "function", "function": {"name": "x"}}, "tool_choice", "no tool named"),
        ("messages", {"type": "tool", "name": "x"}, "tool_choice.name", "no tool named"),
        ("responses", {"type": "function", "name": "x"}, "tool_choice", "no tool named"),
    ],
)
def test_a_required_or_named_tool_without_that_tool_is_400_in_every_api(
    api: str, choice: Any, param: str, words: str
) -> None:
    with pytest.raises(ApiError) as info:
        _chosen(api, tool_choice=choice)
    assert (info.value.status, info.value.param) == (400, param)
    assert words in info.value.message
