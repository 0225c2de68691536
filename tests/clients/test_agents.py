"""The coding agents, run for real (issue 42): Claude Code 2.1.197 in print mode and Codex
0.171.0's ``codex exec`` with a Responses provider, from npm (``tests/_clients.py``), against
``llmtrio serve`` on gemma and on the Qwen3.5 real-template model, and over the ring with a
remote worker (``tests/_client_targets.py``).

What is checked is the protocol, not the tiny models' wisdom: the client gets a result, or
its own documented limit message (the replies are noise cut at a few tokens); usage is
reported; a second Claude Code run over the same project reads at least 90% of its prompt
from the cache; a prompt over the context reaches Claude Code in the words that make it
compact. A client is skipped, saying so, only when npm cannot be reached.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from .._capture import run_claude, run_codex, scratch
from .._client_targets import Target, installed
from .._clients import CLAUDE_CODE, CODEX

#: Claude Code's output limit here (it sends 64,000): the replies are noise.
CLAUDE_MAX_TOKENS = "16"
#: What Claude Code says when a reply reached its output limit (its documented message,
#: which names the setting).
CLAUDE_LIMIT = (
    f"API Error: Claude's response exceeded the {CLAUDE_MAX_TOKENS} output token maximum. "
    "To configure this behavior, set the CLAUDE_CODE_MAX_OUTPUT_TOKENS environment variable."
)
#: Claude Code's tools on each target: all 24 on Qwen3.5's (Claude Code's prompt is then
#: 21,000 tokens, a few seconds on the 2-layer model); three on gemma, whose 270M parameters
#: take over a minute for the whole 19,600 on 2 cores (the template renders the same way, as
#: tests/engine/test_system_messages.py checks with all of them).
CLAUDE_TOOLS = {"gemma": ["--tools", "Bash,Read,Edit"]}
#: What Codex says when a response was cut by its output limit.
CODEX_LIMIT = "Incomplete response returned, reason: max_output_tokens"
#: The JSON a Codex run must answer with (``--output-schema``: a ``text.format`` the grammar
#: holds, so the reply ends).
GREETING = {
    "type": "object",
    "properties": {"greeting": {"enum": ["hi", "hello"]}},
    "required": ["greeting"],
    "additionalProperties": False,
}


def claude(target: Target, home: Path, project: Path, *args: str, stdin: str | None = None) -> Any:
    """``claude -p`` with ``args`` against ``target``; its output read as JSON lines."""
    installed(CLAUDE_CODE)
    done = run_claude(
        target.url,
        ["-p", *args, *CLAUDE_TOOLS.get(target.name, [])],
        home,
        project,
        stdin=stdin,
        timeout=900,
        CLAUDE_CODE_MAX_OUTPUT_TOKENS=CLAUDE_MAX_TOKENS,
    )
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"claude exited {done.returncode}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    return lines


def read_prompt(usage: dict[str, Any]) -> tuple[int, int]:
    """(the prompt tokens computed, those read from the cache) of a run's usage."""
    return usage["input_tokens"], usage["cache_read_input_tokens"]


def test_claude_code_answers_and_its_second_run_reads_the_prompt_from_the_cache(
    client_target: Target, tmp_path: Path
) -> None:
    home, project = scratch(tmp_path)
    (result,) = claude(client_target, home, project, "Say hi", "--output-format", "json")
    assert result["type"] == "result" and result["api_error_status"] is None, result
    # A reply the model ends, or Claude Code's own words for one cut at its output limit.
    assert result["result"] == CLAUDE_LIMIT or not result["is_error"], result
    computed, cached = read_prompt(result["usage"])
    assert computed + cached > 3000  # its system prompt and tools, templated
    assert result["usage"]["output_tokens"] > 0
    # The same project again, streamed: its prompt is the first run's, read from the cache.
    lines = claude(
        client_target, home, project, "Say hi", "--output-format", "stream-json", "--verbose"
    )
    kinds = [line["type"] for line in lines]
    assert kinds[0] == "system" and "assistant" in kinds and kinds[-1] == "result"
    final = lines[-1]
    assert final["result"] == CLAUDE_LIMIT or not final["is_error"], final
    computed, cached = read_prompt(final["usage"])
    assert cached >= 0.9 * (computed + cached), final["usage"]


def test_a_prompt_over_the_context_reaches_claude_code_as_one_to_compact(
    client_target: Target, tmp_path: Path
) -> None:
    home, project = scratch(tmp_path)
    words = "word " * 30_000  # over the target's context with any tokenizer here
    (result,) = claude(client_target, home, project, "--output-format", "json", stdin=words)
    assert result["api_error_status"] == 400 and result["is_error"], result
    assert result["terminal_reason"] == "prompt_too_long", result
    assert result["result"].startswith("Prompt is too long"), result


def codex(target: Target, home: Path, project: Path, *args: str, freeform: bool = False) -> Any:
    """``codex exec --json`` with ``args`` against ``target``: its events."""
    installed(CODEX)
    argv = ["exec", "--skip-git-repo-check", "--json", *args]
    done = run_codex(target.url, target.model, argv, home, project, freeform=freeform,
                     timeout=900)  # fmt: skip
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert events, f"codex exited {done.returncode}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    return done.returncode, events


#: The targets Codex's runs without a schema and with its function ``apply_patch`` take: its
#: prompt is 7,000 tokens, so gemma (270M parameters, half a minute a prompt on a quiet core)
#: runs only the freeform turn, which offers its tools of every kind.
QWEN_TARGETS = ["qwen35", "ring-qwen35"]


@pytest.mark.parametrize("client_target", QWEN_TARGETS, indirect=True)
def test_codex_answers_or_names_its_output_limit(client_target: Target, tmp_path: Path) -> None:
    home, project = scratch(tmp_path)
    code, events = codex(client_target, home, project, "Say hi")
    kinds = [event["type"] for event in events]
    if "turn.completed" in kinds:  # the model ended its reply within the server's default
        assert code == 0
    else:  # cut at the server's default output limit: Codex's own words for it
        assert events[-1] == {"type": "turn.failed", "error": {"message": CODEX_LIMIT}}, events
        assert code == 1


@pytest.mark.parametrize(
    ("client_target", "freeform"),
    [
        *[pytest.param(name, False, id=f"{name}-function-apply-patch") for name in QWEN_TARGETS],
        *[pytest.param(name, True, id=f"{name}-freeform") for name in ("gemma", *QWEN_TARGETS)],
    ],
    indirect=["client_target"],
)
def test_codex_completes_a_turn_and_reports_its_usage(
    client_target: Target, tmp_path: Path, freeform: bool
) -> None:
    """With ``--output-schema`` the reply is JSON the grammar holds, so it ends and the turn
    completes; with ``apply_patch_tool_type = "freeform"`` Codex's ``apply_patch`` is a custom
    tool with a Lark grammar (offered to the model, no longer dropped)."""
    home, project = scratch(tmp_path)
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(GREETING))
    code, events = codex(
        client_target, home, project, "--output-schema", str(schema), "Say hi", freeform=freeform
    )
    assert code == 0, events
    completed = [e for e in events if e["type"] == "turn.completed"]
    assert len(completed) == 1, events
    usage = completed[0]["usage"]
    assert usage["input_tokens"] > 1000 and usage["output_tokens"] > 0, usage
    items = [e["item"] for e in events if e["type"] == "item.completed"]
    (message,) = [item["text"] for item in items if item["type"] == "agent_message"]
    jsonschema.validate(json.loads(message), GREETING)
