"""System messages past the first, for templates that take a system message only first. Pure.

Clients send system (and ``developer``) messages anywhere in a conversation: Claude Code a
``system`` message after the first user turn (the list of its agent types), Codex two
``developer`` messages before the first user message. Many chat templates take one system
message, first: Qwen3.5's raises "System message must be at the beginning.", gemma's
(llama.cpp's built-in one) drops a system message that no user turn follows.

The rule (rule of 2026-12-07, issue 42): a template is probed once, when it is loaded, with a
conversation holding system messages in every position (:func:`system_fold`), and gets the
first of these forms that it renders with every system message's text, in order:

- ``"none"``: every conversation as it is;
- ``"later"``: the system messages before the first other message are joined into one,
  first (by a blank line); each later one is folded into the user turn next to it, as a
  ``<system-reminder>`` block (the tags Claude Code itself puts around what its harness adds
  to a user turn): at the end of the user message just before it, else at the start of the
  user message just after it, else it becomes a user message of its own;
- ``"all"``: for a template that refuses system messages altogether (Gemma 2's "System role
  not supported"): the first ones too are folded, into the first user turn, as llama.cpp's
  built-in gemma template does.

A template that renders none of them gets conversations as they are, and its refusal is the
request's (a 400 quoting it).

The earlier neighbour is preferred because it does not change when the conversation grows:
the same conversation folds to the same prefix on every turn, so the prompt cache reuses it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from .._types import ChatMessage

__all__ = [
    "FOLDS",
    "PROBE",
    "SYSTEM_ROLES",
    "fold_system_messages",
    "reminder",
    "system_fold",
]

#: The roles templates see as a system message (``developer`` is rendered as ``system``).
SYSTEM_ROLES = ("system", "developer")
#: How much of a conversation's system messages is folded into user turns, least first.
FOLDS = ("none", "later", "all")
_JOIN = "\n\n"


def reminder(text: str) -> str:
    """``text`` as a block of a user turn, in Claude Code's own tags."""
    return f"<system-reminder>\n{text}\n</system-reminder>"


#: The probe: system messages first (two), between a user and an assistant turn, and last.
PROBE: tuple[ChatMessage, ...] = (
    ChatMessage("system", "llmtrio-probe-s1"),
    ChatMessage("system", "llmtrio-probe-s2"),
    ChatMessage("user", "llmtrio-probe-u1"),
    ChatMessage("system", "llmtrio-probe-s3"),
    ChatMessage("assistant", "llmtrio-probe-a1"),
    ChatMessage("user", "llmtrio-probe-u2"),
    ChatMessage("system", "llmtrio-probe-s4"),
)


def system_fold(render: Callable[[Sequence[ChatMessage]], str]) -> str:
    """The least fold of :data:`FOLDS` with which ``render`` (a template, from messages to
    its prompt) renders :data:`PROBE` whole: without raising, every message's text in order.
    ``"none"`` when no fold does."""
    for fold in FOLDS:
        try:
            text = render(fold_system_messages(PROBE, fold))
        except Exception:  # the template refused this form: try the next
            continue
        at = -1
        for message in PROBE:
            at = text.find(message.content, at + 1)
            if at < 0:
                break
        else:
            return fold
    return "none"


def fold_system_messages(messages: Sequence[ChatMessage], fold: str) -> list[ChatMessage]:
    """``messages`` with their system messages folded as ``fold`` says (see the module's
    doc): ``"none"`` leaves them as they are."""
    if fold == "none":
        return list(messages)
    out: list[ChatMessage] = []
    index = 0
    if fold == "later":
        leading: list[str] = []
        while index < len(messages) and messages[index].role in SYSTEM_ROLES:
            leading.append(messages[index].content)
            index += 1
        if leading:
            out.append(ChatMessage("system", _JOIN.join(t for t in leading if t)))
    pending: list[str] = []  # system messages no user turn has taken yet
    for message in messages[index:]:
        if message.role in SYSTEM_ROLES:
            if out and out[-1].role == "user" and not pending:
                last = out[-1]
                out[-1] = attrs.evolve(last, content=_joined(last.content, message.content))
            else:
                pending.append(message.content)
            continue
        if pending and message.role == "user":
            blocks = _JOIN.join(reminder(t) for t in pending)
            content = _JOIN.join((blocks, message.content)) if message.content else blocks
            message = attrs.evolve(message, content=content)
            pending = []
        elif pending:
            out.append(ChatMessage("user", _JOIN.join(reminder(t) for t in pending)))
            pending = []
        out.append(message)
    if pending:
        out.append(ChatMessage("user", _JOIN.join(reminder(t) for t in pending)))
    return out


def _joined(content: str, system: str) -> str:
    return _JOIN.join((content, reminder(system))) if content else reminder(system)
