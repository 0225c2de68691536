"""Real tool schemas compile (issue 42): the cases of llama.cpp's own schema-to-grammar test,
and every tool the captured clients send (Claude Code, Codex, nine MCP servers), compile to
grammars llama.cpp parses, in both call forms; a keyword the grammar cannot enforce is
relaxed (a strict schema is refused by name); each tool forced once on gemma gives a call that
validates against its schema; Codex's Lark ``apply_patch`` grammar is translated and agrees
with Lark itself.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import jsonschema
import lark
import pytest
import trio

from llmtrio.engine import (
    Done,
    Engine,
    GenerateRequest,
    InvalidRequestError,
    StopReason,
    TextFormat,
    Token,
    Tool,
    ToolCall,
    ToolCallArguments,
    ToolCallParser,
    ToolCallStream,
    json_schema_grammar,
    lark_grammar,
)
from llmtrio.engine.grammar import REFUSED, Relaxation, schema_grammar
from llmtrio.engine.tools import tool_call_grammar, tool_calls_grammar

from .._grammar_probe import GrammarProbe
from .._helpers import engine_config
from .._schema_corpus import CLIENTS, CorpusTool, client_tools, llama_cases
from .._schemas import validator

CASES = llama_cases()
TOOLS = client_tools()
APPLY_PATCH = (CLIENTS / "codex-0.171.0-apply_patch.lark").read_text()


def lark_parser(definition: str) -> lark.Lark:
    """Lark itself, the oracle of what a Lark grammar accepts. Lark refuses zero-width
    terminals, which the grammars of ``custom`` tools use (llguidance, which OpenAI runs,
    takes them): ``/(.*)/`` is read as the same language, ``[/(.+)/]``."""
    return lark.Lark(definition.replace("/(.*)/", "[/(.+)/]"), parser="earley")


@pytest.fixture(scope="module")
def probe(gemma_path: Path) -> Iterator[GrammarProbe]:
    found = GrammarProbe(gemma_path)
    yield found
    found.close()


def parses(probe: GrammarProbe, grammar: str) -> bool:
    """Whether llama.cpp's grammar parser takes ``grammar`` (as the engine loads it)."""
    try:
        with probe.grammar(grammar):
            return True
    except AssertionError:
        return False


def _validator(schema: Any) -> Any:
    """A validator for ``schema`` (draft 7's for a tuple ``items``, 2020-12's otherwise)."""
    if '"items": [' in json.dumps(schema):
        return jsonschema.Draft7Validator(
            schema, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER
        )
    return validator(schema)


# -- llama.cpp's cases ---------------------------------------------------------------------


def test_the_corpus_holds_what_it_should() -> None:
    assert len(CASES) == 82  # 80 test() cases, 2 documents its main() parses
    assert sum(c["llama_cpp"] == "failure" for c in CASES) == 3
    sources = {t.source for t in TOOLS}
    assert len([s for s in sources if s.endswith(".tools.json")]) >= 5  # MCP servers
    named = {t.tool.name for t in TOOLS}
    assert {"TaskCreate", "TaskUpdate", "WebFetch", "fetch", "apply_patch"} <= named


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_every_llama_cpp_case_compiles_to_a_grammar_llama_cpp_parses(
    probe: GrammarProbe, case: dict[str, Any]
) -> None:
    """Not strict, every schema compiles (llama.cpp's own refusals too), exact or relaxed;
    strict, a schema compiles exactly to the same grammar or is refused by name."""
    grammar, relaxed = schema_grammar(case["schema"], "json_schema", strict=False)
    assert parses(probe, grammar)
    if relaxed:
        with pytest.raises(InvalidRequestError) as refused:
            json_schema_grammar(case["schema"], strict=True)
        assert relaxed[0].keyword in str(refused.value)
    else:
        assert json_schema_grammar(case["schema"], strict=True) == grammar
    if case["llama_cpp"] == "failure":
        assert relaxed  # what llama.cpp refuses is not a schema the grammar enforces


def test_what_the_exact_llama_cpp_cases_generate_validates(probe: GrammarProbe) -> None:
    """A random walk through each exactly compiled case's grammar (llama.cpp choosing the
    bytes it allows) ends in a value its schema accepts."""
    chance = random.Random(42)
    walked = 0
    for case in CASES:
        grammar, relaxed = schema_grammar(case["schema"], "json_schema", strict=False)
        if relaxed:
            continue

        def choose(n: int, can_end: bool) -> int:
            if can_end and chance.random() < 0.3:
                return -1
            return chance.randrange(n)

        text = probe.walk(grammar, choose, limit=400)
        if text is None:
            continue  # too long a value for a walk: its prefix was allowed at every byte
        walked += 1
        _validator(case["schema"]).validate(json.loads(text))
    assert walked >= 60


