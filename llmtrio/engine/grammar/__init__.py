"""Structured output's grammars, pure (no llama.cpp): JSON Schema, regular expressions,
numbers and string formats turned into GBNF, the automaton they share, and the
:class:`Grammar` value a generation carries.
"""

from ._gbnf import Rules as Rules
from ._gbnf import literal as literal
from ._grammar import JSON_OBJECT_GRAMMAR as JSON_OBJECT_GRAMMAR
from ._grammar import Grammar as Grammar
from ._grammar import json_schema_grammar as json_schema_grammar
from ._schema import SchemaConverter as SchemaConverter
from ._schema_keywords import SchemaError as SchemaError
from ._schema_keywords import json_text as json_text

__all__ = [
    "JSON_OBJECT_GRAMMAR",
    "Grammar",
    "Rules",
    "SchemaConverter",
    "SchemaError",
    "json_schema_grammar",
    "json_text",
    "literal",
]
