"""Tool calls through real chat templates (tests/data/templates, from llama.cpp's models
folder): a call the template writes into the history reads back, through the engine's
parser, as the same call, for each template whose format the engine claims (Hermes JSON and
the XML ``<function=...>`` form, both in ``<tool_call>`` tags). Formats it does not read come
back as text, unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest

from llmtrio.engine import ChatMessage, Tool, ToolCall, ToolCallParser
from llmtrio.engine.generate._chat import ChatTemplate

from .._qwen35_real import TEMPLATES

#: Templates writing calls as Hermes JSON in <tool_call> tags: {"name": ..., "arguments": ...}.
JSON_FORM = [
    "Bielik-11B-v3.0-Instruct",
    "MiMo-VL",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
    "Qwen-QwQ-32B",
    "Qwen-Qwen2.5-7B-Instruct",
    "Qwen-Qwen3-0.6B",
    "Reka-Edge",
    "ibm-granite-granite-4.0",
    "ibm-granite-granite-4.1",
]
#: Templates writing calls in the XML form: <function=NAME><parameter=K>V</parameter>.
XML_FORM = [
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
    "Qwen3-Coder",
    "Qwen3.5-4B",
    "StepFun3.5-Flash",
]
#: Templates whose calls the engine does not read: GLM's <arg_key>/<arg_value> pairs in
#: <tool_call> (GLM-4.6/4.7, Spark 2.5, Ling 3.0, poolside Laguna write the same),
#: MiniMax's <invoke name=...>, Apriel's <tool_calls>[...] list.
OTHER_FORMS = ["GLM-4.7-Flash", "MiniMax-M3", "unsloth-Apriel-1.5"]
#: Hermes' templates drop an assistant's text beside its calls.
DROPS_CONTENT = {
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
}

WEATHER = Tool(
    "get_weather",
    "The weather forecast for a city",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "options": {"type": "object"},
        },
        "required": ["city"],
    },
)
NOTE = Tool("note", "Write a note", {"type": "object", "properties": {"text": {"type": "string"}}})
TOOLS = (WEATHER, NOTE)
# Values of each JSON type, and a string with markup characters, an accent and a line break
# (HTML-escaped by Jinja's markup when a template adds a string to ``tojson``'s output).
WEATHER_ARGS = {"city": "Paris", "days": 3, "options": {"unit": "c", "hourly": [1, 2]}}
NOTE_ARGS = {"text": "a<b & 'c' é\nline 2"}
QUESTION = "Weather in Paris?"


def template(name: str) -> ChatTemplate:
    return ChatTemplate(
        (TEMPLATES / f"{name}.jinja").read_text(),
        architecture="test",
        bos_token="<s>",
        eos_token="</s>",
        render_builtin=None,
    )


def assistant_turn(name: str, content: str = "Let me look.") -> str:
    """The history's assistant turn (two calls) as the template writes it, and what follows."""
    calls = (
        ToolCall("call_1", "get_weather", json.dumps(WEATHER_ARGS)),
        ToolCall("call_2", "note", json.dumps(NOTE_ARGS)),
    )
    messages = [ChatMessage("user", QUESTION), ChatMessage("assistant", content, tool_calls=calls)]
    text = template(name).render(messages, think=False, tools=TOOLS).text
    return text[text.rindex(QUESTION) + len(QUESTION) :]


def parse(text: str) -> tuple[list[ToolCall], str]:
    parser = ToolCallParser(TOOLS)
    items = parser.feed(text) + parser.flush()
    calls = [i for i in items if isinstance(i, ToolCall)]
    return calls, "".join(i for i in items if isinstance(i, str))


@pytest.mark.parametrize("name", JSON_FORM + XML_FORM)
def test_calls_written_by_the_template_read_back(name: str) -> None:
    text = assistant_turn(name)
    assert ("<function=get_weather>" in text) == (name in XML_FORM)
    assert template(name).xml_tool_calls == (name in XML_FORM)
    assert "&lt;" not in text and "&#34;" not in text
    calls, content = parse(text)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", WEATHER_ARGS),
        ("note", NOTE_ARGS),
    ]
    assert len({c.id for c in calls}) == 2
    assert ("Let me look." in content) == (name not in DROPS_CONTENT)
    assert "<tool_call>" not in content and "</tool_call>" not in content


@pytest.mark.parametrize("step", [1, 3, 7])
@pytest.mark.parametrize("name", ["Qwen3.5-4B", "Qwen-Qwen3-0.6B"])
def test_calls_read_back_fed_in_pieces(name: str, step: int) -> None:
    text = assistant_turn(name)
    parser = ToolCallParser(TOOLS)
    items: list[str | ToolCall] = []
    for at in range(0, len(text), step):
        items += parser.feed(text[at : at + step])
    items += parser.flush()
    calls = [i for i in items if isinstance(i, ToolCall)]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", WEATHER_ARGS),
        ("note", NOTE_ARGS),
    ]


@pytest.mark.parametrize("name", OTHER_FORMS)
def test_a_format_the_engine_does_not_read_stays_text(name: str) -> None:
    text = assistant_turn(name)
    assert "get_weather" in text and "Paris" in text
    calls, content = parse(text)
    assert calls == []
    assert content == text


def test_a_template_with_hugging_faces_generation_tag_renders() -> None:
    """poolside's Laguna marks the assistant's turn with ``{% generation %}``."""
    name = "poolside-Laguna-XS.2"
    assert "{%- generation -%}" in (TEMPLATES / f"{name}.jinja").read_text()
    messages = [
        ChatMessage("user", "Hi"),
        ChatMessage("assistant", "Hello."),
        ChatMessage("user", "Bye"),
    ]
    text = template(name).render(messages, think=None).text
    assert "Hello." in text and text.rindex("Bye") > text.index("Hello.")


def test_tojson_writes_what_jinjas_does() -> None:
    """The engine's ``tojson`` gives Jinja's text (prompts rendered before stay the same),
    as a plain string (adding a string to it escapes nothing), and takes Hugging Face's
    keywords."""
    tool = Tool("f", "<é> it's & more", {"type": "object", "properties": {"b": {}, "a": {}}})
    jinja = jinja2.Environment().from_string("{{ v | tojson }}").render(v=tool.as_openai())
    source = (
        "{{ tools[0] | tojson }}|{{ '<x>' + tools[0] | tojson }}|"
        "{{ tools[0] | tojson(ensure_ascii=False) }}"
    )
    chat = ChatTemplate(
        source, architecture="test", bos_token="", eos_token="", render_builtin=None
    )
    plain, added, unicode = chat.render(
        [ChatMessage("user", "Hi")], think=None, tools=(tool,)
    ).text.split("|")
    assert plain == jinja and "\\u003c\\u00e9\\u003e" in plain
    assert added == "<x>" + jinja
    assert json.loads(unicode) == tool.as_openai() and "é" in unicode


def test_every_template_here_is_covered() -> None:
    names = {p.stem for p in Path(TEMPLATES).glob("*.jinja")}
    covered = set(JSON_FORM + XML_FORM + OTHER_FORMS) | {"poolside-Laguna-XS.2"}
    assert names == covered
