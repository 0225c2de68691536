"""Structured output's grammars, pure (no llama.cpp): JSON Schema, regular expressions,
Lark grammars, numbers and string formats turned into GBNF, the automaton they share, and
the :class:`Grammar` value a generation carries.
"""

from ._gbnf import Rules as Rules
from ._gbnf import literal as literal
from ._grammar import JSON_OBJECT_GRAMMAR as JSON_OBJECT_GRAMMAR
from ._grammar import Grammar as Grammar
from ._grammar import json_schema_grammar as json_schema_grammar
from ._grammar import warn_relaxed as warn_relaxed
from ._lark import CannotTranslateError as CannotTranslateError
from ._lark import lark_grammar as lark_grammar
from ._lark import lark_rules as lark_rules
from ._lark import regex_rules as regex_rules
from ._schema import SchemaConverter as SchemaConverter
from ._schema import schema_grammar as schema_grammar
from ._schema_keywords import REFUSED as REFUSED
from ._schema_keywords import Relaxation as Relaxation
from ._schema_keywords import SchemaError as SchemaError
from ._schema_keywords import UnenforcedError as UnenforcedError
from ._schema_keywords import json_text as json_text

__all__ = [
    "JSON_OBJECT_GRAMMAR",
    "REFUSED",
    "CannotTranslateError",
    "Grammar",
    "Relaxation",
    "Rules",
    "SchemaConverter",
    "SchemaError",
    "UnenforcedError",
    "json_schema_grammar",
    "json_text",
    "lark_grammar",
    "lark_rules",
    "literal",
    "regex_rules",
    "schema_grammar",
    "warn_relaxed",
]
