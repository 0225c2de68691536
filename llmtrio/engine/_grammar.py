"""Grammars for structured output: any JSON object, a JSON schema, tool calls; and the
:class:`Grammar` value a generation carries (eager, or lazy: from a trigger on).

Compiling a schema takes a while (a 50-property schema: see PERFORMANCE.md), so the engine
does it off the event loop, and once per schema: the results are cached here by the schema's
text, and llama.cpp's parsed grammar is cached by the engine (``_llama.GrammarCache``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence

import attrs
from llama_cpp import llama_grammar

from ._errors import InvalidRequestError
from ._schema import SchemaError, schema_grammar
from ._schema_keywords import json_text
from ._text import THINK_CLOSE
from ._tool_grammar import TOOL_CALL_OPEN, tool_calls_grammar
from ._types import GenerateRequest, Tool

__all__ = [
    "JSON_OBJECT_GRAMMAR",
    "Grammar",
    "json_schema_grammar",
    "request_grammar",
    "tool_call_grammar",
]

#: Any JSON object (OpenAI's ``response_format: {"type": "json_object"}``).
JSON_OBJECT_GRAMMAR: str = llama_grammar.JSON_GBNF


@attrs.frozen
class Grammar:
    """A grammar as one generation follows it: GBNF ``text`` (root rule ``root``).

    With a ``trigger`` it is lazy: the output is free until the model writes the trigger,
    and from the trigger on (the trigger included) follows the grammar. ``after``: a lazy
    grammar reads nothing the model writes before this text (the end of a think block, so a
    call drafted while reasoning does not trigger it).
    """

    text: str
    trigger: str | None = None
    after: str | None = None


@functools.lru_cache(maxsize=128)
def _schema_grammar(text: str, where: str) -> str:
    return schema_grammar(json.loads(text), where)


def json_schema_grammar(schema: object, *, where: str = "json_schema") -> str:
    """A grammar for the JSON values ``schema`` accepts (cached by the schema's text).

    Error handling: :class:`InvalidRequestError` naming the keyword, format or reference the
    grammar could not enforce.
    """
    try:
        text = json_text(schema)
    except (TypeError, ValueError):
        raise InvalidRequestError(f"{where} must be a JSON schema", param=where) from None
    try:
        return _schema_grammar(text, where)
    except SchemaError as exc:
        raise InvalidRequestError(str(exc), param=where) from None


def tool_call_grammar(
    tools: Sequence[Tool], *, xml: bool = False, parallel: bool = False, loose: bool = False
) -> str:
    """A grammar for a call of one of ``tools``, in the XML form (``<function=...>``) when
    ``xml``, else Hermes JSON; several calls, a newline apart, when ``parallel``. ``loose``:
    a tool whose schema cannot be enforced takes any arguments instead of failing.

    Error handling: :class:`InvalidRequestError` for a schema the grammar cannot enforce.
    """
    try:
        return tool_calls_grammar(tools, xml=xml, parallel=parallel, loose=loose)
    except SchemaError as exc:
        raise InvalidRequestError(str(exc), param="tools") from None


def request_grammar(
    request: GenerateRequest, *, xml_calls: bool, opens_think: bool
) -> Grammar | None:
    """The grammar ``request`` generates under: its own GBNF, its JSON schema's, or its
    tools' (forced from the first token for ``tool_choice="required"``; lazy for ``"auto"``,
    from the call's opening tag on, after the think block the prompt opened). ``xml_calls``:
    the template writes calls in the XML form.

    Error handling: :class:`InvalidRequestError` for a schema the grammar cannot enforce
    (a tool's, under ``"auto"``, only loosens that tool's arguments).
    """
    if request.grammar is not None:
        return Grammar(request.grammar)
    if request.json_schema is not None:
        return Grammar(json_schema_grammar(request.json_schema))
    if not request.tools or request.tool_choice == "none":
        return None
    parallel = request.parallel_tool_calls
    if request.tool_choice == "required":
        if request.tool_name is not None:  # a named function: one call of it
            named = [t for t in request.tools if t.name == request.tool_name]
            return Grammar(tool_call_grammar(named, xml=xml_calls))
        return Grammar(tool_call_grammar(request.tools, xml=xml_calls, parallel=parallel))
    text = tool_call_grammar(request.tools, xml=xml_calls, parallel=parallel, loose=True)
    return Grammar(text, trigger=TOOL_CALL_OPEN, after=THINK_CLOSE if opens_think else None)
