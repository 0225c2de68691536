"""NVIDIA's AIPerf against llmtrio and llama.cpp's ``llama-server`` side by side (issue 48):
streaming chat at 1, 8 and 32 concurrent users, 200- and 2000-token prompts, 64-token answers;
the servers interleaved, three rounds; TTFT, inter-token latency (mean, p50, p99), output
throughput and request latency printed as ratios. Not a test, never part of CI.

    python3 -m venv ~/.venvs/aiperf && ~/.venvs/aiperf/bin/pip install aiperf gguf  # no torch
    ./benchmarks/build_llama_server.sh                                    # once, cached
    .venv/bin/python benchmarks/aiperf_compare.py --aiperf ~/.venvs/aiperf/bin/aiperf
        [--users 1 8 32] [--prompt-tokens 200 2000] [--output-tokens 64] [--rounds 3]
        [--threads 1] [--requests-per-user 6] [--busy 0] [--servers llmtrio llama-server]
        [--llmtrio-args "--prefill-share inf"] [--base-tree DIR] [--out DIR]

How it runs, for each point (users, prompt tokens) and round: each server in turn (the order
alternates between rounds) is started fresh on a free 127.0.0.1 port with one slot per user
and ``prompt + output + 64`` tokens of context a slot (llmtrio ``--max-inflight``/``--ctx-size``,
llama-server ``--parallel`` and ``-c`` for all slots, ``--no-kv-unified --swa-full --cache-ram
0``: see ``compare.py``), ``--threads`` for both, warmed with one request; then ``aiperf
profile`` runs against it as a new user would run it: ``--endpoint-type chat --streaming
--concurrency USERS``, ``--requests-per-user x USERS`` requests, synthetic prompts of exactly
``--prompt-tokens`` tokens (every one distinct), ``--output-tokens`` tokens asked
(``max_tokens``, ``ignore_eos``), the servers' own sampling defaults, the servers' token counts
(``--use-server-token-count``). AIPerf's own processes share the machine with the server (on
2 cores, about one core): that is the scenario measured.

The tokenizer AIPerf counts prompt tokens with is the served model's own, rebuilt from the
GGUF's vocabulary (``tokenizer.json``, with transformers' GGUF converter run in the AIPerf
venv; cached in ``~/.cache/llmtrio/aiperf-tokenizer``; no Hugging Face access), or
``--tokenizer DIR``.

The figures (AIPerf's definitions): TTFT, from the request sent to the first content token;
ITL, per request, ``(request latency - TTFT) / (output tokens - 1)``, its mean, p50 and p99
over requests; the longest gaps, the p99 of every gap between two content chunks of any
stream (AIPerf's inter-chunk latency: the stutter a reader sees); output tok/s, all output
tokens over the run's wall time. Each figure is the median over rounds; the ratio is
llmtrio's over llama-server's (below 1 is better for latencies, above 1 for throughput).

``--busy N`` runs N busy loops (a Python ``while True``) beside each measurement: a
competing process on the shared cores. ``--base-tree DIR`` adds ``llmtrio-base``, llmtrio
from another source tree (an export of main), for a before/after in the same run.

Resource handling: every server, busy loop and AIPerf run is a child process stopped before
the next starts (also on errors and Ctrl-C); logs and AIPerf's artifacts go to ``--out`` (or a
temporary folder).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _servers import (
    BUILD_SCRIPT,
    REPO,
    SPECS,
    Kind,
    ServerSpec,
    Setup,
    find_llama_server,
    running_server,
    stop_process,
)

from llmtrio.engine import demo_model_path
from llmtrio.engine.llama import LlamaModel

#: Run in the AIPerf venv (which has transformers' GGUF converter and the gguf package): the
#: GGUF's vocabulary as a ``tokenizer.json``, without torch (transformers' own GGUF loader
#: wants torch for the weights; only the tokenizer is read here).
MAKE_TOKENIZER = """
import json, sys
from pathlib import Path
from gguf import GGUFReader
from transformers.integrations.gguf.gguf_tokenizer_mapping import (
    GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer)
