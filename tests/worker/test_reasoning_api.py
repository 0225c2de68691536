"""Chat completions' ``reasoning_effort``, the Responses API's ``reasoning.effort``, the
Messages API's ``thinking.budget_tokens`` and the server's ``--default-max-tokens``, through
the API in process, on the default model's own tokenizer and template
(``qwen35_real_path``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from llmtrio.api import CHAT_PATH, COMPLETIONS_PATH, MESSAGES_PATH, RESPONSES_PATH
from llmtrio.ring import RingConfig
from llmtrio.web import ServeConfig
from llmtrio.worker import RequestLimits
from llmtrio.worker._reasoning import EFFORTS, Reasoning

from .._helpers import engine_config
from .._qwen35_real import ADDED_TOKENS
from .._stack import open_stack

IDS = {text: token for token, text in ADDED_TOKENS.items()}
#: The model never opens or closes a think block itself: every close is the budget's.
NO_MARKERS = {str(IDS["<think>"]): -100, str(IDS["</think>"]): -100}
HI = [{"role": "user", "content": "Hi"}]
DEFAULT, LIMIT = 6, 64


async def test_effort_and_the_default_output_limit_through_the_api(
    qwen35_real_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ``low``'s budget made small enough to see it cut the reasoning in a short reply.
    monkeypatch.setitem(EFFORTS, "low", Reasoning(think=True, budget=4))
    engine = engine_config(qwen35_real_path, max_inflight=1, ctx_size=512, threads=1)
    config = ServeConfig(port=0, ring=RingConfig(max_streams=8), graceful_timeout=1)
    limits = RequestLimits(max_tokens=LIMIT, default_max_tokens=DEFAULT)
    async with (
        open_stack(engine, config, limits) as stack,
        httpx.AsyncClient(base_url=stack.url, timeout=60) as http,
    ):

        async def chat(**fields: Any) -> dict[str, Any]:
            body = {"messages": HI, "ignore_eos": True, "logit_bias": NO_MARKERS, "temperature": 0}
            body |= fields
            answer = await http.post(CHAT_PATH, json=body)
            assert answer.status_code == 200, answer.text
            result: dict[str, Any] = answer.json()
            return result

        # No output limit named: the server's default, on both generating routes.
        unnamed = await chat()
        assert unnamed["usage"]["completion_tokens"] == DEFAULT
        assert unnamed["choices"][0]["finish_reason"] == "length"
        text = await http.post(COMPLETIONS_PATH, json={"prompt": "Hi", "ignore_eos": True})
        assert text.json()["usage"]["completion_tokens"] == DEFAULT
        # Named: as asked, up to the limit; over it, a 400 naming the field.
        assert (await chat(max_tokens=9))["usage"]["completion_tokens"] == 9
        over = await http.post(CHAT_PATH, json={"messages": HI, "max_tokens": LIMIT + 1})
        assert over.status_code == 400 and over.json()["error"]["param"] == "max_tokens"

        # Effort: ``low`` thinks and is cut at its budget, the answer follows; ``max`` thinks
        # on (the model never closes the block here); ``none`` does not think.
        low = (await chat(reasoning_effort="low", max_tokens=20))["choices"][0]["message"]
        unbounded = (await chat(reasoning_effort="max", max_tokens=20))["choices"][0]["message"]
        off = (await chat(reasoning_effort="none", max_tokens=8))["choices"][0]["message"]
        assert low.get("reasoning_content") and low.get("content")
        assert "</think>" not in low["reasoning_content"] + low["content"]
        assert unbounded.get("reasoning_content") and not unbounded.get("content")
        assert unbounded["reasoning_content"].startswith(low["reasoning_content"].rstrip())
        assert not off.get("reasoning_content") and off.get("content")
        # ``think`` wins on the switch: effort ``none`` with thinking asked for thinks, with
        # ``none``'s budget of 0 (the block closed at once).
        zero = await chat(reasoning_effort="none", think=True, max_tokens=8)
        assert not zero["choices"][0]["message"].get("reasoning_content")
        assert zero["choices"][0]["message"].get("content")
        refused = await http.post(CHAT_PATH, json={"messages": HI, "reasoning_effort": "huge"})
        assert refused.status_code == 400
        assert refused.json()["error"]["param"] == "reasoning_effort"

        # The Responses API: ``reasoning.effort`` through the same table, the same budget;
        # no ``max_output_tokens``: the server's default.
        async def respond(**fields: Any) -> dict[str, Any]:
            answer = await http.post(
                RESPONSES_PATH, json={"input": "Hi", "temperature": 0} | fields
            )
            assert answer.status_code == 200, answer.text
            result: dict[str, Any] = answer.json()
            return result

        response = await respond(reasoning={"effort": "low"}, max_output_tokens=20)
        assert [item["type"] for item in response["output"]] == ["reasoning", "message"]
        reasoning = response["output"][0]["content"][0]["text"]
        answer_text = response["output"][1]["content"][0]["text"]
        assert reasoning and answer_text and "</think>" not in reasoning + answer_text
        # The budget's 4 tokens and the marker (counted as reasoning, as the tags are).
        assert response["usage"]["output_tokens_details"]["reasoning_tokens"] == 5
        assert response["usage"]["output_tokens"] == 20
        unnamed = await respond()
        assert unnamed["usage"]["output_tokens"] == DEFAULT
        assert unnamed["status"] == "incomplete"

        # The Messages API: ``thinking.budget_tokens`` is the budget itself.
        thinking = {"type": "enabled", "budget_tokens": 4}
        body = {"messages": HI, "max_tokens": 20, "temperature": 0, "thinking": thinking}
        message = (await http.post(MESSAGES_PATH, json=body)).json()
        assert [block["type"] for block in message["content"]] == ["thinking", "text"], message
        thought, said = message["content"][0]["thinking"], message["content"][1]["text"]
        assert thought and said and "</think>" not in thought + said
        assert thought == reasoning  # the same prompt, greedy: the same 4 tokens of reasoning
        assert message["usage"]["output_tokens"] == 20
