"""What prompt lookup can gain at one stream, and how much of it the draft budget takes
(issue 18), without the noise of a shared machine: each workload's greedy replies are
generated once without drafts, then replayed step by step against step costs measured on
this machine (one sequence holding as many tokens as the workload's replies do halfway,
``1 + draft`` positions with logits, the least of a few measurements).

    .venv/bin/python benchmarks/spec_replay.py [--workloads rewrite extract chat]
        [--texts 16] [--max-tokens 160] [--threads 2] [--repeat 15] [--context N]
        [--outputs FILE] [--costs FILE]

The same replies are replayed under four policies, each priced with the same costs:

- ``plain``: no drafts, one token a step (the figures' base);
- ``budget``: the engine's own ``DraftBudget`` for one decoding sequence, with the
  bookkeeping the core does after each step (its drafter ``NgramDrafter``, under the
  schema's grammar for extraction; ``Acceptance`` shared by the requests of a workload, as
  a server's are; ``StepCosts`` fed each replayed step's cost; shadow drafts), over the
  workload's replies twice, the second pass counted (a server past its first requests);
- ``oracle length``: drafts that are, at each position, a prefix of what the same drafter
  proposes there, their lengths chosen knowing the reply for the least time over the whole
  reply (the best any budget can do with this drafter);
- ``oracle occurrence``: the same, a draft being a prefix of the continuation of any
  earlier occurrence of the last token (so of the last 1-4: the best any prompt lookup of
  at most ``--spec-draft-max`` tokens can do).

Each prints decode tokens per second (the first token, which the prompt's step samples,
left out; a reply that stopped pays the step that sampled its end), the ratio to
``plain``, the steps, those that emitted one token, and the draft tokens verified and
accepted. A replay assumes a reply with drafts is the reply without: verifying drafts in
one batch can tip a near tie (README), which the servers' figures include and this does
not; nor does it count sampling or the Python a step spends outside ``llama_decode``
(drafting under a grammar: about 0.7 ms a step at one stream here, 3.5% of a drafting
step). ``--outputs`` and ``--costs`` keep the replies and costs, so that two budgets can be
compared on the same ones (costs are kept per workload, with the settings they were
measured with).
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
from llmtrio.engine.generate._core import EngineCore
from llmtrio.engine.generate._drafting import DraftBudget, judge_shadow, spec_draft_limit
from llmtrio.engine.generate._jobs import Job, Part
from llmtrio.engine.generate._request_grammar import request_grammar
from llmtrio.engine.generate._step import CoreRequest
from llmtrio.engine.llama import Batch, LlamaModel
from llmtrio.engine.llama._constrained import OneToken
from llmtrio.engine.spec_decode import Acceptance, NgramDrafter, Shape, plan_drafts

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
    """The ms of ``llama_decode`` of one sequence holding ``context`` tokens, with ``n``
    positions with logits, for ``n`` = 1 .. ``DRAFT_MAX + 1`` (index ``n``): the least of
    ``repeat`` measurements (another process on the machine only adds time)."""
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
    return [min(t) if t else 0.0 for t in times]


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
        return self._one.taken(self._grammar, tokens, self._model.eog)

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

    def step(self, ms: float, drafted: int, right: int) -> None:
        """A step that verified ``drafted`` draft tokens, ``right`` of them right: it emits
        ``right + 1`` tokens."""
        self.ms += ms
        self.steps += 1
        self.ones += right == 0
        self.tokens += right + 1
        self.drafted += drafted
        self.accepted += right

    def end(self, ms: float) -> None:
        """The step that samples the end of generation (a reply that stopped): it emits
        nothing the reply counts."""
        self.ms += ms
        self.steps += 1

    @property
    def rate(self) -> float:
        return self.tokens / self.ms * 1000 if self.ms else float("nan")


def right(draft: Sequence[int], reply: Sequence[int], at: int) -> int:
    """How many of ``draft``'s tokens the reply has from ``at`` on."""
    n = 0
    while n < len(draft) and at + n < len(reply) and draft[n] == reply[at + n]:
        n += 1
    return n


