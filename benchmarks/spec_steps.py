"""Speculation's cost and gain, step by step, side by side in one process (issue 18): two
decode-step cores on two copies of the model, one with ``spec="ngram"`` and one without,
take the same requests, and their steps alternate, so a machine whose load swings (a
shared one) slows both sides alike. Prints, per workload and concurrency, each side's
tokens per second of its own step time, the ratio, and how many tokens the budget drafted.

    .venv/bin/python benchmarks/spec_steps.py [--workloads chat rewrite] [--concurrency 1 8]
        [--max-tokens 96] [--threads 2] [--kv-unified] [--spec-pool ENTRIES] [--ungated]
        [--rounds 1]

``--ungated`` adds a third core, speculation on without its draft gate (every plan the
budget chooses carried out: the default before issue 36), and ``--rounds`` repeats each
workload and concurrency with new requests (the cores, their measured step costs and
their gates, carry on from round to round as a server's would).

Greedy, end of generation suppressed, 8 slots x 1024 tokens (per slot, or one pool with
``--kv-unified``); prompts as ``spec_compare.py`` words them, each led by a number unique
in the run. Tokens per second counts time inside each core's steps only (prefill, drafting,
``llama_decode``, sampling), not HTTP: what the draft budget decides is what moves it. The
ratio of tokens per CPU second of the decode thread follows it: with ``--threads 1``
llama.cpp computes on that thread alone, so that ratio holds under a load that moves the
wall-clock one.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare
from _spec_texts import (
    EXTRACT_RECORDS,
    EXTRACT_SCHEMA,
    REWRITE_TEXTS,
    chat_prompt,
    extract_prompt,
    rewrite_prompt,
)

from llmtrio.engine import EngineConfig, EngineStats, GenerateRequest, demo_model_path
from llmtrio.engine.generate._core import EngineCore
from llmtrio.engine.generate._request_grammar import request_grammar
from llmtrio.engine.generate._step import CoreRequest
from llmtrio.engine.llama import LlamaModel
from llmtrio.engine.spec_decode import plan_drafts

SLOTS = 8
CTX = 1024
DRAFT_MAX = EngineConfig.__attrs_attrs__.spec_draft_max.default  # the engine's default
POOL = EngineConfig.__attrs_attrs__.spec_pool.default


def prompt_text(workload: str, i: int, key: int) -> str:
    """Request ``key``'s prompt (led by its number; an extraction's after the examples all
    share, as spec_compare.py words it)."""
    tag = f"{key}. "
    if workload == "rewrite":
        return tag + rewrite_prompt(REWRITE_TEXTS[i % len(REWRITE_TEXTS)])
    if workload == "extract":
        return extract_prompt(EXTRACT_RECORDS[i % len(EXTRACT_RECORDS)], tag)
    return tag + chat_prompt(compare.PROMPTS[i % len(compare.PROMPTS)])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a GGUF (default: the demo gemma-3-270m)")
    parser.add_argument(
        "--workloads",
        nargs="+",
        default=["chat", "rewrite"],
        choices=["chat", "rewrite", "extract"],
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kv-unified", action="store_true")
    parser.add_argument("--draft-max", type=int, default=DRAFT_MAX, help="--spec-draft-max")
    parser.add_argument("--spec-pool", type=int, default=POOL, help="--spec-pool (0: off)")
    parser.add_argument(
        "--first-text", type=int, default=0, help="the texts a batch asks start at this one"
    )
    parser.add_argument("--ungated", action="store_true", help="add spec without the gate")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    path = args.model or demo_model_path()
    sides = {}
    kinds: list[tuple[str, str | None]] = [("spec", "ngram"), ("no-spec", None)]
    if args.ungated:
        kinds.append(("ungated", "ngram"))
    for name, spec in kinds:
        model = LlamaModel(
            path,
            slots=SLOTS,
            ctx_size=CTX,
            threads=args.threads,
            n_batch=512 + SLOTS * (1 + args.draft_max),
            kv_unified=args.kv_unified,
        )
        config = EngineConfig(
            model=path,
            max_inflight=SLOTS,
            ctx_size=CTX,
            threads=args.threads,
            spec=spec,
            spec_draft_max=args.draft_max,
            spec_pool=args.spec_pool,
            kv_unified=args.kv_unified,
        )
        stats = EngineStats()
        # Speculation without the gate: the budget's plans carried out as chosen.
        plan = plan_drafts if name == "ungated" else None
        sides[name] = (model, EngineCore(model, config, stats, plan=plan), stats)
    layout = "one pool" if args.kv_unified else "per slot"
    print(f"{path.name}, {SLOTS} slots x {CTX} ({layout}), {args.threads} threads, greedy")
    key = 0
    try:
        for workload in args.workloads:
            for n, _ in [(n, r) for n in args.concurrency for r in range(args.rounds)]:
                spent = dict.fromkeys(sides, 0.0)
                cpu = dict.fromkeys(sides, 0.0)
                tokens = dict.fromkeys(sides, 0)
                before = {
                    k: (
                        s.spec_draft_tokens,
                        s.spec_accepted_tokens,
                        s.spec_steps,
                        s.spec_held_steps,
                    )
                    for k, (*_, s) in sides.items()
                }
                for model, core, _ in sides.values():
                    for i in range(n):
                        key += 1
                        text = prompt_text(workload, args.first_text + i, key)
                        prompt = model.tokenize(text, add_special=True)
                        # extract: the schema's grammar ends the reply (spec_compare's (c))
                        extract = workload == "extract"
                        request = GenerateRequest(
                            tokens=list(prompt),
                            max_tokens=args.max_tokens,
                            ignore_eos=not extract,
                            json_schema=EXTRACT_SCHEMA if extract else None,
                        )
                        grammar = request_grammar(request, xml_calls=False, opens_think=False)
                        core.add(
                            CoreRequest(
                                key,
                                np.asarray(prompt, np.int32),
                                request,
                                args.max_tokens,
                                grammar=grammar,
                            )
                        )
                # Alternate the two cores' steps (which goes first alternates too).
                turn = 0
                while any(core.busy for _, core, _ in sides.values()):
                    order = list(sides) if turn % 2 == 0 else list(sides)[::-1]
                    turn += 1
                    for name in order:
                        _, core, _ = sides[name]
                        if not core.busy:
                            continue
                        t0, c0 = time.perf_counter(), time.thread_time()
                        outputs = core.step()
                        spent[name] += time.perf_counter() - t0
                        cpu[name] += time.thread_time() - c0
                        tokens[name] += sum(len(o.tokens) for o in outputs)
                rate = {k: tokens[k] / spent[k] for k in sides}
                per_cpu = {k: tokens[k] / cpu[k] for k in sides}
                _, _, stats = sides["spec"]
                drafted = stats.spec_draft_tokens - before["spec"][0]
                accepted = stats.spec_accepted_tokens - before["spec"][1]
                drafts = stats.spec_steps - before["spec"][2]
                held = stats.spec_held_steps - before["spec"][3]
                acceptance = f"{accepted / drafted:.2f}" if drafted else "-"
                length = f"{accepted / drafts:.1f}" if drafts else "-"
                ungated = ""
                if "ungated" in sides:
                    ungated_stats = sides["ungated"][2]
                    ungated = (
                        f"  ungated {rate['ungated']:7.1f} tok/s"
                        f" x{rate['ungated'] / rate['no-spec']:.2f}"
                        f" drafted {ungated_stats.spec_draft_tokens - before['ungated'][0]:5d}"
                    )
                print(
                    f"{workload:8} N={n:<2} spec {rate['spec']:7.1f} tok/s  "
                    f"no-spec {rate['no-spec']:7.1f} tok/s  "
                    f"spec/no-spec x{rate['spec'] / rate['no-spec']:.2f}"
                    f" (CPU x{per_cpu['spec'] / per_cpu['no-spec']:.2f})"
                    f"  drafted {drafted:5d} accepted {acceptance}"
                    f" mean accepted length {length} held {held}{ungated}",
                    flush=True,
                )
    finally:
        for model, _, _ in sides.values():
            model.close()


if __name__ == "__main__":
    main()
