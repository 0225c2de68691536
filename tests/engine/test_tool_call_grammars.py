"""Tool calls under grammars: the template's own call format (Qwen's XML or Hermes JSON), the
forced grammar in either form checked against llama.cpp's grammar engine, and the lazy grammar
of ``tool_choice: "auto"`` (started where the model opens a call) on the gemma test model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmtrio.engine import (
    ChatMessage,
    Engine,
    EngineConfig,
    GenerateRequest,
    Grammar,
    StopReason,
    Tool,
    ToolCall,
    ToolCallParser,
    tool_call_grammar,
)
from llmtrio.engine.llama import Batch, LlamaModel, SlotSampler

from .._grammar_probe import GrammarProbe
from .._helpers import collect
from ..worker.test_tool_fields import QWEN35_TOOLS, template

# The tool-call part of a Hermes / Qwen 2.5 template (calls as JSON in <tool_call> tags).
HERMES_TOOLS = """
{%- if tools %}
    {{- '<|im_start|>system\\n# Tools\\n<tools>' }}
    {%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
    {{- '\\n</tools><|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {{- '<|im_start|>' + message.role + '\\n' + message.content }}
    {%- for tool_call in message.tool_calls or [] %}
        {{- '\\n<tool_call>\\n{"name": "' + tool_call.function.name + '", "arguments": ' }}
        {{- tool_call.function.arguments | tojson }}
        {{- '}\\n</tool_call>' }}
    {%- endfor %}
    {{- '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""

# Properties in sorted order: Jinja's tojson sorts keys.
WEATHER = Tool(
    "get_weather",
    "The weather forecast for a city",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 12},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "days"],
        "additionalProperties": False,
    },
)
NOTE = Tool(
    "note",
    "Write a note",
    {
        "type": "object",
        "properties": {
            "text": {"type": "string", "maxLength": 20},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
        },
        "required": ["text"],
        "additionalProperties": False,
    },
)
TOOLS = (WEATHER, NOTE)


def test_the_template_decides_the_call_format() -> None:
    assert template(QWEN35_TOOLS).xml_tool_calls
    assert not template(HERMES_TOOLS).xml_tool_calls
    assert not template(None).xml_tool_calls


@pytest.fixture(scope="module")
def probe(gemma_path: Path) -> Iterator[GrammarProbe]:
    probe = GrammarProbe(gemma_path)
    yield probe
    probe.close()


def rendered_call(source: str, arguments: dict[str, Any]) -> str:
    """The call as the template writes it in the history."""
    call = ToolCall("call_1", "get_weather", json.dumps(arguments))
    messages = [ChatMessage("user", "Weather?"), ChatMessage("assistant", "", tool_calls=(call,))]
    text = template(source).render(messages, think=False, tools=TOOLS).text
    start = text.index("<tool_call>", text.index("<|im_start|>assistant"))
    return text[start : text.index("</tool_call>", start) + len("</tool_call>")]


@pytest.mark.parametrize(("source", "xml"), [(QWEN35_TOOLS, True), (HERMES_TOOLS, False)])
def test_the_forced_grammar_takes_what_the_template_writes(
    probe: GrammarProbe, source: str, xml: bool
) -> None:
    grammar = tool_call_grammar([WEATHER], xml=xml)
    good = rendered_call(source, {"city": "Paris", "days": 3, "unit": "celsius"})
    assert probe.accepts(grammar, good), good
    assert ("<function=get_weather>" in good) == xml
    for bad in ({"city": "Paris", "days": 8}, {"city": "", "days": 3}, {"days": 3}):
        assert not probe.accepts(grammar, rendered_call(source, bad)), bad


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(xml=st.booleans(), parallel=st.booleans(), data=st.data())
def test_forced_calls_parse_and_follow_the_schema(
    probe: GrammarProbe, xml: bool, parallel: bool, data: st.DataObject
) -> None:
    grammar = tool_call_grammar(TOOLS, xml=xml, parallel=parallel)

    def choose(n: int, can_end: bool) -> int:
        return -1 if can_end and data.draw(st.booleans()) else data.draw(st.integers(0, n - 1))

    text = probe.walk(grammar, choose, limit=2000)
    if text is None:
        return
    parser = ToolCallParser(TOOLS)
    items = parser.feed(text) + parser.flush()
    calls = [item for item in items if isinstance(item, ToolCall)]
    assert "".join(item for item in items if isinstance(item, str)).strip() == ""
    assert len(calls) >= 1 and (parallel or len(calls) == 1)
    for call in calls:
        schema = next(t.parameters for t in TOOLS if t.name == call.name)
        jsonschema.validate(json.loads(call.arguments), schema)
    assert ("<function=" in text) == xml


# -- the lazy grammar, in the slot sampler ---------------------------------------------------


@pytest.fixture(scope="module")
def gemma(gemma_path: Path) -> Iterator[LlamaModel]:
    model = LlamaModel(gemma_path, slots=1, ctx_size=64, threads=2, n_batch=64)
    yield model
    model.close()


def test_the_lazy_grammar_starts_where_the_output_opens_a_call(gemma: LlamaModel) -> None:
    """Logits are forced token by token: free text, the call's opening split over tokens,
    then a token (``></``) that completes the opening but carries text the grammar refuses:
    it is not picked; from there the grammar holds, against logits that prefer garbage."""
    batch = Batch(64)
    prompt = gemma.tokenize("Hello", add_special=True)
    index = batch.add(prompt, 0, 0, output_last=True)
    assert gemma.decode(batch) == 0
    base = gemma.logits(index).copy()
    grammar = Grammar(tool_call_grammar(TOOLS), trigger="<tool_call>")
    sampler = SlotSampler(
        gemma, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, bias={}, grammar=grammar
    )
    forced = [*gemma.tokenize("Sure <tool_call", add_special=False), 2588]  # 2588: "></"
    preferred = forced + [gemma.tokenize("hello", add_special=False)[0]] * 2000
    out = b""
    try:
        for step, wanted in enumerate(preferred):
            logits = gemma.logits(index)
            logits[:] = base
            logits[wanted] = 1e4  # what the model "wants"
            logits[gemma.tokenize(">", add_special=False)[0]] += 1e3  # second best
            token = sampler.sample(index)
            if token < 0 or token in gemma.eog:  # the grammar is complete
                break
            if step < len(forced) - 1:
                assert token == wanted  # free text before the call
            out += gemma.special_piece(token)
    finally:
        sampler.close()
    text = out.decode()
    assert text.startswith("Sure <tool_call>\n"), text
    parser = ToolCallParser(TOOLS)
    items = parser.feed(text) + parser.flush()
    calls = [i for i in items if isinstance(i, ToolCall)]
    assert len(calls) == 1, text
    schema = next(t.parameters for t in TOOLS if t.name == calls[0].name)
    jsonschema.validate(json.loads(calls[0].arguments), schema)


# -- end to end on the engine ----------------------------------------------------------------

FEW_SHOT = "".join(
    f"Q: weather in {city} for {days} days\nA: <tool_call>\n"
    f'{{"name": "get_weather", "arguments": {{"city": "{city}", "days": {days}, "note": "x"}}}}'
    "\n</tool_call>\n"
    for city, days in (("Rome", 30), ("Oslo", 12), ("Lima", 45))
)


async def test_auto_calls_follow_the_schema_free_text_does_not(gemma_path: Path) -> None:
    """A base model continuing examples that break the schema (days over 7, an extra
    property) copies them when calls are not constrained; under ``tool_choice: "auto"`` the
    same call follows the schema, and the grammar ends the reply with the call (one call:
    with ``parallel_tool_calls`` it could only go on with another)."""
    prompt = FEW_SHOT + "Q: weather in Paris for 20 days\nA:"
    config = EngineConfig(model=gemma_path, max_inflight=2, ctx_size=512, threads=2)
    async with Engine.open(config) as engine:
        tokens = engine.tokenize(prompt, add_special=True)
        free = GenerateRequest(tokens=tokens, max_tokens=48, tools=TOOLS, tool_choice="none")
        auto = GenerateRequest(tokens=tokens, max_tokens=48, tools=TOOLS, parallel_tool_calls=False)
        free_text, _ = await collect(engine, free)
        auto_text, done = await collect(engine, auto)
    assert "<tool_call>" in free_text and '"note"' in free_text  # it copies the examples
    parser = ToolCallParser(TOOLS)
    items = parser.feed(auto_text) + parser.flush()
    [call] = [i for i in items if isinstance(i, ToolCall)]
    jsonschema.validate(json.loads(call.arguments), WEATHER.parameters)
    assert done.stop is StopReason.END_OF_GENERATION
    assert auto_text.rstrip().endswith("</tool_call>")


@pytest.mark.parametrize(("source", "xml"), [(QWEN35_TOOLS, True), (HERMES_TOOLS, False)])
async def test_a_forced_call_takes_the_template_format(
    gemma_path: Path, source: str, xml: bool
) -> None:
    config = EngineConfig(
        model=gemma_path, max_inflight=1, ctx_size=512, threads=2, chat_template=source
    )
    request = GenerateRequest.user(
        "What is the weather in Paris?",
        tools=TOOLS,
        tool_choice="required",
        tool_name="get_weather",
        max_tokens=120,
    )
    async with Engine.open(config) as engine:
        text, done = await collect(engine, request)
    assert done.stop is StopReason.END_OF_GENERATION, text
    assert ("<function=get_weather>" in text) == xml, text
    parser = ToolCallParser(TOOLS)
    [call] = [i for i in parser.feed(text) + parser.flush() if isinstance(i, ToolCall)]
    assert call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER.parameters)
