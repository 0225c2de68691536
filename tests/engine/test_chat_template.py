"""Chat templating with a GGUF's Jinja template, as the default model (Qwen3.5) carries one.

The template below follows the structure of Qwen's own (a namespace, reversed iteration,
string methods, ``enable_thinking``, ``raise_exception``), written for this test.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from llmtrio.engine import ChatMessage, GenerateRequest, InvalidRequestError
from llmtrio.engine.generate._chat import ChatTemplate

QWEN_STYLE = """
{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(last_user=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- if message.role == 'user' and ns.last_user == messages|length - 1 %}
        {%- set ns.last_user = (messages|length - 1) - loop.index0 %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role == 'user' %}
        {{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}
        {{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}
    {%- elif message.role != 'system' %}
        {{- raise_exception('unexpected role ' + message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- else %}
        {{- '<think>\\n' }}
    {%- endif %}
{%- endif %}
"""


def template(source: str | None = QWEN_STYLE) -> ChatTemplate:
    return ChatTemplate(
        source,
        architecture="qwen35",
        bos_token="",
        eos_token="<|im_end|>",
        render_builtin=lambda name, pairs, add_assistant: f"{name}:{pairs}",
    )


def test_thinking_on_opens_a_think_block_in_the_prompt() -> None:
    messages = [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")]
    rendered = template().render(messages, think=None)
    assert rendered.text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    assert rendered.text.endswith("<|im_start|>assistant\n<think>\n")
    assert rendered.opens_think


def test_thinking_off_closes_the_block_so_the_answer_is_not_reasoning() -> None:
    rendered = template().render([ChatMessage("user", "Hi")], think=False)
    assert rendered.text.endswith("<think>\n\n</think>\n\n")
    assert not rendered.opens_think


def test_multi_turn_drops_earlier_reasoning() -> None:
    messages = [
        ChatMessage("user", "2+2?"),
        ChatMessage("assistant", "<think>\nadd</think>\n\n4"),
        ChatMessage("developer", "x"),
        ChatMessage("user", "and 3+3?"),
    ]
    text = template().render(messages, think=True).text
    assert "<|im_start|>assistant\n4<|im_end|>" in text
    assert "add" not in text


def test_a_template_error_is_a_request_error() -> None:
    refusing = "{{ raise_exception('unexpected role ' + messages[0].role) }}"
    with pytest.raises(InvalidRequestError, match="refused these messages: unexpected role user"):
        template(refusing).render([ChatMessage("user", "{}")], think=None)


def builtin_name(name: str, pairs: object, add_assistant: bool) -> str:
    return name


def test_no_template_uses_llama_cpp_builtin_for_the_architecture() -> None:
    gemma = ChatTemplate(
        None,
        architecture="gemma3",
        bos_token="",
        eos_token="",
        render_builtin=lambda n, p, add_assistant: n,
    )
    assert gemma.source == "built-in gemma"
    assert gemma.render([ChatMessage("user", "Hi")], think=None).text == "gemma"
    other = ChatTemplate(
        None,
        architecture="qwen35",
        bos_token="",
        eos_token="",
        render_builtin=lambda n, p, add_assistant: n,
    )
    assert other.source == "built-in chatml"


@pytest.mark.parametrize("think", [None, False, True])
def test_think_tags_in_the_messages_are_text(think: bool | None) -> None:
    """Only the generation prompt decides whether the answer starts inside a think block."""
    messages = [
        ChatMessage("user", "What does <think> do?"),
        ChatMessage("assistant", "It opens reasoning: <think>"),
        ChatMessage("user", "And then? <think>"),
    ]
    rendered = template().render(messages, think=think)
    assert rendered.opens_think is (think is not False)
    unclosed = template().render([ChatMessage("user", "</think> then <think>")], think=False)
    assert not unclosed.opens_think


def _user() -> list[ChatMessage]:
    return [ChatMessage("user", "hi")]


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (
            lambda: GenerateRequest(messages=[{"role": "user", "content": "hi"}]),
            r"messages\[0\] is a dict",
        ),
        (
            lambda: GenerateRequest(messages=[*_user(), ("assistant", "yes")]),
            r"messages\[1\] is a tuple",
        ),
        (lambda: GenerateRequest(messages="hello"), "messages is a str"),
        (
            lambda: GenerateRequest(messages=_user(), tools=[{"type": "function"}]),
            r"tools\[0\] is a dict",
        ),
        (
            lambda: ChatMessage("assistant", "", tool_calls=[{"id": "c"}]),
            r"tool_calls\[0\] is a dict",
        ),
    ],
)
def test_a_library_request_with_dicts_for_messages_is_refused_by_name(
    make: Callable[[], object], words: str
) -> None:
    with pytest.raises(InvalidRequestError, match=words):
        make()
