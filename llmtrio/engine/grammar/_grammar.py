"""The :class:`Grammar` a generation carries (eager, or lazy: from a trigger on), any JSON
object's grammar, and a JSON schema's.

Compiling a schema takes a while (a 50-property schema: see PERFORMANCE.md), so the engine
does it off the event loop, and once per schema: the results are cached here by the schema's
text, and llama.cpp's parsed grammar is cached by the engine's llama binding
(``GrammarCache``).
"""

from __future__ import annotations

import functools
import json
import logging

import attrs

from .._errors import InvalidRequestError
from ._schema import schema_grammar
from ._schema_keywords import Relaxation, SchemaError, json_text

__all__ = ["JSON_OBJECT_GRAMMAR", "Grammar", "json_schema_grammar", "warn_relaxed"]

logger = logging.getLogger("llmtrio.engine")

#: Any JSON object (OpenAI's ``response_format: {"type": "json_object"}``): llama.cpp's own
#: ``JSON_GBNF`` (``llama_cpp.llama_grammar``), copied so this package needs no llama.cpp; a
#: test checks the two are the same.
JSON_OBJECT_GRAMMAR: str = r"""
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
"""


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


def warn_relaxed(relaxed: tuple[Relaxation, ...], what: str) -> None:
    """One warning per keyword the grammar of ``what`` (a tool, a response format) does not
    enforce."""
    for relaxation in relaxed:
        logger.warning("%s: %s", what, relaxation)


@functools.lru_cache(maxsize=128)
def _schema_grammar(text: str, where: str, strict: bool) -> str:
    grammar, relaxed = schema_grammar(json.loads(text), where, strict=strict)
    warn_relaxed(relaxed, where)  # once: when compiled, not when found in this cache
    return grammar


def json_schema_grammar(schema: object, *, where: str = "json_schema", strict: bool = True) -> str:
    """A grammar for the JSON values ``schema`` accepts (cached by the schema's text).

    ``strict``: every keyword is enforced exactly, or refused. Otherwise a keyword the
    grammar cannot enforce is relaxed for its sub-schema (which then accepts more than the
    schema does) and a warning names it, when the schema is compiled (once while cached).

    Error handling: :class:`InvalidRequestError` naming the keyword, format or reference the
    grammar could not enforce (``strict``), or saying why ``schema`` is not a JSON schema.
    """
    try:
        text = json_text(schema)
    except (TypeError, ValueError):
        raise InvalidRequestError(f"{where} must be a JSON schema", param=where) from None
    try:
        return _schema_grammar(text, where, strict)
    except SchemaError as exc:
        raise InvalidRequestError(str(exc), param=where) from None
