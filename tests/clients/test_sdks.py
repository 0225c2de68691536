"""The agent SDKs, run for real (issue 42): OpenAI's Agents SDK (``openai-agents`` 0.25.0: an
agent whose model must call its function tool, on the Responses API, whole and streamed) and
LangChain (``langchain-openai`` 1.8.1: chat, a forced tool call, structured output, a
stream), each in a virtual environment of its own from PyPI (``tests/_clients.py``), and the
``openai`` and ``anthropic`` SDKs this project tests with; against ``llmtrio serve`` on gemma
and on the Qwen3.5 real-template model, and over the ring with a remote worker
(``tests/_client_targets.py``). Each client gets a result and its usage. A client is
skipped, saying so, only when PyPI cannot be reached.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import anthropic
import openai

from .._client_targets import CONTEXT, Target, installed
from .._clients import AGENTS_SDK, LANGCHAIN_OPENAI, Package

HERE = Path(__file__).resolve().parents[1]  # the drivers sit beside the shared helpers


def drive(package: Package, script: str, target: Target) -> Any:
    """``script`` (a file beside this one) run by ``package``'s own Python against
    ``target``: the JSON it prints."""
    python = installed(package)
    done = subprocess.run(
        [str(python), str(HERE / script), target.v1, target.model],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"{script}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    return json.loads(done.stdout.splitlines()[-1])


def test_the_agents_sdk_calls_its_forced_tool_whole_and_streamed(client_target: Target) -> None:
    ran = drive(AGENTS_SDK, "_drive_agents_sdk.py", client_target)
    for mode in ("whole", "streamed"):
        run = ran[mode]
        (call,) = run["calls"]
        assert isinstance(call["city"], str)
        assert run["final_output"] == f"Sunny in {call['city']}."  # the tool's own answer
        usage = run["usage"]
        assert usage["requests"] == 1 and usage["input_tokens"] > 0
        assert usage["output_tokens"] > 0
    assert "raw_response_event" in ran["streamed"]["events"]


def test_langchain_chats_calls_a_tool_and_gives_structured_output(client_target: Target) -> None:
    ran = drive(LANGCHAIN_OPENAI, "_drive_langchain.py", client_target)
    assert isinstance(ran["chat"]["text"], str) and isinstance(ran["streamed"], str)
    (call,) = ran["tools"]["tool_calls"]
    assert call["name"] == "lookup" and isinstance(call["args"]["city"], str)
    structured = ran["structured"]
    assert structured["error"] is None, structured
    assert isinstance(structured["parsed"]["colour"], str)
    assert 0 <= structured["parsed"]["number"] <= 9
    for part in ("chat", "tools", "structured"):
        usage = ran[part]["usage"]
        assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0, (part, usage)
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_the_openai_and_anthropic_sdks(client_target: Target) -> None:
    (listed,) = [m for m in client_target.models() if m["id"] == client_target.model]
    assert listed["context_length"] == listed["max_model_len"] == CONTEXT
    assert listed["max_context_length"] == CONTEXT
    with openai.OpenAI(base_url=client_target.v1, api_key="unused", max_retries=0) as client:
        chat = client.chat.completions.create(
            model=client_target.model,
            messages=[{"role": "user", "content": "Say hi."}],
            max_tokens=4,
        )
        assert chat.usage is not None and chat.usage.prompt_tokens > 0
        response = client.responses.create(
            model=client_target.model, input="Say hi.", max_output_tokens=4
        )
        assert response.usage is not None and response.usage.input_tokens > 0
    with anthropic.Anthropic(base_url=client_target.url, api_key="unused", max_retries=0) as sdk:
        message = sdk.messages.create(
            model="claude-any",
            max_tokens=4,
            system="Be brief.",
            messages=[
                {"role": "user", "content": "Say hi."},
                {"role": "system", "content": "Answer in English."},  # type: ignore[misc,list-item]
            ],
        )
        assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) > 0
        assert message.stop_reason in ("end_turn", "max_tokens")
