"""Chat templating: the GGUF's own Jinja template, or llama.cpp's built-in one for its
architecture when the GGUF carries none."""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NoReturn

import attrs
from jinja2 import TemplateError, nodes
from jinja2.ext import Extension
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .._errors import InvalidRequestError
from .._types import ChatMessage, Tool
from ..tools import describe_tools, template_message
from ._system_messages import fold_system_messages, system_fold
from ._text import THINK_CLOSE, THINK_OPEN

__all__ = ["ChatTemplate", "RenderedPrompt"]

# Architectures whose models ship no template in their GGUF, and llama.cpp's built-in
# template that fits them; anything else gets ChatML.
_BUILTIN_BY_ARCH = {"gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "gemma3n": "gemma"}


@attrs.frozen
class RenderedPrompt:
    text: str
    #: The prompt ends inside an open think block: the first pieces are reasoning.
    opens_think: bool


def _raise_exception(message: str) -> NoReturn:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    indent: int | None = None,
    *,
    ensure_ascii: bool = True,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = True,
) -> str:
    """Jinja's ``tojson`` (keys sorted, ``<>&'`` written as ``\\u003c``...) as a plain
    string, taking the keywords Hugging Face's ``tojson`` takes (GLM's and StepFun's templates
    pass ``ensure_ascii``). Jinja's own returns markup, and a template that adds a string to
    it (``'<tool_call>' + args | tojson``) got that string HTML-escaped (``&lt;tool_call&gt;``).
    """
    text = json.dumps(
        value,
        ensure_ascii=ensure_ascii,
        indent=indent,
        separators=separators,
        sort_keys=sort_keys,
        default=_listed,
    )
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("'", "\\u0027")
    )


def _listed(value: object) -> object:
    """What ``tojson`` writes for a value JSON has no form for: an iterable as a list (Jinja's
    ``map`` and ``select`` filters give generators: llama.cpp's deepseek-r1 template writes
    ``tools | map(attribute='function') | tojson``), anything else is a template error."""
    if isinstance(value, Iterable) and not isinstance(value, str | bytes | Mapping):
        return list(value)
    raise TemplateError(f"tojson cannot write a {type(value).__name__}")


class _GenerationTag(Extension):
    """Hugging Face's ``{% generation %}...{% endgeneration %}`` (it marks the assistant's
    tokens for training): renders its body. Without it, a template using it (poolside's
    Laguna) does not compile and the model cannot be opened."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class ChatTemplate:
    """Renders chat messages into a prompt string.

    ``render_builtin`` is llama.cpp's own renderer, called for models without a Jinja
    template. A template error is an :class:`InvalidRequestError` (e.g. a template that
    refuses a system message).
    """

    def __init__(
        self,
        jinja_source: str | None,
        *,
        architecture: str,
        bos_token: str,
        eos_token: str,
        render_builtin: Any,
    ) -> None:
        self._bos_token = bos_token
        self._eos_token = eos_token
        self._render_builtin = render_builtin
        self.builtin_name = None if jinja_source else _BUILTIN_BY_ARCH.get(architecture, "chatml")
        self._template = None
        if jinja_source:
            env = ImmutableSandboxedEnvironment(
                trim_blocks=True,
                lstrip_blocks=True,
                extensions=["jinja2.ext.loopcontrols", _GenerationTag],
            )
            env.globals["raise_exception"] = _raise_exception
            env.globals["strftime_now"] = _strftime_now
            env.filters["tojson"] = _tojson
            self._template = env.from_string(jinja_source)
        #: The Jinja template renders ``tools`` itself; otherwise they are described in a
        #: system message (see ``_tools.describe_tools``).
        self.renders_tools = bool(jinja_source) and "tools" in (jinja_source or "")
        #: The template writes tool calls in Qwen's XML form (``<function=name>``), so forced
        #: and constrained calls take that form; otherwise Hermes JSON.
        self.xml_tool_calls = self.renders_tools and "<function=" in (jinja_source or "")
        #: How much of a conversation's system messages is folded into user turns before
        #: this template renders it (``_system_messages``): probed once, here.
        self.system_fold = system_fold(
            lambda messages: self._render(
                messages, think=None, tools=(), add_generation_prompt=True
            )
        )

    @property
    def source(self) -> str:
        return "gguf" if self._template is not None else f"built-in {self.builtin_name}"

    def render(
        self,
        messages: Sequence[ChatMessage],
        *,
        think: bool | None,
        tools: Sequence[Tool] = (),
    ) -> RenderedPrompt:
        """The prompt for ``messages`` (and ``tools``), ending with the template's generation
        prompt. A template that takes a system message only first gets later ones folded
        into user turns (``_system_messages``).

        Whether the model starts inside a think block is read from that generation prompt
        alone (what the template adds for the assistant's turn), never from the messages: a
        user writing ``<think>`` is text.
        """
        uses_tools = bool(tools) or any(m.tool_calls or m.role == "tool" for m in messages)
        if uses_tools and not self.renders_tools:
            messages = describe_tools(messages, tools)
        messages = fold_system_messages(messages, self.system_fold)
        history = self._render(messages, think=think, tools=tools, add_generation_prompt=False)
        text = self._render(messages, think=think, tools=tools, add_generation_prompt=True)
        generation_prompt = text[_common_prefix(history, text) :]
        opens = generation_prompt.rfind(THINK_OPEN) > generation_prompt.rfind(THINK_CLOSE)
        return RenderedPrompt(text, opens)

    def _render(
        self,
        messages: Sequence[ChatMessage],
        *,
        think: bool | None,
        tools: Sequence[Tool],
        add_generation_prompt: bool,
    ) -> str:
        if self._template is None:
            pairs = [("system" if m.role == "developer" else m.role, m.content) for m in messages]
            return str(
                self._render_builtin(self.builtin_name, pairs, add_assistant=add_generation_prompt)
            )
        variables: dict[str, Any] = {
            "messages": [template_message(m) for m in messages],
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self._bos_token,
            "eos_token": self._eos_token,
        }
        if think is not None:
            variables["enable_thinking"] = think
        if tools:
            variables["tools"] = [tool.as_openai() for tool in tools]
        try:
            return self._template.render(**variables)
        except TemplateError as exc:
            raise InvalidRequestError(
                f"the model's chat template refused these messages: {exc}", param="messages"
            ) from exc


def _common_prefix(a: str, b: str) -> int:
    """The length of the longest common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    low, high = 0, n  # a[:low] == b[:low], a[:high] != b[:high]
    while high - low > 1:
        mid = (low + high) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid
    return low