gguf, out = sys.argv[1], Path(sys.argv[2])
fields = GGUFReader(gguf).fields
meta = {k: f.contents() for k, f in fields.items()
        if k.startswith("tokenizer.") or k == "general.architecture"}
d = {new: meta["tokenizer." + key] for key, new in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
     if "tokenizer." + key in meta}
tokenizer, _ = convert_gguf_tokenizer(meta["general.architecture"], d)
out.mkdir(parents=True, exist_ok=True)
tokenizer.save(str(out / "tokenizer.json"))
tokens = d["tokens"]
special = {"tokenizer_class": "PreTrainedTokenizerFast"}
for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id")):
    if key in d:
        special[name] = tokens[d[key]]
(out / "tokenizer_config.json").write_text(json.dumps(special))
"""

#: The metrics read from AIPerf's summary (``profile_export_aiperf.json``), by its names.
FIGURES = (
    ("tok/s", "output_token_throughput", "avg"),
    ("TTFT mean", "time_to_first_token", "avg"),
    ("TTFT p50", "time_to_first_token", "p50"),
    ("TTFT p99", "time_to_first_token", "p99"),
    ("ITL mean", "inter_token_latency", "avg"),
    ("ITL p50", "inter_token_latency", "p50"),
    ("ITL p99", "inter_token_latency", "p99"),
    ("gap p99", "inter_chunk_latency", "p99"),
    ("latency mean", "request_latency", "avg"),
)


@dataclass(frozen=True)
class Point:
    users: int
    prompt_tokens: int


@dataclass(frozen=True)
class Run:
    """One AIPerf run: its figures (ms, or tok/s), requests done, load average around it."""

    figures: dict[str, float]
    completed: int
    errors: int
    load: tuple[float, float]


def tokenizer_dir(aiperf: Path, model: Path) -> Path:
    """The served model's tokenizer for AIPerf, built once from the GGUF (cached)."""
    stat = model.stat()
    cache = Path.home() / ".cache" / "llmtrio" / "aiperf-tokenizer"
    out = cache / f"{model.stem}-{stat.st_size}"
    if not (out / "tokenizer.json").exists():
        python = aiperf.parent / "python"
        subprocess.run([str(python), "-c", MAKE_TOKENIZER, str(model), str(out)], check=True)
    return out


def aiperf_argv(
    args: argparse.Namespace, point: Point, base: str, tokenizer: Path, out: Path
) -> list[str]:
    requests = args.requests_per_user * point.users
    return [
        str(args.aiperf),
        "profile",
        "--model",
        "bench",
        "--url",
        base,
        "--endpoint-type",
        "chat",
        "--streaming",
        "--concurrency",
        str(point.users),
        "--request-count",
        str(requests),
        "--num-dataset-entries",
        str(requests),  # every prompt distinct: no server reuses one
        "--isl",
        str(point.prompt_tokens),
        "--isl-stddev",
        "0",
        "--osl",
        str(args.output_tokens),
        "--osl-stddev",
        "0",
        "--use-legacy-max-tokens",
        "--extra-inputs",
        "ignore_eos:true",
        "--use-server-token-count",
        "--tokenizer",
        str(tokenizer),
        "--random-seed",
        str(args.seed),
        "--artifact-dir",
        str(out),
        "--ui-type",
        "none",
        "--no-server-metrics",
        "--request-timeout-seconds",
        "1800",
        # A connection a request: llama-server drops pooled keep-alive connections, and
        # AIPerf then fails a request or two in 48 writing to a closed one.
        "--connection-reuse-strategy",
        "never",
        *shlex.split(args.aiperf_args),
    ]


def read_run(out: Path, load: tuple[float, float]) -> Run:
    summary = json.loads((out / "profile_export_aiperf.json").read_text())
    figures: dict[str, float] = {}
    for label, name, stat in FIGURES:
        value = (summary.get(name) or {}).get(stat)
        figures[label] = float(value) if value is not None else math.nan
    completed = int((summary.get("request_count") or {}).get("avg", 0))
    errors = int(sum(e.get("count", 0) for e in summary.get("error_summary") or []))
    return Run(figures, completed, errors, load)


