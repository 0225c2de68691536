"""What prompt lookup can gain at one stream, and how much of it the draft budget takes
(issue 18), without the noise of a shared machine: each workload's greedy replies are
generated once without drafts, then replayed step by step against step costs measured on
this machine (one sequence, ``1 + draft`` positions with logits, medians).

    .venv/bin/python benchmarks/spec_replay.py [--workloads rewrite extract chat]
        [--texts 16] [--max-tokens 160] [--threads 2] [--repeat 5] [--outputs FILE]
        [--costs FILE]

Three drafting policies are replayed over the same replies, each priced with the same
measured costs:

- ``budget``: the engine's own drafter and budget as one stream meets them (``NgramDrafter``,
  under the schema's grammar for extraction; ``Acceptance`` shared by the requests of a
  workload, as a server's are; ``plan_drafts`` on ``StepCosts`` fed each replayed step's
  measured cost; shadow drafts), over the workload's replies twice, the second pass
  measured (a server past its first requests);
- ``oracle length``: the same drafter's proposals, each verified exactly as far as it pays
  knowing the reply (the best any budget could do with this drafter);
- ``oracle occurrence``: every earlier occurrence of the last 1-4 tokens looked at, the one
  whose continuation the reply follows furthest taken, as far as it pays (the best any
  prompt lookup of at most ``--spec-draft-max`` tokens could do).

Each prints decode tokens per second (the first token, which the prompt's step samples,
left out), its ratio to one token a step, the steps, the steps that emitted one token, and
the draft tokens verified and accepted.
A replay assumes a reply with drafts is the reply without: verifying drafts in one batch
can tip a near tie (README), which the servers' figures include and this does not; nor does
it count the Python a step spends outside ``llama_decode`` (a few percent here).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp
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
from llmtrio.engine._constrained import OneToken
from llmtrio.engine._core import EngineCore
from llmtrio.engine._drafting import DraftBudget, judge_shadow
from llmtrio.engine._grammar import request_grammar
from llmtrio.engine._jobs import Job, Part
from llmtrio.engine._llama import Batch, LlamaModel
from llmtrio.engine._spec import Acceptance, NgramDrafter, Shape, plan_drafts
from llmtrio.engine._step import CoreRequest

DRAFT_MAX = int(EngineConfig.__attrs_attrs__.spec_draft_max.default)
MAX_N = 4  # NgramDrafter's longest n-gram
SLOTS = 1
CTX = 2048


@dataclass
class Reply:
    workload: str
    prompt: list[int]
    output: list[int]
    max_tokens: int


def request_of(model: LlamaModel, workload: str, i: int, max_tokens: int) -> GenerateRequest:
    """The request for the workload's text ``i``, as ``spec_compare.py`` asks it
    (extraction under the schema, at most 200 tokens; the others with end of generation
    banned)."""
    tag = f"Request replay-{i}.\n"
    if workload == "extract":
        text = extract_prompt(EXTRACT_RECORDS[i % len(EXTRACT_RECORDS)], tag)
        prompt = model.tokenize(text, add_special=True)
        return GenerateRequest(tokens=prompt, max_tokens=200, json_schema=EXTRACT_SCHEMA)
    if workload == "rewrite":
        text = tag + rewrite_prompt(REWRITE_TEXTS[i % len(REWRITE_TEXTS)])
    else:
        text = tag + chat_prompt(compare.PROMPTS[i % len(compare.PROMPTS)])
    prompt = model.tokenize(text, add_special=True)
    return GenerateRequest(tokens=prompt, max_tokens=max_tokens, ignore_eos=True)


def generate(model: LlamaModel, path: Path, args: argparse.Namespace) -> list[Reply]:
    """Every workload's greedy replies, one request at a time, no drafts."""
    config = EngineConfig(model=path, max_inflight=SLOTS, ctx_size=CTX, spec=None)
    core = EngineCore(model, config, EngineStats())
    replies = []
    for workload in args.workloads:
        for i in range(args.texts):
            request = request_of(model, workload, i, args.max_tokens)
            prompt = list(request.tokens)
            grammar = request_grammar(request, xml_calls=False, opens_think=False)
            core.add(
                CoreRequest(
                    i,
                    np.asarray(prompt, np.int32),
                    request,
                    request.max_tokens,
                    grammar=grammar,
                )
            )
            output: list[int] = []
            while core.busy:
                for out in core.step():
                    output += out.tokens
            replies.append(Reply(workload, prompt, output, request.max_tokens))
    return replies


