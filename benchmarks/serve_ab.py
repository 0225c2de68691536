"""One ``llmtrio serve`` from the source tree in PYTHONPATH, three streamed 48-token chat
completions one after another (greedy, end of generation banned, as compare.py's N=1): TTFT
and decode tok/s each. Short, so runs for two trees can alternate within a quiet minute on a
shared machine:

    for tree in /path/to/base /path/to/this /path/to/base /path/to/this; do
        PYTHONPATH=$tree .venv/bin/python benchmarks/serve_ab.py
    done
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from llmtrio.engine import demo_model_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="requests, one after another")
    args = parser.parse_args()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [str(Path(sys.executable).parent / "llmtrio"), "serve",
            "--model", str(demo_model_path()), "--host", "127.0.0.1", "--port", str(port),
            "--max-inflight", "8", "--ctx-size", "512", "--threads", "2"]  # fmt: skip
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(1200):
            try:
                if httpx.get(base + "/health").json().get("status") == "ok":
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        body = {
            "model": "bench",
            "messages": [{"role": "user", "content": "Tell me a story."}],
            "max_tokens": 48,
            "temperature": 0,
            "stream": True,
            "logit_bias": {"1": -100, "106": -100, "212": -100},
            "ignore_eos": True,
        }
        for _ in range(args.rounds):
            start, times = time.perf_counter(), []
            with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=600) as r:
                for line in r.iter_lines():
                    if '"content":"' in line and '"role"' not in line:
                        times.append(time.perf_counter())
            rate = (len(times) - 1) / (times[-1] - times[0])
            print(
                f"{os.environ.get('PYTHONPATH')}: TTFT {1000 * (times[0] - start):.0f} ms, "
                f"decode {rate:.1f} tok/s, {len(times)} chunks"
            )
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(30)


if __name__ == "__main__":
    main()