async def busy_loops(n: int, *, task_status: trio.TaskStatus[None]) -> None:
    """``n`` busy-looping processes until cancelled (then stopped)."""
    processes = [
        await trio.lowlevel.open_process(
            [sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL
        )
        for _ in range(n)
    ]
    try:
        task_status.started()
        await trio.sleep_forever()
    finally:
        with trio.move_on_after(10, shield=True):
            for process in processes:
                await stop_process(process)


async def measure(
    args: argparse.Namespace,
    setup: Setup,
    spec: ServerSpec,
    point: Point,
    rnd: int,
    tokenizer: Path,
) -> Run:
    ctx = point.prompt_tokens + args.output_tokens + 64
    tag = f"{spec.key}-u{point.users}-p{point.prompt_tokens}-r{rnd + 1}"
    out = setup.logdir / tag
    async with running_server(spec, setup, ctx, tag) as server, trio.open_nursery() as nursery:
        if args.busy:
            await nursery.start(busy_loops, args.busy)
        before = os.getloadavg()[0]
        log = setup.logdir / f"{tag}-aiperf.log"
        with log.open("wb") as sink:
            done = await trio.run_process(
                aiperf_argv(args, point, server.base, tokenizer, out),
                stdout=sink,
                stderr=subprocess.STDOUT,
                check=False,
            )
        after = os.getloadavg()[0]
        nursery.cancel_scope.cancel()
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise RuntimeError(f"aiperf failed for {tag} (rc {done.returncode}):\n{tail}")
    return read_run(out, (before, after))


def fmt(label: str, value: float) -> str:
    if math.isnan(value):
        return "-"
    if label == "tok/s":
        return f"{value:.1f}"
    return f"{value / 1000:.2f} s" if value >= 1000 else f"{value:.0f} ms"


def print_point(point: Point, runs: dict[str, list[Run]], labels: dict[str, str]) -> None:
    """One table: a row per figure, a column per server (median over rounds), and each
    llmtrio's ratio to llama-server."""
    keys = list(runs)
    med = {
        key: {label: statistics.median([r.figures[label] for r in rs]) for label, _, _ in FIGURES}
        for key, rs in runs.items()
    }
    ratios = [k for k in keys if k != "llama-server" and "llama-server" in runs]
    head = ["", *(labels[k] for k in keys), *(f"{labels[k]} / llama-server" for k in ratios)]
    print(
        f"\n{point.users} users, {point.prompt_tokens}-token prompts "
        f"(median of {min(len(rs) for rs in runs.values())} rounds)"
    )
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for label, _, _ in FIGURES:
        cells = [fmt(label, med[k][label]) for k in keys]
        for k in ratios:
            base = med["llama-server"][label]
            cells.append(f"{med[k][label] / base:.2f}x" if base else "-")
        print(f"| {label} | " + " | ".join(cells) + " |")
    for key in keys:
        loads = ", ".join(f"{r.load[0]:.1f}-{r.load[1]:.1f}" for r in runs[key])
        done = sum(r.completed for r in runs[key])
        errors = sum(r.errors for r in runs[key])
        print(f"  {labels[key]}: {done} requests, {errors} errors; load average {loads}")


async def run(args: argparse.Namespace, setup: Setup, specs: list[ServerSpec]) -> None:
    tokenizer = args.tokenizer or await trio.to_thread.run_sync(
        tokenizer_dir, args.aiperf, setup.model
    )
    labels = {s.key: s.label for s in specs}
    results: dict[Point, dict[str, list[Run]]] = {}
    points = [Point(u, p) for p in args.prompt_tokens for u in args.users]
    for point in points:
        per = results.setdefault(point, {s.key: [] for s in specs})
        for rnd in range(args.rounds):
            order = specs if rnd % 2 == 0 else specs[::-1]
            for spec in order:
                print(
                    f"{point.users} users, {point.prompt_tokens}-token prompts, round "
                    f"{rnd + 1}/{args.rounds}: {spec.label} ...",
                    flush=True,
                )
                slots = dataclasses.replace(setup, slots=point.users)
                started = time.monotonic()
                result = await measure(args, slots, spec, point, rnd, tokenizer)
                per[spec.key].append(result)
                figures = ", ".join(f"{k} {fmt(k, v)}" for k, v in result.figures.items())
                print(f"  {time.monotonic() - started:.0f} s: {figures}", flush=True)
        print_point(point, per, labels)
    if args.out:
        dump = [
            {
                "users": p.users,
                "prompt_tokens": p.prompt_tokens,
                "servers": {k: [r.__dict__ for r in rs] for k, rs in per.items()},
            }
            for p, per in results.items()
        ]
        (args.out / "results.json").write_text(json.dumps(dump, indent=1))
    print("\nall points:")
    for point, per in results.items():
        print_point(point, per, labels)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a GGUF (default: the demo gemma-3-270m)")
    parser.add_argument("--llama-server", type=Path, help="the binary (default: the cached one)")
    parser.add_argument(
        "--aiperf",
        type=Path,
        default=shutil.which("aiperf"),
        help="the aiperf command, in a venv of its own (default: aiperf on PATH)",
    )
    parser.add_argument("--tokenizer", type=Path, help="a tokenizer folder for AIPerf")
    choices = [s.key for s in SPECS if s.kind is not Kind.LCP]
    parser.add_argument(
        "--servers", nargs="+", choices=choices, default=["llmtrio", "llama-server"]
    )
    parser.add_argument("--users", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[200, 2000])
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--requests-per-user", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads of both")
    parser.add_argument("--busy", type=int, default=0, help="busy loops beside each run")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--aiperf-args", default="", help="more aiperf profile arguments")
    parser.add_argument("--base-tree", type=Path, help="source tree run as 'llmtrio-base'")
    for kind in (Kind.LLMTRIO, Kind.LLAMA_SERVER):
        parser.add_argument(
            f"--{kind.value}-args",
            default="",
            metavar="ARGS",
            help=f"extra arguments for {kind.value} (one string, split like a shell)",
        )
    parser.add_argument("--out", type=Path, help="keep logs, AIPerf's artifacts, results.json")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.aiperf is None:
        print("no aiperf: install it in a venv of its own, pass --aiperf", file=sys.stderr)
        return 2
    model = args.model or demo_model_path()
    specs = [next(s for s in SPECS if s.key == key) for key in dict.fromkeys(args.servers)]
    llama_server = None
    if any(s.kind is Kind.LLAMA_SERVER for s in specs):
        llama_server = find_llama_server(args.llama_server)
        if llama_server is None:
            print(f"no llama-server: run {BUILD_SCRIPT.relative_to(REPO)}", file=sys.stderr)
            return 2
    probe = LlamaModel(model, slots=1, ctx_size=64, threads=1, n_batch=64)
    try:
        eog = tuple(sorted(probe.eog))
    finally:
        probe.close()
    with tempfile.TemporaryDirectory(prefix="llmtrio-aiperf-") as tmp:
        logdir = args.out or Path(tmp)
        logdir.mkdir(parents=True, exist_ok=True)
        extra = {
            Kind.LLMTRIO: tuple(shlex.split(args.llmtrio_args)),
            Kind.LLAMA_SERVER: tuple(shlex.split(args.llama_server_args)),
        }
        setup = Setup(model, llama_server, args.threads, 4, eog, logdir, extra, args.base_tree)
        print(
            f"model {model}; {os.cpu_count()} cores, {args.threads} thread(s) each; "
            f"llama-server {llama_server}; aiperf {args.aiperf}; busy loops {args.busy}; "
            f"load average {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        trio.run(run, args, setup, specs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