# -- the clients' tools ---------------------------------------------------------------------

#: The keywords the issue found refused for these tools, now relaxed.
EXPECTED_RELAXED = {
    ("TaskCreate", "propertyNames"),
    ("TaskUpdate", "propertyNames"),
    ("WebFetch", "format"),
    ("fetch", "format"),
}


def _relaxed(tool: Tool, *, xml: bool) -> tuple[Relaxation, ...]:
    return tool_calls_grammar([tool], xml=xml).relaxed


@pytest.mark.parametrize("xml", [False, True], ids=["json", "xml"])
def test_every_client_tool_compiles_in_both_call_forms(probe: GrammarProbe, xml: bool) -> None:
    relaxed: set[tuple[str, str]] = set()
    for one in TOOLS:
        grammar = tool_calls_grammar([one.tool], xml=xml)
        assert parses(probe, grammar.text), one.id
        for relaxation in grammar.relaxed:
            assert relaxation.where.startswith(f"tools.{one.tool.name}.")
            relaxed.add((one.tool.name, relaxation.keyword))
    assert relaxed >= EXPECTED_RELAXED
    # Each relaxed keyword is one the grammar does not enforce, a format it does not know,
    # or string keywords too large for a grammar: nothing else.
    for _, keyword in relaxed:
        assert keyword in REFUSED or keyword in ("format", "pattern", "maxLength")
    # All the tools together, as a client sends them, in one grammar.
    together = tool_calls_grammar([t.tool for t in TOOLS], xml=xml, parallel=True)
    assert parses(probe, together.text)


def test_a_strict_tool_is_refused_naming_the_keyword() -> None:
    for one in TOOLS:
        found = _relaxed(one.tool, xml=False)
        if not found:
            continue
        with pytest.raises(InvalidRequestError) as refused:
            tool_call_grammar([attrs.evolve(one.tool, strict=True)])
        assert refused.value.param == "tools"
        assert found[0].keyword in str(refused.value)


def test_a_relaxation_is_logged_once_naming_tool_path_and_keyword(
    caplog: pytest.LogCaptureFixture,
) -> None:
    schema = {
        "type": "object",
        "properties": {"url": {"type": "string", "format": "uri-reference"}},
        "required": ["url"],
    }
    tool = Tool("fetch_once", "", schema)
    with caplog.at_level("WARNING", logger="llmtrio.engine"):
        for _ in range(3):  # compiled once, then found in the cache
            tool_calls_grammar([tool])
    lines = [r.getMessage() for r in caplog.records if "fetch_once" in r.getMessage()]
    assert len(lines) == 1
    assert "'format'" in lines[0] and "tools.fetch_once.parameters.properties.url" in lines[0]


# -- forced on gemma ------------------------------------------------------------------------


def _unenforced_errors(schema: Any, value: Any, relaxed: tuple[Relaxation, ...]) -> list[str]:
    """``value``'s validation errors, but for those of a keyword the grammar relaxed."""
    keywords = {r.keyword for r in relaxed}
    return [
        f"{list(e.absolute_path)}: {e.message}"
        for e in _validator(schema).iter_errors(value)
        if e.validator not in keywords
    ]


def closing_bias(probe: GrammarProbe) -> tuple[tuple[int, float], ...]:
    """A bias toward the tokens that close a JSON string, array or object (``"``, ``]``,
    ``}`` and runs of them): gemma, greedy, goes on with a string or a list for as long as
    it may; biased so, each call ends within a few dozen tokens (the grammar still decides
    where a closer may stand)."""
    closers = set(b'"]}')
    pieces = probe.pieces()
    return tuple(
        (token, 12.0) for token, piece in enumerate(pieces) if piece and set(piece) <= closers
    )


def without_descriptions(schema: Any) -> Any:
    """``schema`` without its ``description`` annotations (strings; a property named
    ``description`` stays): the grammar ignores them, and the prompt is half as long."""
    if isinstance(schema, dict):
        return {
            k: without_descriptions(v)
            for k, v in schema.items()
            if not (k == "description" and isinstance(v, str))
        }
    if isinstance(schema, list):
        return [without_descriptions(v) for v in schema]
    return schema


