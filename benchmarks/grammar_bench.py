"""Structured output costs: compiling a 50-property schema (cold, and from the caches), and
how soon a streamed tool call's arguments start against the whole call's time.

    .venv/bin/python benchmarks/grammar_bench.py [--model PATH] [--rounds 5]

Compile: the JSON schema to GBNF (llmtrio's converter, every cache emptied; a schema not
seen before, the formats' automata built; then again, a cache hit) and llama.cpp's parse of
the GBNF (``llama_sampler_init_grammar``; then a copy of the parsed grammar, what each
further request with the schema costs). llama-cpp-python's converter
is timed on the same schema less the keywords it cannot enforce, for reference.

Tool calls: a forced call of a tool with a long string argument, greedy, streamed by
``llmtrio serve`` (in this process, on a loopback port) to an HTTP client reading the
server-sent events: the time from sending the request to the call's first delta (id and
name), to its first argument piece, and to its last (the whole call), in the Hermes JSON form
(the model's built-in template) and Qwen's XML form (a template that writes calls so).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import llama_cpp
import numpy as np
import trio
from llama_cpp import llama_grammar

from llmtrio.cli import serve
from llmtrio.engine import EngineConfig, Tool, demo_model_path, json_schema_grammar
from llmtrio.engine.grammar import _formats, _grammar, _regex
from llmtrio.engine.llama import Batch, LlamaModel, SlotSampler
from llmtrio.engine.llama._grammar_cache import GrammarCache
from llmtrio.web import ServeConfig

_KINDS: list[dict[str, Any]] = [
    {"type": "integer", "minimum": 0, "maximum": 150},
    {"type": "number", "exclusiveMinimum": 0, "maximum": 100},
    {"type": "string", "minLength": 1, "maxLength": 40},
    {"type": "string", "pattern": "^[A-Z]{2}[0-9]{4}$"},
    {"type": "string", "format": "date"},
    {"type": "string", "format": "email"},
    {"type": "string", "format": "uuid"},
    {"type": "string", "enum": ["red", "green", "blue"]},
    {"type": ["string", "null"], "maxLength": 20},
    {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 5},
]
# What llama-cpp-python's converter refuses or ignores.
_UNSUPPORTED = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}


def schema_50() -> dict[str, Any]:
    properties = {f"field_{i:02d}": _KINDS[i % len(_KINDS)] for i in range(50)}
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def _strip(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _strip(v) for k, v in schema.items() if k not in _UNSUPPORTED}
    if isinstance(schema, list):
        return [_strip(v) for v in schema]
    if schema == "email":
        return "date"  # a format it takes
    return schema


def best_of(rounds: int, fn: Any) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def compile_figures(model_path: Path, rounds: int) -> None:
    schema = schema_50()

    def cold() -> str:
        _grammar._schema_grammar.cache_clear()
        _formats.format_dfa.cache_clear()
        _regex.pattern_dfa.cache_clear()
        return json_schema_grammar(schema)

    def first() -> str:  # a schema not seen before; the formats' automata built already
        _grammar._schema_grammar.cache_clear()
        return json_schema_grammar(schema)

    gbnf = cold()
    cold_s = best_of(rounds, cold)
    first_s = best_of(rounds, first)
    warm_s = best_of(rounds * 20, lambda: json_schema_grammar(schema))

    stripped = _strip(schema)

    def port() -> None:
        converter: Any = llama_grammar.SchemaConverter(
            prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False
        )
        converter.visit(converter.resolve_refs(json.loads(json.dumps(stripped)), "s"), "")
        converter.format_grammar()

    port_s = best_of(rounds, port)

    model = LlamaModel(model_path, slots=1, ctx_size=64, threads=2, n_batch=64)
    try:

        def parse() -> None:
            cache = GrammarCache(model.vocab)
            cache.check(gbnf)
            cache.clear()

        parse_s = best_of(rounds, parse)
        cache = GrammarCache(model.vocab)
        cache.check(gbnf)

        def copy() -> None:
            llama_cpp.llama_sampler_free(cache.new(gbnf))

        copy_s = best_of(rounds * 20, copy)
        cache.clear()
    finally:
        model.close()
    print(f"A 50-property schema ({len(gbnf.splitlines())} grammar rules, {len(gbnf)} bytes):")
    print(f"  JSON schema to GBNF, cold (caches emptied)   {cold_s * 1000:8.2f} ms")
    print(f"  JSON schema to GBNF, a new schema            {first_s * 1000:8.2f} ms")
    print(f"  JSON schema to GBNF, cached                  {warm_s * 1000:8.3f} ms")
    print(f"  llama-cpp-python's converter (no bounds)     {port_s * 1000:8.2f} ms")
    print(f"  llama.cpp parses the GBNF                    {parse_s * 1000:8.2f} ms")
    print(f"  a copy of the parsed grammar (cached)        {copy_s * 1000:8.3f} ms")
    print(
        f"  per request: {(first_s + parse_s) * 1000:.1f} ms for a new schema, "
        f"{(warm_s + copy_s) * 1000:.2f} ms for one seen before "
        f"({(first_s + parse_s) / (warm_s + copy_s):.0f}x)"
    )


NOTE = Tool(
    "save_note",
    "Save a note",
    {
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 30},
            "body": {"type": "string", "minLength": 200, "maxLength": 240},
        },
        "required": ["title", "body"],
        "additionalProperties": False,
    },
)
# A template that writes calls in Qwen's XML form (the engine then forces that form).
XML_TEMPLATE = (
    "{%- if tools %}{{- '<tools>' }}{%- for t in tools %}{{- t | tojson }}{%- endfor %}"
    "{{- '</tools> Call as <tool_call>\\n<function=NAME>\\n<parameter=P>\\nV\\n</parameter>\\n"
    "</function>\\n</tool_call>\\n' }}{%- endif %}"
    "{%- for m in messages %}{{- m.role + ': ' + m.content + '\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- 'assistant: ' }}{%- endif %}"
)


async def call_times(model_path: Path, template: str | None, rounds: int) -> list[float]:
    """Medians, in seconds from sending the request, of what a streaming client of
    ``llmtrio serve`` reads: the call's first delta (id and name), its first argument piece,
    and its last one (the whole call)."""
    config = EngineConfig(
        model=model_path, max_inflight=1, ctx_size=768, threads=2, chat_template=template
    )
    body = {
        "model": "any",
        "messages": [{"role": "user", "content": "Save a note about the weather."}],
        "tools": [NOTE.as_openai()],
        "tool_choice": {"type": "function", "function": {"name": "save_note"}},
        "max_tokens": 500,
        "temperature": 0,
        "stream": True,
    }
    starts, firsts, ends = [], [], []
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        serve_config = ServeConfig(host="127.0.0.1", port=0, graceful_timeout=1)
        binds = await nursery.start(
            lambda task_status: serve(
                config, serve_config, shutdown=shutdown, task_status=task_status
            )
        )
        async with httpx.AsyncClient(base_url=binds[0], timeout=300) as client:
            for _ in range(rounds):
                seen: dict[str, float] = {}
                begin = time.perf_counter()
                async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
                    reply.raise_for_status()
                    async for line in reply.aiter_lines():
                        if not line.startswith("data: {"):
                            continue
                        now = time.perf_counter() - begin
                        choices = json.loads(line[len("data: ") :])["choices"]
                        for call in (
                            (choices[0]["delta"].get("tool_calls") or []) if choices else []
                        ):
                            if "id" in call:
                                seen.setdefault("start", now)
                            elif call["function"].get("arguments"):
                                seen.setdefault("first", now)
                                seen["end"] = now
                starts.append(seen["start"])
                firsts.append(seen["first"])
                ends.append(seen["end"])
                print(
                    f"    a round: start {seen['start']:.2f} s, first argument piece "
                    f"{seen['first']:.2f} s, last {seen['end']:.2f} s",
                    flush=True,
                )
        shutdown.set()
    return [statistics.median(x) for x in (starts, firsts, ends)]


class WholeVocabulary(SlotSampler):
    """llama.cpp's common sampler on a refusal: the grammar over every token, then the pick
    again (greedy: argmax; sampled: the chain) over what it allows."""

    def _pick_allowed(self, logits: Any) -> int:
        candidates = self._candidates()
        candidates.fill(logits)
        llama_cpp.llama_sampler_apply(self._grammar, candidates.ref)
        masked = np.ascontiguousarray(candidates.data["logit"])
        if not np.isfinite(masked).any():
            return -1
        return self._pick(masked)


def refusal_figures(model_path: Path, replies: int) -> None:
    """Replies to compare.py's bounded schema, each decoded once per refusal path (the same
    tokens come out of both): refusals per reply and what the refusal path costs."""
    from _servers import GRAMMAR_SCHEMA, PROMPTS

    model = LlamaModel(model_path, slots=1, ctx_size=1024, threads=1, n_batch=512)
    gbnf = json_schema_grammar(GRAMMAR_SCHEMA)
    print(
        "\nReplies to compare.py's bounded schema (one slot, up to 400 tokens), each decoded "
        "with both refusal paths; seconds in sampling, per reply:"
    )
    try:
        modes: tuple[tuple[str, dict[str, Any]], ...] = (
            ("greedy", {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}),
            ("sampled", {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}),
        )
        for mode, settings in modes:
            for i in range(replies):
                prompt = model.tokenize("Summarise as JSON: " + PROMPTS[i], add_special=True)
                outs = []
                for kind in (WholeVocabulary, SlotSampler):
                    sampler = kind(model, **settings, seed=i, bias={}, grammar=gbnf)
                    outs.append(decode_counted(model, sampler, prompt))
                    sampler.close()
                (base, base_s, base_n), (ours, ours_s, ours_n) = outs
                assert (base, base_n) == (ours, ours_n), "the refusal paths picked differently"
                print(
                    f"  {mode:<8} reply {i + 1}: {len(ours)} tokens, {ours_n} refusals; "
                    f"sampling {base_s:.2f} s with the whole-vocabulary pass, {ours_s:.2f} s "
                    f"searching most likely first (x{base_s / ours_s:.1f})"
                )
    finally:
        model.close()


def decode_counted(
    model: LlamaModel, sampler: SlotSampler, prompt: list[int]
) -> tuple[list[int], float, int]:
    """Greedy or sampled decode of one reply: its tokens, the seconds spent sampling, and
    how many tokens the grammar refused at first."""
    refusals = 0
    inner = sampler._pick_allowed

    def counted(logits: Any) -> int:
        nonlocal refusals
        refusals += 1
        return inner(logits)

    sampler._pick_allowed = counted  # type: ignore[method-assign]
    model.forget(0)
    batch = Batch(len(prompt) + 1)
    index = batch.add(np.asarray(prompt, np.int32), 0, 0, output_last=True)
    assert model.decode(batch) == 0
    out: list[int] = []
    sampling = 0.0
    for pos in range(len(prompt), len(prompt) + 400):
        start = time.perf_counter()
        token = sampler.sample(index)
        sampling += time.perf_counter() - start
        if token < 0 or token in model.eog:
            break
        out.append(token)
        batch.clear()
        index = batch.add_one(token, pos, 0)
        assert model.decode(batch) == 0
    return out, sampling, refusals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--skip-compile", action="store_true")
    parser.add_argument("--skip-tools", action="store_true")
    parser.add_argument(
        "--refusals", type=int, default=2, help="replies per refusal-path figure (0: skip)"
    )
    args = parser.parse_args()
    model_path = args.model or demo_model_path()
    if not args.skip_compile:
        compile_figures(model_path, args.rounds)
    if args.refusals:
        refusal_figures(model_path, args.refusals)
    if args.skip_tools:
        return
    print(
        "\nA forced tool call streamed by llmtrio serve (a 200-240 character argument), "
        "greedy, median, as a streaming HTTP client reads it:"
    )
    for label, template in (("Hermes JSON", None), ("Qwen XML", XML_TEMPLATE)):
        start, first, end = trio.run(call_times, model_path, template, args.rounds)
        print(
            f"  {label:<12} call start {start * 1000:7.0f} ms, first argument byte "
            f"{first * 1000:7.0f} ms, whole call {end * 1000:7.0f} ms "
            f"(first byte at {first / end:.0%} of the call's time)"
        )


if __name__ == "__main__":
    main()