def stopped(reply: Reply) -> bool:
    """Whether the reply ended before its limit (a step sampled its end of generation)."""
    return len(reply.output) < reply.max_tokens


def replay(
    replies: Sequence[Reply],
    costs: Sequence[float],
    policy: str,
    walks: Callable[[Reply], Walk | None],
    model: LlamaModel,
    config: EngineConfig,
) -> Tally:
    """Replay ``replies`` under ``policy``: ``plain`` (no drafts), ``budget`` (the engine's
    own ``DraftBudget``, with the bookkeeping the core does after each step), or an oracle
    (:func:`oracle`)."""
    if policy.startswith("oracle"):
        tally = Tally()
        for reply in replies:
            oracle(reply, costs, policy, walks(reply), tally)
        return tally
    budget = DraftBudget(model, config, model.n_batch, plan_drafts)
    tally = Tally()
    # The budget's rates and costs are learned: its first pass over the replies warms
    # them, the second is measured.
    for _ in range(2 if policy == "budget" else 1):
        tally = Tally()
        for key, reply in enumerate(replies):
            walk = walks(reply)
            out = reply.output
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
            job.drafter = NgramDrafter(reply.prompt + out[:1], fits=walk.fits if walk else None)
            job.drafts_fit = walk is not None
            at = 1
            while at < len(out):
                draft: list[int] = []
                if policy == "budget":
                    part = Part(job, None, 1, 0)
                    budget.draft([part], [])
                    draft = part.draft
                ok = right(draft, out, at)
                emitted = out[at : at + ok + 1]
                ms = costs[1 + len(draft)]
                tally.step(ms, len(draft), ok)
                if policy == "budget":
                    budget.costs.measured(
                        ms, outputs=1 + len(draft), shape=Shape.of([1 + len(draft)])
                    )
                    if draft:
                        job.acceptance.verified(part.match, len(draft), ok)
                    if job.shadow:
                        judge_shadow(job, emitted)
                job.drafter.extend(emitted)
                job.generated += len(emitted)
                job.pos += len(emitted)
                if walk is not None:
                    walk.accept(emitted)
                at += len(emitted)
            if stopped(reply):
                tally.end(costs[1])
            if walk is not None:
                walk.close()
    return tally


def oracle(
    reply: Reply, costs: Sequence[float], policy: str, walk: Walk | None, tally: Tally
) -> None:
    """The fastest replay of ``reply`` whose drafts are, at each position, a prefix of the
    drafter's proposal there (``oracle length``) or of the continuation of an earlier
    occurrence of the last 1..``MAX_N`` tokens (``oracle occurrence``), each at most
    ``DRAFT_MAX`` tokens: what a draft at a position can be depends only on the tokens
    before it, so the best lengths are one pass backwards over the positions."""
    out = reply.output
    history = reply.prompt + out[:1]
    # Only the drafter's proposals need it and the grammar it walks.
    drafter = None
    if policy == "oracle length":
        drafter = NgramDrafter(history, fits=walk.fits if walk else None)
        if walk is not None:
            walk.accept(out[:1])
    # reach[at]: how far the reply from ``at`` follows the best draft there.
    reach = [0] * len(out)
    for at in range(1, len(out)):
        limit = min(DRAFT_MAX, reply.max_tokens - at - 1)
        if limit > 0 and drafter is None:
            reach[at] = min(limit, best_occurrence(history, out, at))
        elif limit > 0 and drafter is not None:
            reach[at] = right(drafter.propose(limit)[0], out, at)
        if drafter is not None:
            drafter.extend(out[at : at + 1])
            if walk is not None:
                walk.accept(out[at : at + 1])
        history.append(out[at])
    if walk is not None:
        walk.close()
    # best[at]: the least ms from ``at`` to the reply's end, and the draft length for it.
    best = [0.0] * (len(out) + 1)
    take = [0] * len(out)
    for at in range(len(out) - 1, 0, -1):
        options = range(min(reach[at], len(out) - at - 1) + 1)
        take[at] = min(options, key=lambda k: costs[k + 1] + best[at + k + 1])
        best[at] = costs[take[at] + 1] + best[at + take[at] + 1]
    at = 1
    while at < len(out):
        tally.step(costs[take[at] + 1], take[at], take[at])
        at += take[at] + 1
    if stopped(reply):
        tally.end(costs[1])


