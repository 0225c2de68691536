"""System messages anywhere in a conversation (issue 42): the fold rule for templates that take
a system message only first, Claude Code's captured body through the Messages API's parser
and every chat template of llama-cpp-python's source distribution, and the billing header's
``cch=`` stamp. Pure: no model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llmtrio.engine import ChatMessage, InvalidRequestError
from llmtrio.engine.generate._chat import ChatTemplate
from llmtrio.engine.generate._system_messages import (
    PROBE,
    fold_system_messages,
    reminder,
    system_fold,
)
from llmtrio.worker._messages_request import normalize_billing_header, parse_messages_request

from .._clients import InstallError, llama_templates
from .._qwen35_real import QWEN35_TEMPLATE, TEMPLATES

CLIENTS = Path(__file__).resolve().parents[1] / "data" / "clients"
CLAUDE_CODE_BODY: dict[str, Any] = json.loads(
    (CLIENTS / "claude-code-2.1.197.messages.json").read_text()
)["requests"][0]["body"]
#: The template sweep's templates: those of tests/data/templates (always), and every one of
#: the sdist's when PyPI can be reached (``sdist_templates``).
LOCAL = sorted(TEMPLATES.glob("*.jinja"))


def template(source: str) -> ChatTemplate:
    return ChatTemplate(
        source, architecture="test", bos_token="<s>", eos_token="</s>", render_builtin=None
    )


def system(text: str) -> ChatMessage:
    return ChatMessage("system", text)


def user(text: str) -> ChatMessage:
    return ChatMessage("user", text)


def assistant(text: str) -> ChatMessage:
    return ChatMessage("assistant", text)


# -- the rule ----------------------------------------------------------------------------------


def test_none_leaves_the_conversation_as_it_is() -> None:
    assert fold_system_messages(PROBE, "none") == list(PROBE)


def test_later_joins_the_first_and_folds_the_others_into_their_user_turns() -> None:
    folded = fold_system_messages(
        [system("a"), ChatMessage("developer", "b"), user("u1"), system("c"), assistant("x"),
         system("d"), user("u2"), system("e"), system("f")],
        "later",
    )  # fmt: skip
    assert folded == [
        system("a\n\nb"),
        user(f"u1\n\n{reminder('c')}"),  # the user turn before it
        assistant("x"),
        user(f"{reminder('d')}\n\nu2\n\n{reminder('e')}\n\n{reminder('f')}"),  # after it
    ]
    assert reminder("c") == "<system-reminder>\nc\n</system-reminder>"


def test_a_system_message_no_user_turn_is_next_to_becomes_one() -> None:
    call = ChatMessage("tool", "42", tool_call_id="c1")
    folded = fold_system_messages([user("u"), assistant("x"), call, system("s")], "later")
    assert folded == [user("u"), assistant("x"), call, user(reminder("s"))]


def test_all_folds_the_first_system_messages_into_the_first_user_turn() -> None:
    folded = fold_system_messages([system("a"), user("u"), system("b")], "all")
    assert folded == [user(f"{reminder('a')}\n\nu\n\n{reminder('b')}")]


def test_the_fold_does_not_change_as_the_conversation_grows() -> None:
    turn1 = [system("s"), user("hi"), system("agents")]
    turn2 = [*turn1, assistant("calling"), user("result"), system("late")]
    for fold in ("later", "all"):
        first, second = fold_system_messages(turn1, fold), fold_system_messages(turn2, fold)
        assert second[: len(first)] == first  # the prompt cache reuses turn 1's prompt


def test_each_template_gets_the_least_fold_it_renders() -> None:
    qwen35 = template(QWEN35_TEMPLATE.read_text())
    assert qwen35.system_fold == "later"  # "System message must be at the beginning."
    chatml = template(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    assert chatml.system_fold == "none"
    refuses = "{% if messages[0].role == 'system' %}{{ raise_exception('no system') }}{% endif %}"
    assert template(refuses + "{% for m in messages %}{{ m.content }}{% endfor %}").system_fold == (
        "all"
    )
    # llama.cpp's built-in gemma template: a system message waits for the next user turn,
    # and one that no user turn follows is dropped.
    waits = (
        "{% set ns = namespace(s='') %}{% for m in messages %}{% if m.role == 'system' %}"
        "{% set ns.s = ns.s + m.content %}{% else %}{{ ns.s + m.content }}{% set ns.s = '' %}"
        "{% endif %}{% endfor %}"
    )
    assert template(waits).system_fold == "later"
    assert system_fold(lambda messages: "".join(m.content for m in messages[:-1])) == "none"
    rendered = qwen35.render([system("s"), user("hi"), system("agents")], think=False)
    assert "<|im_start|>user\nhi\n\n<system-reminder>\nagents\n</system-reminder><|im_end|>" in (
        rendered.text
    )


# -- Claude Code's body --------------------------------------------------------------------------


def test_claude_codes_body_parses_with_its_system_message_in_place() -> None:
    request = parse_messages_request(json.dumps(CLAUDE_CODE_BODY).encode())
    roles = [m.role for m in request.generate.messages]
    assert roles == ["system", "user", "system"]  # was a 400: messages[1].role
    agents = CLAUDE_CODE_BODY["messages"][1]["content"]
    assert request.generate.messages[2].content == agents
    assert len(request.generate.tools) == 24


def sweep(path: Path) -> str:
    """Claude Code's body rendered by the template at ``path``: ``"rendered"`` with every
    message's text in the prompt, in order, or ``"refused: ..."`` (the 400 a request gets,
    quoting the template); anything else raised is a failure (a 500)."""
    request = parse_messages_request(json.dumps(CLAUDE_CODE_BODY).encode())
    generate = request.generate
    chat = template(path.read_text())
    try:
        prompt = chat.render(generate.messages, think=generate.think, tools=generate.tools).text
    except InvalidRequestError as error:
        assert error.param == "messages"
        assert str(error).startswith("the model's chat template refused these messages: ")
        return f"refused: {error}"
    at = 0
    for message in generate.messages:
        at = prompt.find(message.content[:300], at)
        assert at >= 0, f"{path.name} lost a {message.role} message"
    return "rendered"


@pytest.mark.parametrize("path", LOCAL, ids=lambda p: p.stem)
def test_claude_codes_body_renders_in_each_template_here(path: Path) -> None:
    assert sweep(path) == "rendered"


@pytest.fixture(scope="module")
def sdist_templates() -> list[Path]:
    try:
        folder = llama_templates()
    except InstallError as error:
        if error.offline:
            pytest.skip(f"PyPI cannot be reached, so the sdist's templates are not here: {error}")
        raise
    return sorted(folder.glob("*.jinja"))


def test_claude_codes_body_renders_in_every_template_of_the_sdist(
    sdist_templates: list[Path],
) -> None:
    """Every chat template of llama-cpp-python 0.3.36's sdist renders Claude Code's body, or
    refuses it with its own words (a 400); none fails otherwise (a 500)."""
    outcomes = {path.stem: sweep(path) for path in sdist_templates}
    refused = {name: outcome for name, outcome in outcomes.items() if outcome != "rendered"}
    print(f"{len(outcomes)} templates: {len(outcomes) - len(refused)} render, refused: {refused}")
    assert len(outcomes) == 70
    # The one refusal: firefunction's template reads a `functions` variable of its own, which
    # no OpenAI-shaped request gives.
    assert refused == {
        "fireworks-ai-llama-3-firefunction-v2": "refused: the model's chat template refused "
        "these messages: 'functions' is undefined"
    }


# -- the billing header ------------------------------------------------------------------------

STAMPED = "x-anthropic-billing-header: cc_version=2.1.101.e51; cc_entrypoint=cli; cch=a5145;"


def test_the_billing_headers_stamp_is_normalized_as_llama_cpp_does() -> None:
    assert normalize_billing_header(STAMPED) == STAMPED.replace("a5145", "fffff")
    assert normalize_billing_header(STAMPED + "You are") == (
        STAMPED.replace("a5145", "fffff") + "You are"
    )
    unstamped = "x-anthropic-billing-header: cc_version=2.1.197.123; cc_entrypoint=sdk-cli;"
    assert normalize_billing_header(unstamped) == unstamped
    assert normalize_billing_header("cch=a5145; elsewhere") == "cch=a5145; elsewhere"
    odd = STAMPED.replace("a5145", "a51")  # not 5 characters: left as it is (and logged)
    assert normalize_billing_header(odd) == odd


def test_two_bodies_differing_only_in_the_stamp_give_one_prompt() -> None:
    def prompt(stamp: str, system: Any) -> str:
        body = {**CLAUDE_CODE_BODY, "system": system}
        generate = parse_messages_request(json.dumps(body).encode()).generate
        return (
            template(QWEN35_TEMPLATE.read_text())
            .render(generate.messages, think=False, tools=generate.tools)
            .text
        )

    blocks = CLAUDE_CODE_BODY["system"]
    for stamp_in in ("string", "blocks"):
        prompts = set()
        for stamp in ("a5145", "0aaa9"):
            header = blocks[0]["text"] + f" cch={stamp};"
            if stamp_in == "string":
                system_value: Any = "\n".join([header, *(b["text"] for b in blocks[1:])])
            else:
                system_value = [{"type": "text", "text": header}, *blocks[1:]]
            prompts.add(prompt(stamp, system_value))
        assert len(prompts) == 1
