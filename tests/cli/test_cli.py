"""The ``llmtrio`` command as a user runs it: a real process, real signals."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from llmtrio.api import CHAT_PATH

from .._helpers import wait_until
from ..engine.test_embeddings import assert_matches

LLMTRIO = [sys.executable, "-m", "llmtrio"]


def test_generate_streams_text_and_reports_the_stop(gemma_path: Path) -> None:
    result = subprocess.run(
        [*LLMTRIO, "generate", "--model", str(gemma_path), "--prompt", "Say hi.",
         "--max-tokens", "8", "--temperature", "0", "--threads", "2"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert re.search(r"\[max_tokens\] prompt \d+ tokens, completion 8 tokens", result.stderr)


def test_generate_with_a_missing_model_is_a_clear_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [*LLMTRIO, "generate", "--model", str(tmp_path / "nope.gguf"), "--prompt", "hi"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "nope.gguf" in result.stderr
    assert "Traceback" not in result.stderr


def test_embed_prints_one_vector_a_line_matching_the_reference(
    minilm_path: Path, minilm_reference: dict[str, Any]
) -> None:
    texts = minilm_reference["inputs"][:3]
    result = subprocess.run(
        [*LLMTRIO, "embed", "--model", str(minilm_path), "--threads", "2", *texts],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3
    assert_matches(
        np.array([json.loads(line) for line in lines]), minilm_reference["embeddings"][:3]
    )
    assert "3 inputs" in result.stderr and "384 dimensions" in result.stderr


def test_embed_with_a_chat_model_is_a_clear_error(qwen35_path: Path) -> None:
    result = subprocess.run(
        [*LLMTRIO, "embed", "--model", str(qwen35_path), "--threads", "2", "hi"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "not an embedding model" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture
def serve_process(gemma_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    process = subprocess.Popen(
        [*LLMTRIO, "serve", "--model", str(gemma_path), "--port", "0", "--max-inflight", "2",
         "--ctx-size", "256", "--threads", "2", "--graceful-timeout", "30"],
        stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    stderr = process.stderr
    assert stderr is not None

    def served_url() -> str | None:
        line = stderr.readline()  # the next line, or "" once the process exited
        assert line, "llmtrio serve exited before serving"
        found = re.search(r"serving .* on (http://\S+)", line)
        return found.group(1) if found else None

    url = wait_until(served_url, "llmtrio serve's URL on its stderr", within=120, every=0)
    try:
        yield process, url
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


def test_sigterm_lets_the_running_stream_finish_then_exits(
    serve_process: tuple[subprocess.Popen[str], str],
) -> None:
    process, url = serve_process
    body = {"messages": [{"role": "user", "content": "Count."}], "max_tokens": 20,
            "ignore_eos": True, "stream": True}  # fmt: skip
    with httpx.stream("POST", url + CHAT_PATH, json=body, timeout=60) as response:
        chunks = response.iter_raw()
        received = next(chunks)
        process.send_signal(signal.SIGTERM)
        received += b"".join(chunks)
    assert received.endswith(b"data: [DONE]\n\n")
    assert process.wait(timeout=60) == 0
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/health", timeout=2)


# Runs ``llmtrio`` with SIGINT at its default disposition, as a shell starts a command in the
# foreground, whatever this test process inherited. A command started in the background by a
# shell without job control (``./scripts/test > log &`` in a script, nohup-style runners)
# starts with SIGINT ignored, and that passes on to its children: Python then installs no
# KeyboardInterrupt handler, so Ctrl-C reaches nobody and generation goes on (issue 15: the
# Ctrl-C test timed out so, every time, when pytest was started that way).
_FOREGROUND = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)
LLMTRIO_FOREGROUND = [sys.executable, "-c", _FOREGROUND, *LLMTRIO[1:]]


def test_ctrl_c_stops_generate_cleanly(gemma_path: Path) -> None:
    process = subprocess.Popen(
        [*LLMTRIO_FOREGROUND, "generate", "--model", str(gemma_path),
         "--prompt", "Tell a long story.", "--max-tokens", "2000", "--threads", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert process.stdout is not None
    assert process.stdout.read(20)  # it is streaming text
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130
    assert "interrupted" in stderr
    assert "Traceback" not in stderr


def test_python_dash_m_llmtrio_is_the_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "llmtrio", "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "generate" in result.stdout and "serve" in result.stdout and "worker" in result.stdout


@pytest.mark.parametrize("command", ["serve", "worker", "generate"])
def test_prompt_cache_flags_reach_the_engine_config(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from llmtrio.cli._main import _parser, engine_config

    needed = {
        "serve": [],
        "worker": ["--ingress-url=wss://i:1", "--tls-cert=c.pem", "--ca=ca.pem"],
        "generate": ["--prompt=hi"],
    }[command]

    def parsed(*flags: str) -> tuple[bool, int]:
        config = engine_config(_parser().parse_args([command, "--model=m.gguf", *flags, *needed]))
        return config.prompt_cache, config.cache_ram_mib

    assert parsed() == (True, 1024)
    assert parsed("--no-prompt-cache", "--cache-ram=0") == (False, 0)
    with pytest.raises(SystemExit):
        parsed("--cache-ram=-1")
    assert "--cache-ram: must be 0 or more, not -1" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["serve", "worker", "generate"])
def test_speculation_and_pool_flags_reach_the_engine_config(command: str) -> None:
    from llmtrio.cli._main import _parser, engine_config
    from llmtrio.engine import EngineConfig

    needed = {
        "serve": [],
        "worker": ["--ingress-url=wss://i:1", "--tls-cert=c.pem", "--ca=ca.pem"],
        "generate": ["--prompt=hi"],
    }[command]

    def parsed(*flags: str) -> EngineConfig:
        return engine_config(_parser().parse_args([command, "--model=m.gguf", *flags, *needed]))

    default = EngineConfig()
    config = parsed()
    assert (config.spec, config.spec_draft_max, config.kv_unified, config.max_request_ctx) == (
        default.spec,
        default.spec_draft_max,
        default.kv_unified,
        default.max_request_ctx,
    )
    assert parsed("--no-spec").spec is None
    assert parsed("--spec=ngram", "--spec-draft-max=3").spec_draft_max == 3
    config = parsed("--kv-unified", "--max-request-ctx=20000", "--ctx-size=4096")
    assert config.kv_unified and config.request_ctx == 20000
    assert not parsed("--no-kv-unified").kv_unified
    with pytest.raises(SystemExit):
        parsed("--spec=ngram", "--no-spec")
    with pytest.raises(SystemExit, match="--spec-draft-max must be between 1 and 64"):
        parsed("--spec-draft-max=65")
    with pytest.raises(SystemExit, match="--max-request-ctx must be between 16 and 4096"):
        parsed("--max-request-ctx=5000", "--ctx-size=4096")
