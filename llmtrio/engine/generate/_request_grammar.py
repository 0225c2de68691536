"""The grammar a request generates under (:func:`request_grammar`): its own GBNF, its JSON
schema's, or its tools' (lazy under ``tool_choice="auto"``)."""

from __future__ import annotations

from .._types import GenerateRequest
from ..grammar import Grammar, json_schema_grammar
from ..tools import TOOL_CALL_OPEN, tool_call_grammar
from ._text import THINK_CLOSE

__all__ = ["request_grammar"]


def request_grammar(
    request: GenerateRequest, *, xml_calls: bool, opens_think: bool
) -> Grammar | None:
    """The grammar ``request`` generates under: its own GBNF, its JSON schema's, or its
    tools' (forced from the first token for ``tool_choice="required"``; lazy for ``"auto"``,
    from the call's opening tag on, after the think block the prompt opened). ``xml_calls``:
    the template writes calls in the XML form.

    A keyword the grammar cannot enforce is refused in a strict schema (the JSON schema's
    ``json_schema_strict``, a tool's ``strict``), and relaxed with a warning in any other.

    Error handling: :class:`InvalidRequestError` for a strict schema the grammar cannot
    enforce, or a JSON schema that is not one.
    """
    if request.grammar is not None:
        return Grammar(request.grammar)
    if request.json_schema is not None:
        return Grammar(json_schema_grammar(request.json_schema, strict=request.json_schema_strict))
    if not request.tools or request.tool_choice == "none":
        return None
    parallel = request.parallel_tool_calls
    if request.tool_choice == "required":
        if request.tool_name is not None:  # a named function: one call of it
            named = [t for t in request.tools if t.name == request.tool_name]
            return Grammar(tool_call_grammar(named, xml=xml_calls))
        return Grammar(tool_call_grammar(request.tools, xml=xml_calls, parallel=parallel))
    text = tool_call_grammar(request.tools, xml=xml_calls, parallel=parallel)
    return Grammar(text, trigger=TOOL_CALL_OPEN, after=THINK_CLOSE if opens_think else None)
