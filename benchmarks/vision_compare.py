"""One image request's TTFT on ``llmtrio serve`` and on llama-server side by side, on the same
model and projector files (llama-server from ``benchmarks/build_llama_server.sh``'s cache, built
from the llama.cpp sources llama-cpp-python vendors), one request at a time, each with a new
image (so each encodes), streamed: the time to the first content chunk.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/vision_compare.py \\
        --mmproj /tmp/mmproj.gguf --llama-server ~/.cache/llmtrio/llama-server/*/llama-server

``--mmproj`` is any projector that fits the model (``tests/_projector.py`` writes random ones).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

from llmtrio.engine import demo_model_path


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _image(seed: int) -> str:
    from PIL import Image as PILImage

    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    PILImage.fromarray(rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)).save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def _ttft(url: str, seed: int) -> float:
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": _image(seed)}},
                    {"type": "text", "text": "Describe it."},
                ],
            }
        ],
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
        "cache_prompt": False,
    }
    started = time.perf_counter()
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                delta = json.loads(line[6:])["choices"][0]["delta"] if "choices" in line else {}
                if delta.get("content"):
                    return time.perf_counter() - started
    return time.perf_counter() - started


def _run(argv: list[str], url: str, requests: int, log: Path) -> list[float]:
    with log.open("wb") as out:
        server = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        _ttft(url, 0)  # warm up
        return [_ttft(url, seed) for seed in range(1, requests + 1)]
    finally:
        server.terminate()
        server.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mmproj", type=Path, required=True)
    parser.add_argument("--llama-server", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("/tmp"))
    args = parser.parse_args()
    model = str(demo_model_path())
    port = _port()
    ours = [sys.executable, "-m", "llmtrio", "serve", "--model", model, "--mmproj",
            str(args.mmproj), "--port", str(port), "--threads", str(args.threads),
            "--max-inflight", "1", "--no-spec"]  # fmt: skip
    theirs_port = _port()
    theirs = [str(args.llama_server), "-m", model, "--mmproj", str(args.mmproj), "--port",
              str(theirs_port), "-t", str(args.threads), "-tb", str(args.threads), "-np", "1",
              "--no-warmup"]  # fmt: skip
    for name, argv, url in (
        ("llmtrio", ours, f"http://127.0.0.1:{port}"),
        ("llama-server", theirs, f"http://127.0.0.1:{theirs_port}"),
    ):
        ttfts = _run(argv, url, args.requests, args.out / f"vision-{name}.log")
        shown = ", ".join(f"{t * 1000:.0f}" for t in ttfts)
        print(f"{name}: TTFT median {statistics.median(ttfts) * 1000:.0f} ms ({shown} ms)")


if __name__ == "__main__":
    main()