def best_occurrence(history: Sequence[int], out: Sequence[int], at: int) -> int:
    """How far the reply from ``at`` follows the continuation of the earlier occurrence of
    its last tokens that it follows furthest (an occurrence of the last 2..``MAX_N`` tokens
    is one of the last token: the 1-gram's are all of them)."""
    last = history[-1]
    return max(
        (
            right(history[start : start + DRAFT_MAX], out, at)
            for start in range(1, len(history))
            if history[start - 1] == last
        ),
        default=0,
    )


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
    parser.add_argument("--repeat", type=int, default=15, help="measurements of each cost")
    parser.add_argument(
        "--context",
        type=int,
        default=0,
        help="tokens the costed sequence holds (default: each workload's middle position, "
        "the median over its replies of the prompt and half the reply)",
    )
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
    model = LlamaModel(path, slots=SLOTS, ctx_size=CTX, threads=args.threads, n_batch=CTX)
    settings = {"model": path.name, "threads": args.threads, "context": args.context}
    try:
        config = EngineConfig(model=path, max_inflight=SLOTS, ctx_size=CTX, spec="ngram")
        if spec_draft_limit(model, config) < DRAFT_MAX:
            raise SystemExit(f"{path.name}: its memory cannot take {DRAFT_MAX} drafts back")
        if args.outputs and args.outputs.exists():
            replies = [Reply(**r) for r in json.loads(args.outputs.read_text())]
        else:
            replies = generate(model, path, args)
            if args.outputs:
                args.outputs.write_text(json.dumps([r.__dict__ for r in replies]))
        kept = json.loads(args.costs.read_text()) if args.costs and args.costs.exists() else {}
        if kept and (not isinstance(kept, dict) or kept.get("settings") != settings):
            raise SystemExit(f"{args.costs}: not measured with {settings}")
        costs: dict[str, list[float]] = kept.get("costs", {})

        def walks(reply: Reply) -> Walk | None:
            if reply.workload != "extract":
                return None
            return Walk(model, GenerateRequest(tokens=reply.prompt, json_schema=EXTRACT_SCHEMA))

        print(f"{path.name}, {args.threads} threads, one sequence")
        for workload in args.workloads:
            mine = [r for r in replies if r.workload == workload]
            if not mine:
                print(f"\n{workload}: no replies in {args.outputs}")
                continue
            middle = statistics.median_low(len(r.prompt) + len(r.output) // 2 for r in mine)
            context = args.context or middle
            if workload not in costs:
                costs[workload] = step_costs(model, context, args.repeat)
            cost = costs[workload]
            tokens = sum(len(r.output) - 1 for r in mine)
            print(
                f"\n{workload}: {len(mine)} replies, {tokens} tokens after the first; a step of 1,"
                f" 2, 4, 8, 16, {DRAFT_MAX + 1} positions at {context} tokens held: "
                + ", ".join(f"{cost[n]:.1f}" for n in (1, 2, 4, 8, 16, DRAFT_MAX + 1))
                + " ms"
            )
            plain = replay(mine, cost, "plain", walks, model, config)
            for policy in ("plain", "budget", "oracle length", "oracle occurrence"):
                t = plain if policy == "plain" else replay(mine, cost, policy, walks, model, config)
                print(
                    f"  {policy:18} {t.rate:6.1f} tok/s x{t.rate / plain.rate:.2f}"
                    f"  steps {t.steps:5d}, one-token {t.ones:5d} ({t.ones / t.steps:.0%})"
                    f"  drafted {t.drafted:5d} accepted {t.accepted:5d}"
                )
        if args.costs:
            args.costs.write_text(json.dumps({"settings": settings, "costs": costs}))
    finally:
        model.close()


if __name__ == "__main__":
    main()
