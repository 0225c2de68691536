"""The scheduler's policy against llama-server's, simulated (issue 48): AIPerf's closed loop
(each of ``--users`` users sends its next request as soon as the last one ends) run through
llmtrio's real :class:`Scheduler` and through a model of llama-server's batching, on a step
cost model, with no model and no threads. What a policy does to time to first token,
inter-token latency and throughput, in seconds of CPU time instead of hours of benchmarks.

    .venv/bin/python benchmarks/itl_sim.py [--users 1 8 32] [--prompt-tokens 209 2009]
        [--output-tokens 64] [--requests-per-user 6] [--shares inf 4 1 0.25]
        [--decode-ms 35 14] [--token-ms 5.5] [--chunk 256] [--n-batch 2048]
        [--rate PER_S] [--stagger MS] [--noise SIGMA]

The cost model: a step takes ``a + b * n`` ms for ``n`` sequences decoding (``--decode-ms a
b``) plus ``--token-ms`` for each prompt token in it (``benchmarks/mixed_steps.py`` measures
both: gemma-3-270m, one thread, on the 2-core EPYC AVX2, under load, 2026-12-07: 35 + 14 n,
5.5 ms a prompt token). The scheduler is fed these step times as the engine feeds it
measured ones. llama-server's model: every step decodes every slot past its prompt and
adds waiting prompts' tokens, oldest first, up to ``--n-batch`` tokens in all (its default
``-b 2048``; one ``llama_decode``); a prompt's first token comes with the step its last token
is in.

The figures are AIPerf's: TTFT from the request sent to its first token; ITL per request,
``(latency - TTFT) / (output tokens - 1)``; the gap p99, over every gap between two tokens of
any stream; throughput, all output tokens over the run.
"""

from __future__ import annotations

import argparse
import heapq
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from llmtrio.engine.generate._scheduler import Scheduler


@dataclass
class Request:
    key: int
    prompt: int
    sent: float
    prefilled: int = 0
    tokens: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Costs:
    base_ms: float
    per_seq_ms: float
    token_ms: float
    #: Each step's time times a log-normal factor of this spread (a shared machine).
    noise: float = 0.0
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(1))

    def step(self, decoding: int, prompt_tokens: int) -> float:
        if not decoding and not prompt_tokens:
            return 0.0
        ms = self.base_ms + self.per_seq_ms * decoding + self.token_ms * prompt_tokens
        return ms * float(self.rng.lognormal(0.0, self.noise)) if self.noise else ms


#: One policy step: the live requests in -> (decoding keys, {key: prompt tokens}).
Plan = Callable[[dict[int, Request]], tuple[list[int], dict[int, int]]]


def llmtrio_plan(scheduler: Scheduler) -> Plan:
    def plan(live: dict[int, Request]) -> tuple[list[int], dict[int, int]]:
        step = scheduler.schedule()
        return list(step.decode), {p.key: p.count for p in step.prefill}

    return plan


def llama_server_plan(slots: int, n_batch: int) -> Plan:
    def plan(live: dict[int, Request]) -> tuple[list[int], dict[int, int]]:
        running = sorted(live.values(), key=lambda r: r.key)[:slots]
        decoding = [r.key for r in running if r.prefilled >= r.prompt]
        room = n_batch - len(decoding)
        chunks: dict[int, int] = {}
        for r in running:
            left = r.prompt - r.prefilled
            if left > 0 and room > 0:
                chunks[r.key] = min(left, room)
                room -= chunks[r.key]
        return decoding, chunks

    return plan


