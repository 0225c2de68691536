"""Speculative decoding end to end: through the engine (Trio side: stop strings, one event
per accepted token, log-probabilities) and over HTTP (``timings``, ``/health``,
``/metrics``), on the gemma test model with a "rewrite" request (the prompt holds a text,
the request asks for it back), where prompt lookup drafts well."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import httpx
import numpy as np

from llmtrio.api import CHAT_PATH
from llmtrio.engine import Engine, GenerateRequest
from llmtrio.ring import RingConfig
from llmtrio.web import ServeConfig

from .._helpers import engine_config, events_of
from .._stack import open_stack
from ..worker.test_metrics import scrape, value
from .test_spec_decode_core import REWRITE

PROMPT = f"Text:\n{REWRITE}\n\nThe same text, copied exactly:\nText:\n"


#: This file's engines: 2 slots of 512 tokens, drafting (whatever the default), unless a
#: test says otherwise.
config = partial(engine_config, max_inflight=2, spec="ngram")


def rewrite(engine: Engine, **kwargs: object) -> GenerateRequest:
    values: dict[str, object] = {"max_tokens": 48, "ignore_eos": True}
    values.update(kwargs)
    return GenerateRequest(tokens=engine.tokenize(PROMPT, add_special=True), **values)  # type: ignore[arg-type]


async def test_divergences_from_plain_decoding_are_near_ties(gemma_path: Path) -> None:
    """Verifying several tokens in one batch moves the logits a little: where the output
    differs from decoding without drafts, the first difference is that run's second
    choice, within 1 nat of its first. Each accepted token is its own event, with the
    log-probability of the logits it was verified against."""
    async with Engine.open(config(gemma_path, spec=None)) as engine:
        plain, plain_done = await events_of(engine, rewrite(engine, logprobs=2))
    async with Engine.open(config(gemma_path)) as engine:
        spec, done = await events_of(engine, rewrite(engine, logprobs=2))
        assert engine.stats.steps < done.completion_tokens  # several tokens a step
    assert done.draft_tokens > 0 and done.accepted_tokens > done.draft_tokens / 2
    assert plain_done.draft_tokens == 0
    assert done.completion_tokens == plain_done.completion_tokens == 48
    got = [lp for event in spec for lp in event.logprobs]
    want = [lp for event in plain for lp in event.logprobs]
    assert len(got) == len(want) == 48
    for a, b in zip(got, want, strict=True):
        if a.piece != b.piece:
            assert b.top[1][1] == a.piece, (a, b)
            assert b.top[0][2] - b.top[1][2] < 1.0
            break
        # The same token: its log-probability up to the batch shape's numerics.
        assert abs(a.logprob - b.logprob) < 0.05
    else:
        assert "".join(t.text for t in spec) == "".join(t.text for t in plain)


async def test_a_stop_string_inside_an_accepted_run_ends_there(gemma_path: Path) -> None:
    stop = "sandbags"
    async with Engine.open(config(gemma_path, spec=None)) as engine:
        plain, plain_done = await events_of(engine, rewrite(engine, stop=[stop]))
    async with Engine.open(config(gemma_path)) as engine:
        spec, done = await events_of(engine, rewrite(engine, stop=[stop]))
    text = "".join(t.text for t in spec)
    assert stop not in text and text == "".join(t.text for t in plain)
    assert done.stop.finish_reason == plain_done.stop.finish_reason == "stop"
    assert done.completion_tokens == plain_done.completion_tokens
    assert done.accepted_tokens > 0


async def test_timings_health_and_metrics_count_drafts(gemma_path: Path) -> None:
    serve = ServeConfig(
        host="127.0.0.1", port=0, ring=RingConfig(max_streams=8), graceful_timeout=1
    )
    async with (
        open_stack(config(gemma_path), serve) as stack,
        httpx.AsyncClient(timeout=120) as http,
    ):
        before = await scrape(http, stack.url + "/metrics")
        body = {
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 40,
            "temperature": 0,
            "ignore_eos": True,
        }
        response = await http.post(stack.url + CHAT_PATH, json=body)
        assert response.status_code == 200, response.text
        timings = response.json()["timings"]
        assert timings["draft_n"] >= timings["draft_n_accepted"] > 0
        await stack.wait_idle()
        after = await scrape(http, stack.url + "/metrics")
        drafted = value(after, "vllm:spec_decode_num_draft_tokens_total") - value(
            before, "vllm:spec_decode_num_draft_tokens_total"
        )
        accepted = value(after, "vllm:spec_decode_num_accepted_tokens_total") - value(
            before, "vllm:spec_decode_num_accepted_tokens_total"
        )
        assert (drafted, accepted) == (timings["draft_n"], timings["draft_n_accepted"])
        assert value(after, "vllm:spec_decode_num_drafts_total") > 0
        health = (await http.get(stack.url + "/health")).json()
        speculation = health["speculation"]
        assert speculation["draft_tokens"] == drafted
        assert speculation["accepted_tokens"] == accepted
        assert np.isclose(speculation["acceptance"], accepted / drafted, atol=1e-3)
        worker = health["workers"][0]["capacity"]["speculation"]
        assert worker["draft_tokens"] == drafted