def step_costs(model: LlamaModel, context: int, repeat: int) -> list[float]:
    """The median ms of ``llama_decode`` of one sequence holding ``context`` tokens, with
    ``n`` positions with logits, for ``n`` = 1 .. ``DRAFT_MAX + 1`` (index ``n``)."""
    sentence = model.tokenize(" The sea is salt water over most of the earth.", add_special=False)
    prompt = np.resize(np.asarray(sentence, np.int32), context)
    batch = Batch(max(context, DRAFT_MAX + 1))
    model.forget(0)  # what generating the replies left there
    batch.add(prompt, 0, 0, output_last=True)
    if model.decode(batch) != 0:
        raise SystemExit("prompt decode failed")
    times: list[list[float]] = [[] for _ in range(DRAFT_MAX + 2)]
    for _ in range(repeat):
        for n in range(1, DRAFT_MAX + 2):
            batch.clear()
            batch.add(np.full(n, 100, np.int32), context, 0, output_last=True, output_all=True)
            t0 = time.perf_counter()
            if model.decode(batch) != 0:
                raise SystemExit("decode failed")
            times[n].append((time.perf_counter() - t0) * 1000)
            model.forget(0, context)
    model.forget(0)
    return [statistics.median(t) if t else 0.0 for t in times]


class Walk:
    """A reply's grammar (extraction's schema) walked along the reply: how many tokens of
    a draft it takes from where the reply is (``NgramDrafter``'s ``fits``)."""

    def __init__(self, model: LlamaModel, request: GenerateRequest) -> None:
        grammar = request_grammar(request, xml_calls=False, opens_think=False)
        assert grammar is not None
        self.grammar = grammar
        self._model = model
        self._grammar: Any = model.grammars.new(grammar.text)
        self._one = OneToken()

    def fits(self, tokens: Sequence[int]) -> int:
        clone = llama_cpp.llama_sampler_clone(self._grammar)
        try:
            for i, token in enumerate(tokens):
                if not self._one.allowed(clone, token):
                    return i
                if token in self._model.eog:
                    return i + 1
                llama_cpp.llama_sampler_accept(clone, token)
            return len(tokens)
        finally:
            llama_cpp.llama_sampler_free(clone)

    def accept(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            llama_cpp.llama_sampler_accept(self._grammar, token)

    def close(self) -> None:
        llama_cpp.llama_sampler_free(self._grammar)


@dataclass
class Tally:
    ms: float = 0.0
    steps: int = 0
    ones: int = 0
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0

    def step(self, ms: float, drafted: int, emitted: int) -> None:
        self.ms += ms
        self.steps += 1
        self.ones += emitted == 1
        self.tokens += emitted
        self.drafted += drafted
        self.accepted += emitted - 1

    @property
    def rate(self) -> float:
        return self.tokens / self.ms * 1000 if self.ms else float("nan")


def right(draft: Sequence[int], reply: Sequence[int], at: int) -> int:
    """How many of ``draft``'s tokens the reply has from ``at`` on."""
    n = 0
    while n < len(draft) and at + n < len(reply) and draft[n] == reply[at + n]:
        n += 1
    return n


def paying(costs: Sequence[float], right: int) -> int:
    """The draft length an oracle verifies: the most tokens per ms, knowing ``right``."""
    return max(range(right + 1), key=lambda k: (k + 1) / costs[k + 1])


def replay(
    replies: Sequence[Reply],
    costs: Sequence[float],
    policy: str,
    walks: Callable[[Reply], Walk | None],
    model: LlamaModel,
    config: EngineConfig,
) -> Tally:
    """Replay ``replies`` under ``policy``; the budget's is the engine's own
    (``DraftBudget``, with the bookkeeping the core does after each step)."""
    budget = DraftBudget(model, config, model.n_batch, plan_drafts)
    tally = Tally()
    # The budget's rates and costs are learned: its first pass over the replies warms
    # them, the second is measured.
    for _ in range(2 if policy == "budget" else 1):
        tally = Tally()
        for key, reply in enumerate(replies):
            walk = walks(reply)
            out = reply.output
            history = reply.prompt + out[:1]
            if walk is not None:
                walk.accept(out[:1])
            request = CoreRequest(
                key,
                np.asarray(reply.prompt, np.int32),
                GenerateRequest(tokens=reply.prompt, max_tokens=reply.max_tokens),
                reply.max_tokens,
                grammar=walk.grammar if walk is not None else None,
            )
            job = Job(request, seq=0, pos=len(reply.prompt), generated=1)
            job.acceptance = Acceptance(shared=budget.shared(request))
            job.drafter = NgramDrafter(history, fits=walk.fits if walk else None)
            job.drafts_fit = walk is not None
            at = 1
            while at < len(out):
                limit = min(DRAFT_MAX, reply.max_tokens - at - 1)
                if policy == "oracle occurrence":
                    count = paying(costs, min(limit, best_occurrence(history, out, at)))
                    draft, match = out[at : at + count], 0
                elif policy == "oracle length":
                    draft, match = job.drafter.propose(limit) if limit > 0 else ([], 0)
                    draft = draft[: paying(costs, right(draft, out, at))]
                else:
                    part = Part(job, None, 1, 0)
                    budget.draft([part], [])
                    draft, match = part.draft, part.match
                emitted = out[at : at + right(draft, out, at) + 1]
                ms = costs[1 + len(draft)]
                tally.step(ms, len(draft), len(emitted))
                if policy == "budget":
                    budget.costs.measured(
                        ms, outputs=1 + len(draft), shape=Shape.of([1 + len(draft)])
                    )
                    if draft:
                        job.acceptance.verified(match, len(draft), len(emitted) - 1)
                    if job.shadow:
                        judge_shadow(job, emitted)
                job.drafter.extend(emitted)
                job.generated += len(emitted)
                job.pos += len(emitted)
                history += emitted
                if walk is not None:
                    walk.accept(emitted)
                at += len(emitted)
            if walk is not None:
                walk.close()
    return tally


def best_occurrence(history: Sequence[int], out: Sequence[int], at: int) -> int:
    """How far the reply from ``at`` follows the continuation of the earlier occurrence of
    its last 1..``MAX_N`` tokens that it follows furthest."""
    best = 0
    for n in range(1, MAX_N + 1):
        gram = list(history[-n:])
        for start in range(n, len(history)):
            if history[start - n : start] == gram:
                best = max(best, right(history[start : start + DRAFT_MAX], out, at))
    return best


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a GGUF (default: the demo gemma-3-270m)")
    parser.add_argument(
        "--workloads",
        nargs="+",
        default=["rewrite", "extract", "chat"],
        choices=["chat", "rewrite", "extract"],
    )
    parser.add_argument("--texts", type=int, default=16, help="requests per workload")
    parser.add_argument("--max-tokens", type=int, default=160, help="rewrite's and chat's")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5, help="measurements of each cost")
    parser.add_argument("--context", type=int, default=500, help="tokens the costed sequence holds")
    parser.add_argument(
        "--outputs",
        type=Path,
        help="keep the replies in this JSON file: read them from it when it exists",
    )
    parser.add_argument(
        "--costs",
        type=Path,
        help="keep the measured step costs in this JSON file: read them from it when it "
        "exists (to compare budgets on the same costs)",
    )
    args = parser.parse_args(argv)
    path = args.model or demo_model_path()
    model = LlamaModel(
        path, slots=SLOTS, ctx_size=CTX, threads=args.threads, n_batch=max(512, args.context)
    )
    try:
        if args.outputs and args.outputs.exists():
            replies = [Reply(**r) for r in json.loads(args.outputs.read_text())]
            replies = [r for r in replies if r.workload in args.workloads]
        else:
            replies = generate(model, path, args)
            if args.outputs:
                args.outputs.write_text(json.dumps([r.__dict__ for r in replies]))
        if args.costs and args.costs.exists():
            costs = json.loads(args.costs.read_text())
        else:
            costs = step_costs(model, args.context, args.repeat)
            if args.costs:
                args.costs.write_text(json.dumps(costs))
        print(
            f"{path.name}, {args.threads} threads, one sequence holding {args.context} tokens;"
            f" ms a step of 1, 2, 4, 8, 16, {DRAFT_MAX + 1} positions: "
            + ", ".join(f"{costs[n]:.1f}" for n in (1, 2, 4, 8, 16, DRAFT_MAX + 1))
        )

        config = EngineConfig(model=path, max_inflight=SLOTS, ctx_size=CTX, spec="ngram")

        def walks(reply: Reply) -> Walk | None:
            if reply.workload != "extract":
                return None
            return Walk(model, GenerateRequest(tokens=reply.prompt, json_schema=EXTRACT_SCHEMA))

        for workload in args.workloads:
            mine = [r for r in replies if r.workload == workload]
            tokens = sum(len(r.output) - 1 for r in mine)
            plain = 1000 / costs[1]
            print(f"\n{workload}: {len(mine)} replies, {tokens} tokens after the first")
            print(f"  {'one token a step':20} {plain:7.1f} tok/s")
            for policy in ("budget", "oracle length", "oracle occurrence"):
                t = replay(mine, costs, policy, walks, model, config)
                print(
                    f"  {policy:20} {t.rate:7.1f} tok/s  x{t.rate / plain:.2f}  steps {t.steps:5d}"
                    f"  one-token {t.ones:5d} ({t.ones / t.steps:.0%} of the steps)"
                    f"  drafted {t.drafted:5d} accepted {t.accepted:5d}"
                )
    finally:
        model.close()


if __name__ == "__main__":
    main()