def simulate(
    plan: Plan,
    costs: Costs,
    *,
    users: int,
    prompt: int,
    output: int,
    requests: int,
    scheduler: Scheduler | None = None,
    rate: float = 0.0,
    stagger: float = 0.0,
) -> dict[str, float]:
    """Run the closed loop (or, with ``rate``, Poisson arrivals at ``rate`` a second into
    ``users`` slots) to the end; AIPerf's figures (ms, tok/s)."""
    now = 0.0
    live: dict[int, Request] = {}
    done: list[Request] = []
    sent = 0
    arrivals: list[tuple[float, int]] = []  # (time, user)
    if rate:
        gaps = np.random.default_rng(1).exponential(1 / rate, size=requests)
        for at in np.cumsum(gaps):
            heapq.heappush(arrivals, (float(at), 0))
    else:
        for user in range(users):
            heapq.heappush(arrivals, (user * stagger, user))
    while len(done) < requests:
        while arrivals and arrivals[0][0] <= now and sent < requests:
            at, _ = heapq.heappop(arrivals)
            request = Request(sent, prompt, at)
            live[sent] = request
            if scheduler is not None:
                scheduler.add(sent, prompt)
            sent += 1
        if not live:
            now = arrivals[0][0]
            continue
        decoding, chunks = plan(live)
        ms = costs.step(len(decoding), sum(chunks.values()))
        if ms == 0.0:
            now = arrivals[0][0] if arrivals else now
            continue
        now += ms / 1000
        if scheduler is not None:
            scheduler.measured(ms, decode_only=not chunks, prompt_tokens=sum(chunks.values()))
        for key, count in chunks.items():
            request = live[key]
            request.prefilled += count
            if request.prefilled >= request.prompt:
                request.tokens.append(now)  # the first token comes with the last chunk
        for key in decoding:
            live[key].tokens.append(now)
        for key in [k for k, r in live.items() if len(r.tokens) >= output]:
            request = live.pop(key)
            done.append(request)
            if scheduler is not None:
                scheduler.remove(key)
            if not rate:
                heapq.heappush(arrivals, (now + 0.002, 0))  # the client's turnaround
    ttft = [(r.tokens[0] - r.sent) * 1000 for r in done]
    itl = [(r.tokens[-1] - r.tokens[0]) * 1000 / (len(r.tokens) - 1) for r in done]
    gaps = [(b - a) * 1000 for r in done for a, b in zip(r.tokens, r.tokens[1:], strict=False)]
    span = max(r.tokens[-1] for r in done) - min(r.sent for r in done)
    return {
        "tok/s": sum(len(r.tokens) for r in done) / span,
        "TTFT p50": statistics.median(ttft),
        "TTFT mean": statistics.fmean(ttft),
        "ITL mean": statistics.fmean(itl),
        "ITL p99": float(np.percentile(itl, 99)),
        "gap p99": float(np.percentile(gaps, 99)),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[209, 2009])
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--requests-per-user", type=int, default=6)
    parser.add_argument("--shares", type=float, nargs="+", default=[math.inf, 4, 1, 0.25])
    parser.add_argument("--decode-ms", type=float, nargs=2, default=[35.0, 14.0])
    parser.add_argument("--token-ms", type=float, default=5.5)
    parser.add_argument("--chunk", type=int, default=256, help="llmtrio's --prefill-chunk")
    parser.add_argument("--n-batch", type=int, default=2048, help="llama-server's -b")
    parser.add_argument(
        "--rate", type=float, default=0.0, help="open loop: Poisson arrivals a second"
    )
    parser.add_argument("--noise", type=float, default=0.0, help="step time spread (log)")
    parser.add_argument(
        "--stagger", type=float, default=0.0, help="closed loop: user i starts at i x MS ms"
    )
    args = parser.parse_args(argv)
    costs = Costs(args.decode_ms[0], args.decode_ms[1], args.token_ms, args.noise)
    labels = ("tok/s", "TTFT p50", "TTFT mean", "ITL mean", "ITL p99", "gap p99")
    print(
        f"cost model: {costs.base_ms} + {costs.per_seq_ms} n ms a step, {costs.token_ms} ms a "
        f"prompt token; llmtrio --prefill-chunk {args.chunk}, llama-server -b {args.n_batch}"
    )
    for prompt in args.prompt_tokens:
        for users in args.users:
            common = {
                "users": users,
                "prompt": prompt,
                "output": args.output_tokens,
                "requests": users * args.requests_per_user,
                "rate": args.rate,
                "stagger": args.stagger / 1000,
            }
            server = simulate(llama_server_plan(users, args.n_batch), costs, **common)
            print(f"\n{users} users, {prompt}-token prompts")
            print(f"{'':22}" + "".join(f"{label:>11}" for label in labels))
            print(f"{'llama-server':22}" + "".join(f"{server[k]:11.1f}" for k in labels))
            for share in args.shares:
                scheduler = Scheduler(users, args.chunk, prefill_share=share)
                result = simulate(llmtrio_plan(scheduler), costs, scheduler=scheduler, **common)
                ratios = "".join(f"{result[k] / server[k]:10.2f}x" for k in labels)
                print(f"{'llmtrio share ' + str(share):22}" + ratios)


if __name__ == "__main__":
    main()