async def _force(
    engine: Engine, tool: Tool, bias: tuple[tuple[int, float], ...], max_tokens: int
) -> tuple[str, Done]:
    shown = attrs.evolve(tool, parameters=without_descriptions(tool.parameters))
    request = GenerateRequest.user(
        "Use the tool.",
        tools=(shown,),
        tool_choice="required",
        tool_name=tool.name,
        max_tokens=max_tokens,
        logit_bias=bias,
    )
    pieces: list[str] = []
    async with engine.submit(request) as generation:
        async for event in generation:
            if isinstance(event, Token):
                pieces.append(event.text)
            elif isinstance(event, Done):
                return "".join(pieces), event
    raise AssertionError(f"{tool.name}: generation failed: {generation.result}")


@pytest.mark.slow
async def test_each_client_tool_forced_on_gemma_gives_a_call_that_validates(
    gemma_path: Path, probe: GrammarProbe
) -> None:
    """Each tool forced once (all through one engine, eight at a time): every call that
    finishes is one call of that tool whose arguments validate against its schema (but for
    the keywords relaxed), and a text tool's input is text its Lark grammar accepts."""
    results: dict[str, tuple[CorpusTool, str, Done]] = {}
    bias = closing_bias(probe)
    config = engine_config(gemma_path, max_inflight=8, ctx_size=1024, threads=1)
    async with Engine.open(config) as engine:
        limit = trio.CapacityLimiter(8)

        async def one(item: CorpusTool) -> None:
            async with limit:
                text, done = await _force(engine, item.tool, bias, max_tokens=96)
            results[item.id] = (item, text, done)

        async with trio.open_nursery() as nursery:
            for item in TOOLS:
                nursery.start_soon(one, item)
    finished = 0
    for item, text, done in results.values():
        if done.stop is not StopReason.END_OF_GENERATION:
            continue  # cut at max_tokens: a string the model went on with
        finished += 1
        parser = ToolCallParser((item.tool,))
        events = parser.feed(text) + parser.flush()
        calls = [e for e in events if isinstance(e, ToolCall)]
        assert len(calls) == 1 and calls[0].name == item.tool.name, (item.id, text)
        if item.tool.text is not None:
            assert item.tool.text.syntax == "lark"
            lark_parser(item.tool.text.definition).parse(calls[0].arguments)
            continue
        arguments = json.loads(calls[0].arguments)
        relaxed = _relaxed(item.tool, xml=False)
        assert not _unenforced_errors(item.tool.parameters, arguments, relaxed), (item.id, text)
    assert finished >= len(TOOLS) * 9 // 10, f"only {finished} of {len(TOOLS)} calls finished"


# -- Codex's apply_patch grammar -------------------------------------------------------------

PATCHES = [
    "*** Begin Patch\n*** Add File: hello.txt\n+Hello\n+world\n*** End Patch\n",
    "*** Begin Patch\n*** Update File: a.py\n@@ def f():\n-    return 1\n+    return 2\n"
    "*** End Patch",
    "*** Begin Patch\n*** Delete File: old.txt\n*** Update File: b.py\n*** Move to: c.py\n"
    "@@\n context\n-gone\n+new </parameter> kept\n*** End of File\n*** End Patch\n",
    "*** Begin Patch\n*** Add File: empty line\n+\n*** End Patch\n",
]
NOT_PATCHES = [
    "*** Begin Patch\n*** End Patch\n",  # no hunk
    "*** Begin Patch\n*** Add File: x\n*** End Patch\n",  # an added file has lines
    "*** Begin Patch\n*** Update File: a\n@@\nno prefix\n*** End Patch\n",
    "Begin Patch\n",
]


def test_the_apply_patch_grammar_agrees_with_lark(probe: GrammarProbe) -> None:
    grammar = lark_grammar(APPLY_PATCH)
    parser = lark_parser(APPLY_PATCH)
    for text in PATCHES:
        parser.parse(text)
        assert probe.accepts(grammar, text), text
    for text in NOT_PATCHES:
        with pytest.raises(lark.exceptions.LarkError):
            parser.parse(text)
        assert not probe.accepts(grammar, text), text


@pytest.mark.parametrize("xml", [False, True], ids=["json", "xml"])
def test_a_text_tool_call_follows_its_grammar_in_both_forms(probe: GrammarProbe, xml: bool) -> None:
    tool = Tool("apply_patch", "", text=TextFormat("lark", APPLY_PATCH))
    grammar = tool_calls_grammar([tool], xml=xml)
    assert not grammar.relaxed
    for patch in PATCHES:
        if xml:
            if "</parameter>" in patch:
                continue  # the XML form cannot carry it: see below
            body = f"<function=apply_patch>\n<parameter=input>\n{patch}\n</parameter>\n</function>"
        else:
            arguments = json.dumps({"input": patch}, ensure_ascii=False)
            body = f'{{"name": "apply_patch", "arguments": {arguments}}}'
        text = f"<tool_call>\n{body}\n</tool_call>"
        assert probe.accepts(grammar.text, text), text
        parser = ToolCallParser((tool,))
        calls = [e for e in parser.feed(text) + parser.flush() if isinstance(e, ToolCall)]
        assert [c.arguments for c in calls] == [patch]  # the text itself, not JSON
    # A regular-expression terminal never holds </parameter> in the XML form (it would end
    # the parameter); the JSON form escapes nothing of it and takes it.
    line = "<tool_call>\n<function=apply_patch>\n<parameter=input>\n" + PATCHES[2]
    assert not probe.accepts(grammar.text, line + "\n</parameter>\n</function>\n</tool_call>")


