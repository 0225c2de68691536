"""Where a decode step's time goes in the core, against a raw ``llama_decode`` of the same
batch (issue 36): every measured step of the core is replayed at once, raw, on the same
context (each sequence's memory cut back to the batch's first position, the batch decoded
again from a copy, the memory cut back to where the core left it), so the two are paired
step by step under whatever load the machine has; and the core's step is split into its
phases by timers wrapped around its parts.

    .venv/bin/python benchmarks/step_profile.py [--slots 8] [--draft 1] [--steps 40]
        [--threads 1] [--mode forced|ngram|off|nospec]

``--mode forced``: every sequence carries exactly ``--draft`` draft tokens a step (a drafter
that repeats the last token; the plan takes them all), so the step's shape is fixed
(``--slots`` x ``1 + --draft``). ``ngram``: the engine's own drafter and budget on rewriting
prompts. ``off``: speculation on (its ``n_batch``), the plan never drafting. ``nospec``: the
core as ``--no-spec`` builds it. Each figure is a median over the steps (wall ms, and the
CPU ms of the decode thread, ``time.thread_time``: llama.cpp's first compute thread is the
caller's), with the spread (25th-75th percentile).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _spec_texts import REWRITE_TEXTS, rewrite_prompt

from llmtrio.engine import EngineConfig, EngineStats, GenerateRequest, demo_model_path
from llmtrio.engine.generate._core import EngineCore
from llmtrio.engine.generate._engine import context_params
from llmtrio.engine.generate._step import CoreRequest
from llmtrio.engine.llama import Batch, LlamaModel
from llmtrio.engine.spec_decode import plan_drafts

CTX = 1024


class RepeatDrafter:
    """Proposes the last token ``n`` times (mostly wrong: every step cuts its drafts)."""

    def __init__(self, tokens: list[int], n: int) -> None:
        self._last = tokens[-1]
        self._n = n

    def extend(self, tokens: Sequence[int]) -> None:
        if tokens:
            self._last = tokens[-1]

    def propose(self, limit: int) -> tuple[list[int], int]:
        return [self._last] * min(self._n, limit), 1


class Timers:
    """Wall and thread-CPU seconds per named phase, per step."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def wrap(self, obj: Any, attr: str, name: str) -> None:
        inner: Callable[..., Any] = getattr(obj, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            w0, c0 = time.perf_counter(), time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - w0
                self.cpu[name] = self.cpu.get(name, 0.0) + time.thread_time() - c0
                self.calls[name] = self.calls.get(name, 0) + 1

        setattr(obj, attr, timed)

    def take(self) -> tuple[dict[str, float], dict[str, float], dict[str, int]]:
        out = (self.wall, self.cpu, self.calls)
        self.wall, self.cpu, self.calls = {}, {}, {}
        return out


def q(values: Sequence[float]) -> str:
    """Median and interquartile range, in ms."""
    if not values:
        return "-"
    ms = sorted(v * 1000 for v in values)
    lo, hi = ms[len(ms) // 4], ms[(3 * len(ms)) // 4]
    return f"{statistics.median(ms):7.2f} ({lo:.2f}-{hi:.2f})"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--draft", type=int, default=1)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--mode", choices=["forced", "ngram", "off", "nospec"], default="forced")
    parser.add_argument("--no-replay", action="store_true", help="no raw replay")
    args = parser.parse_args(argv)
    path = args.model or demo_model_path()
    spec = None if args.mode == "nospec" else "ngram"
    config = EngineConfig(
        model=path, max_inflight=args.slots, ctx_size=CTX, threads=args.threads, spec=spec
    )
    n_batch, _ = context_params(config)  # gemma: attention only, no recurrent snapshots
    model = LlamaModel(path, slots=args.slots, ctx_size=CTX, threads=args.threads, n_batch=n_batch)
    drafter: Callable[[list[int]], Any] | None = None
    plan: Callable[..., list[int]] = plan_drafts
    if args.mode == "forced":
        drafter = lambda tokens: RepeatDrafter(tokens, args.draft)  # noqa: E731
        plan = lambda candidates, costs, **_: [c.tokens for c in candidates]  # noqa: E731
    elif args.mode == "off":
        plan = lambda candidates, costs, **_: [0] * len(candidates)  # noqa: E731
    core = EngineCore(model, config, EngineStats(), drafter=drafter, plan=plan)
    timers = Timers()
    captured: list[tuple[np.ndarray, ...]] = []
    raw_decode = model.decode

    def decode(batch: Batch) -> int:
        n = batch.n
        captured.append(
            (
                batch.token[:n].copy(),
                batch.pos[:n].copy(),
                batch.seq[:n].copy(),
                batch.logits[:n].copy(),
            )
        )
        return raw_decode(batch)

    model.decode = decode  # type: ignore[method-assign]
    timers.wrap(model, "decode", "llama_decode")
    timers.wrap(model, "forget", "memory_seq_rm")
    timers.wrap(core._drafts, "draft", "draft (propose + plan)")
    timers.wrap(core._drafts, "micro_batches", "micro_batches")
    timers.wrap(core, "_verify", "verify (sample + cut)")
    timers.wrap(core, "_advance", "advance")
    for i in range(args.slots):
        key = i + 1
        text = f"{key}. " + rewrite_prompt(REWRITE_TEXTS[i % len(REWRITE_TEXTS)])
        prompt = model.tokenize(text, add_special=True)
        request = GenerateRequest(tokens=prompt, max_tokens=10_000, ignore_eos=True)
        core.add(CoreRequest(key, np.asarray(prompt, np.int32), request, 10_000))
    # Until every sequence decodes (prompts ingested, the first token out), and a few more.
    while any(job.generated == 0 for job in core._jobs.values()):
        core.step()
    for _ in range(5):
        core.step()
    timers.take()
    replay = Batch(n_batch)
    rows: dict[str, list[float]] = {}
    cpu_rows: dict[str, list[float]] = {}
    shapes: dict[tuple[int, ...], int] = {}
    for _ in range(args.steps):
        captured.clear()
        w0, c0 = time.perf_counter(), time.thread_time()
        core.step()
        step_wall, step_cpu = time.perf_counter() - w0, time.thread_time() - c0
        wall, cpu, _ = timers.take()
        rows.setdefault("core step", []).append(step_wall)
        cpu_rows.setdefault("core step", []).append(step_cpu)
        for name in wall:
            rows.setdefault(name, []).append(wall[name])
            cpu_rows.setdefault(name, []).append(cpu[name])
        rows.setdefault("outside llama_decode", []).append(step_wall - wall["llama_decode"])
        cpu_rows.setdefault("outside llama_decode", []).append(step_cpu - cpu["llama_decode"])
        rest = step_wall - sum(wall.values()) + wall.get("memory_seq_rm", 0.0)
        # the phases nest: verify holds the cut (memory_seq_rm), _decode holds verify
        rows.setdefault("the rest (schedule, batch, costs, stats)", []).append(rest)
        if len(captured) != 1:
            continue
        token, pos, seq, logits = captured[0]
        per_seq = {int(s): int(np.sum(seq == s)) for s in np.unique(seq)}
        shapes[tuple(sorted(per_seq.values()))] = shapes.get(tuple(sorted(per_seq.values())), 0) + 1
        if args.no_replay:
            continue
        now = {job.seq: job.pos for job in core._jobs.values()}
        for s in per_seq:
            first = int(pos[seq == s].min())
            llama_rm(model, s, first)
        n = len(token)
        replay.clear()
        replay.token[:n], replay.pos[:n], replay.seq[:n], replay.logits[:n] = (
            token,
            pos,
            seq,
            logits,
        )
        replay.n = n
        replay.struct.n_tokens = n
        w0, c0 = time.perf_counter(), time.thread_time()
        rc = raw_decode(replay)
        rows.setdefault("raw llama_decode, same batch", []).append(time.perf_counter() - w0)
        cpu_rows.setdefault("raw llama_decode, same batch", []).append(time.thread_time() - c0)
        assert rc == 0, rc
        for s in per_seq:
            llama_rm(model, s, now.get(s, int(pos[seq == s].min())))
    model.close()
    costs = core._drafts.costs
    fixed, position = costs.coefficients
    print(
        f"step costs fitted: {fixed:.1f} ms a micro-batch, {position:.2f} a position, "
        f"{costs.single:.1f} a one-token step; spread (the margin) {costs.spread:.3f}"
    )
    print(
        f"{path.name}, {args.slots} slots, mode {args.mode}, draft {args.draft}, "
        f"n_batch {n_batch}, {args.threads} thread(s), {args.steps} steps"
    )
    print("batch shapes (tokens a sequence): " + ", ".join(f"{k}: {v}" for k, v in shapes.items()))
    print(f"{'':40} {'wall ms median (IQR)':>26} {'thread CPU ms median (IQR)':>28}")
    for name, values in rows.items():
        print(f"{name:40} {q(values):>26} {q(cpu_rows.get(name, [])):>28}")
    core_steps = rows["core step"]
    raws = rows.get("raw llama_decode, same batch")
    if raws:
        diffs = [a - b for a, b in zip(core_steps, raws, strict=True)]
        inner = [a - b for a, b in zip(rows["llama_decode"], raws, strict=True)]
        print(f"{'core step - raw (paired)':40} {q(diffs):>26}")
        print(f"{'core llama_decode - raw (paired)':40} {q(inner):>26}")


def llama_rm(model: LlamaModel, seq: int, start: int) -> None:
    """Cut ``seq``'s memory from ``start`` on (outside the core's timers)."""
    llama_cpp.llama_memory_seq_rm(model.memory, seq, start, -1)


if __name__ == "__main__":
    main()
