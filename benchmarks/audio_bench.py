"""What 30 seconds of audio cost, on gemma-3-270m with a random-weight ``qwen2a`` (Whisper
encoder) projector (``tests/_projector.py``) sized by ``--width``/``--blocks`` (Whisper-base's
512 and 6 by default):

- ``ttft``: one streamed chat request with ``--seconds`` of audio (a new file each, so each
  encodes), time to the first content chunk, on ``llmtrio serve`` (one per
  ``--prefill-chunks``) and on llama-server on the same model and projector files
  (llama-server from ``benchmarks/build_llama_server.sh``'s cache, built from the llama.cpp
  sources llama-cpp-python vendors), one request at a time, the servers in turns;
- ``gaps``: the gaps between tokens of ``--streams`` text streams already decoding, while
  ``--requests`` audio requests arrive one after another (their windows encoded in the
  threads that prepare requests, their embeddings ingested in prompt chunks between decode
  steps), against none: p50, p95 and the largest.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/audio_bench.py ttft \\
        --llama-server ~/.cache/llmtrio/llama-server/*/llama-server
    PYTHONPATH=$PWD .venv/bin/python benchmarks/audio_bench.py gaps
"""

from __future__ import annotations

import argparse
import base64
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _token_gaps import count_and_time

from llmtrio.engine import (
    MEDIA_MARKER,
    ChatMessage,
    Engine,
    EngineConfig,
    GenerateRequest,
    decode_audio,
    demo_model_path,
)


def _wav(seconds: float, seed: int) -> bytes:
    """A tone under noise, 16 kHz 16-bit mono (a new one per seed)."""
    from tests._audio import wav

    rate = 16000
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(seed)
    samples = 0.3 * np.sin(2 * np.pi * (200 + seed) * t) + 0.05 * rng.standard_normal(t.size)
    return wav(samples.astype(np.float32), rate)


def _projector(folder: str, args: argparse.Namespace) -> Path:
    from tests._projector import write_qwen2a_projector

    return write_qwen2a_projector(
        Path(folder) / "mmproj-qwen2a.gguf",
        text_width=640,
        width=args.width,
        blocks=args.blocks,
        heads=max(1, args.width // 64),
    )


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ttft(url: str, seconds: float, seed: int) -> float:
    data = base64.b64encode(_wav(seconds, seed)).decode()
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is said?"},
                    {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}},
                ],
            }
        ],
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
        "cache_prompt": False,
    }
    started = time.perf_counter()
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=900) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: ") and "choices" in line:
                choices = json.loads(line[6:])["choices"]
                if choices and choices[0]["delta"].get("content"):
                    return time.perf_counter() - started
    return time.perf_counter() - started


def _wait_healthy(url: str) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not come up")


def ttft(args: argparse.Namespace) -> None:
    """The servers run side by side (each with one slot, idle while another works) and take
    the requests in turns, so a machine whose load drifts weighs on each alike."""
    model = str(demo_model_path())
    with tempfile.TemporaryDirectory() as folder:
        projector = str(_projector(folder, args))
        runs: list[tuple[str, list[str], str]] = []
        for chunk in args.prefill_chunks:
            port = _port()
            argv = [sys.executable, "-m", "llmtrio", "serve", "--model", model, "--mmproj",
                    projector, "--port", str(port), "--threads", str(args.threads),
                    "--max-inflight", "1", "--no-spec", "--ctx-size", "4096",
                    "--prefill-chunk", str(chunk)]  # fmt: skip
            runs.append((f"llmtrio --prefill-chunk {chunk}", argv, f"http://127.0.0.1:{port}"))
        if args.llama_server is not None:
            port = _port()
            argv = [str(args.llama_server), "-m", model, "--mmproj", projector, "--port",
                    str(port), "-t", str(args.threads), "-tb", str(args.threads), "-np", "1",
                    "-c", "4096", "--no-warmup"]  # fmt: skip
            runs.append(("llama-server", argv, f"http://127.0.0.1:{port}"))
        servers = []
        try:
            for name, argv, _ in runs:
                log = (args.out / f"audio-{name.split()[0]}-{len(servers)}.log").open("wb")
                servers.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
            for _, _, url in runs:
                _wait_healthy(url)
                _ttft(url, 2.0, 0)  # warm up
            times: dict[str, list[float]] = {name: [] for name, _, _ in runs}
            for seed in range(1, args.requests + 1):
                for name, _, url in runs:
                    times[name].append(_ttft(url, args.seconds, seed * 10 + len(times[name])))
            for name, measured in times.items():
                shown = ", ".join(f"{t:.1f}" for t in measured)
                print(f"{name}: TTFT median {statistics.median(measured):.1f} s ({shown} s)")
        finally:
            for server in servers:
                server.terminate()
                server.wait(timeout=60)


async def _gaps(engine: Engine, args: argparse.Namespace, requests: int) -> list[float]:
    gaps: list[float] = []

    async def stream(i: int) -> None:
        await count_and_time(engine, i, args.tokens, gaps)

    async def arrivals() -> None:
        await trio.sleep(0.3)
        for k in range(requests):
            audio = decode_audio(_wav(args.seconds, 100 + k), max_seconds=600, param="audio")
            request = GenerateRequest(
                messages=[ChatMessage("user", MEDIA_MARKER + "What is said?", media=[audio])],
                max_tokens=4,
                ignore_eos=True,
            )
            async with engine.submit(request) as generation:
                async for _ in generation:
                    pass

    async with trio.open_nursery() as nursery:
        for i in range(args.streams):
            nursery.start_soon(stream, i)
        if requests:
            nursery.start_soon(arrivals)
    return gaps


async def _gaps_main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as folder:
        config = EngineConfig(
            model=demo_model_path(),
            mmproj=_projector(folder, args),
            threads=args.threads,
            max_inflight=args.streams + 1,
            ctx_size=4096,
            spec=None,
        )
        async with Engine.open(config) as engine:
            warm = decode_audio(_wav(2.0, 0), max_seconds=600, param="audio")
            request = GenerateRequest(
                messages=[ChatMessage("user", MEDIA_MARKER + "Hi", media=[warm])], max_tokens=2
            )
            async with engine.submit(request) as generation:
                async for _ in generation:
                    pass
            for requests in (0, args.requests):
                encodes, spent = engine.stats.audio_encodes, engine.stats.audio_encode_s
                gaps = await _gaps(engine, args, requests)
                windows = engine.stats.audio_encodes - encodes
                per = (engine.stats.audio_encode_s - spent) / windows if windows else 0.0
                print(
                    f"{args.streams} streams, {requests} audio requests of {args.seconds:g} s "
                    f"({windows} windows encoded, {per:.2f} s each): gap p50 "
                    f"{np.quantile(gaps, 0.5) * 1000:.0f} ms, p95 "
                    f"{np.quantile(gaps, 0.95) * 1000:.0f} ms, max {max(gaps) * 1000:.0f} ms "
                    f"({len(gaps)} gaps)"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("ttft", "gaps"))
    parser.add_argument("--llama-server", type=Path, help="llama-server to compare (ttft)")
    parser.add_argument(
        "--prefill-chunks", type=int, nargs="+", default=[256, 512],
        help="llmtrio's --prefill-chunk, one server each (ttft; llama-server's ubatch is 512)",
    )  # fmt: skip
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()
    if args.what == "ttft":
        ttft(args)
    else:
        trio.run(_gaps_main, args)


if __name__ == "__main__":
    main()
