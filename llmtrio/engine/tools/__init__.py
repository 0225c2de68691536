"""Tool calls: the grammar a call of the request's tools follows, in each template's format
(Hermes JSON, the XML ``<function=...>`` form; a text tool's input as its text grammar says),
and the incremental parser that turns the generated text into calls and streamed argument
deltas.
"""

from ._grammar import TOOL_CALL_CLOSE as TOOL_CALL_CLOSE
from ._grammar import TOOL_CALL_OPEN as TOOL_CALL_OPEN
from ._grammar import ToolsGrammar as ToolsGrammar
from ._grammar import tool_call_grammar as tool_call_grammar
from ._grammar import tool_calls_grammar as tool_calls_grammar
from ._parser import ToolCallParser as ToolCallParser
from ._parser import describe_tools as describe_tools
from ._parser import template_message as template_message
from ._stream import ToolCallArguments as ToolCallArguments
from ._stream import ToolCallEnd as ToolCallEnd
from ._stream import ToolCallEvent as ToolCallEvent
from ._stream import ToolCallStart as ToolCallStart
from ._stream import ToolCallStream as ToolCallStream
from ._stream import new_tool_call_id as new_tool_call_id

__all__ = [
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "ToolCallArguments",
    "ToolCallEnd",
    "ToolCallEvent",
    "ToolCallParser",
    "ToolCallStart",
    "ToolCallStream",
    "ToolsGrammar",
    "describe_tools",
    "new_tool_call_id",
    "template_message",
    "tool_call_grammar",
    "tool_calls_grammar",
]