def test_a_grammar_that_cannot_be_translated_leaves_the_text_free(
    probe: GrammarProbe, caplog: pytest.LogCaptureFixture
) -> None:
    template = 'start: _sep{"a", ","}\n_sep{x, sep}: x (sep x)*\n'
    tool = Tool("odd_grammar", "", text=TextFormat("lark", template))
    with caplog.at_level("WARNING", logger="llmtrio.engine"):
        grammar = tool_calls_grammar([tool])
    assert [r.keyword for r in grammar.relaxed] == ["lark"]
    assert "cannot translate" in grammar.relaxed[0].why and "template" in grammar.relaxed[0].why
    assert any("odd_grammar" in r.getMessage() for r in caplog.records)
    free = '<tool_call>\n{"name": "odd_grammar", "arguments": {"input": "any \\"text\\"\\n"}}'
    assert probe.accepts(grammar.text, free + "\n</tool_call>")
    with pytest.raises(InvalidRequestError, match="cannot translate"):
        tool_calls_grammar([attrs.evolve(tool, strict=True)])


def test_a_regex_text_tool(probe: GrammarProbe) -> None:
    tool = Tool("pick", "", text=TextFormat("regex", "(yes|no)-[0-9]{2}"))
    forms = {
        True: ("<tool_call>\n<function=pick>\n<parameter=input>\n", "\n</parameter>\n</function>"),
        False: ('<tool_call>\n{"name": "pick", "arguments": {"input": "', '"}}'),
    }
    for xml, (head, tail) in forms.items():
        grammar = tool_calls_grammar([tool], xml=xml).text
        assert probe.accepts(grammar, f"{head}yes-42{tail}\n</tool_call>")
        assert not probe.accepts(grammar, f"{head}maybe-42{tail}\n</tool_call>")


@pytest.mark.parametrize("xml", [False, True], ids=["json", "xml"])
def test_a_text_tool_call_streams_as_text(xml: bool) -> None:
    """Fed a character at a time, a text tool's call gives the text itself: in pieces as it
    comes in the XML form, whole in the JSON form; a function call beside it is JSON."""
    patch = PATCHES[0]
    tool = Tool("apply_patch", "", text=TextFormat("lark", APPLY_PATCH))
    plain = Tool("now", "", {"type": "object", "properties": {"tz": {"type": "string"}}})
    if xml:
        body = f"<function=apply_patch>\n<parameter=input>\n{patch}\n</parameter>\n</function>"
        other = "<function=now>\n<parameter=tz>\nUTC\n</parameter>\n</function>"
    else:
        body = json.dumps({"name": "apply_patch", "arguments": {"input": patch}})
        other = json.dumps({"name": "now", "arguments": {"tz": "UTC"}})
    text = f"Sure.<tool_call>\n{body}\n</tool_call>\n<tool_call>\n{other}\n</tool_call>"
    stream = ToolCallStream((tool, plain))
    events = [e for char in text for e in stream.feed(char)] + stream.finish()
    pieces = [e.text for e in events if isinstance(e, ToolCallArguments) and e.index == 0]
    assert "".join(pieces) == patch
    assert len(pieces) > 1 if xml else len(pieces) == 1
    rest = "".join(e.text for e in events if isinstance(e, ToolCallArguments) and e.index == 1)
    assert json.loads(rest) == {"tz": "UTC"}
    assert "".join(e for e in events if isinstance(e, str)) == "Sure.\n"


def test_a_text_tool_is_shown_to_templates_with_its_one_parameter() -> None:
    tool = Tool("apply_patch", "Edit files.", text=TextFormat("lark", APPLY_PATCH))
    shown = tool.as_openai()["function"]
    assert shown["parameters"]["properties"] == {"input": {"type": "string"}}
    assert shown["parameters"]["required"] == ["input"]
    with pytest.raises(InvalidRequestError, match="syntax"):
        TextFormat("gbnf", "root ::= x")
