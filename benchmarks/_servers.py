"""The benchmarks' shared library: the servers compared (llmtrio, llama-server,
llama-cpp-python's server) started and stopped alike, their argv, readiness and slots, one
streamed chat request measured (TTFT, token gaps), the load metrics over many, and the
tables they print. ``compare.py`` is one benchmark built on it; others import it too."""

from __future__ import annotations

import enum
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import trio

HOST = "127.0.0.1"


REPO = Path(__file__).resolve().parent.parent


BUILD_SCRIPT = REPO / "benchmarks" / "build_llama_server.sh"


PROMPTS = (
    "Tell me a short story about a lighthouse keeper.",
    "Explain how a bicycle stays upright.",
    "Write a poem about autumn leaves.",
    "What are the main causes of ocean tides?",
    "Describe the taste of a ripe mango.",
    "Give me three tips for learning to juggle.",
    "Why is the sky blue during the day?",
    "Summarise the plot of a heist film you invent.",
)


SLOTS = 8


STARTUP_TIMEOUT_S = 120.0


REQUEST_TIMEOUT_S = 600.0


class Kind(enum.Enum):
    LLMTRIO = "llmtrio"
    LLAMA_SERVER = "llama-server"
    LCP = "llama-cpp-python"


@dataclass(frozen=True)
class ServerSpec:
    """One server configuration: ``key`` names it on the command line, ``label`` in tables."""

    key: str
    label: str
    kind: Kind
    interrupt: bool = True  # llama-cpp-python's --interrupt_requests

    @property
    def takes_ignore_eos(self) -> bool:
        return self.kind is not Kind.LCP


SPECS = (
    ServerSpec("llmtrio", "llmtrio", Kind.LLMTRIO),
    # llmtrio from another source tree (--base-tree: e.g. main, for a before/after line).
    ServerSpec("llmtrio-base", "llmtrio (base tree)", Kind.LLMTRIO),
    ServerSpec("llama-server", "llama-server", Kind.LLAMA_SERVER),
    ServerSpec("lcp", "llama-cpp-python", Kind.LCP, interrupt=True),
    ServerSpec("lcp-nointerrupt", "llama-cpp-python (no interrupt)", Kind.LCP, interrupt=False),
)


@dataclass(frozen=True)
class Setup:
    """What every part needs: the model, the llama-server binary, the request shape."""

    model: Path
    llama_server: Path | None
    threads: int
    max_tokens: int
    eog: tuple[int, ...]
    logdir: Path
    extra_args: dict[Kind, tuple[str, ...]] = field(default_factory=dict)
    base_tree: Path | None = None
    slots: int = SLOTS  # llmtrio --max-inflight, llama-server --parallel

    def logit_bias(self) -> dict[str, float]:
        return {str(t): -100.0 for t in self.eog}


def llmtrio_argv(setup: Setup, port: int, ctx: int) -> list[str]:
    # ``-m llmtrio``, not the venv's ``llmtrio`` script: the tree on PYTHONPATH (this one,
    # or --base-tree's) decides what runs, whatever the venv was installed from.
    return [
        sys.executable,
        "-m",
        "llmtrio",
        "serve",
        "--model",
        str(setup.model),
        "--host",
        HOST,
        "--port",
        str(port),
        "--max-inflight",
        str(setup.slots),
        "--ctx-size",
        str(ctx),
        "--threads",
        str(setup.threads),
    ]


def llama_server_argv(setup: Setup, port: int, ctx: int) -> list[str]:
    """``-c`` is the total context; llama-server gives each of ``--parallel`` slots
    ``c / parallel`` (``--no-kv-unified``, as llmtrio: each slot its own cells).
    ``--swa-full`` matches llmtrio's and llama-cpp-python's KV layout
    (llama_context_default_params has swa_full on; llama-server's own default is off);
    ``--cache-ram 0`` turns off the host prompt cache, which neither other server has and
    which would only grow RSS here."""
    assert setup.llama_server is not None
    return [
        str(setup.llama_server),
        "-m",
        str(setup.model),
        "--host",
        HOST,
        "--port",
        str(port),
        "--parallel",
        str(setup.slots),
        "-c",
        str(ctx * setup.slots),
        "--threads",
        str(setup.threads),
        "--threads-batch",
        str(setup.threads),
        "--no-kv-unified",
        "--swa-full",
        "--cache-ram",
        "0",
        "--slots",
        "--no-webui",
    ]


def lcp_argv(setup: Setup, port: int, ctx: int, *, interrupt: bool) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(setup.model),
        "--host",
        HOST,
        "--port",
        str(port),
        "--n_ctx",
        str(ctx),
        "--n_threads",
        str(setup.threads),
        "--n_threads_batch",
        str(setup.threads),
    ]
    if not interrupt:
        argv += ["--interrupt_requests", "False"]
    return argv


def server_argv(spec: ServerSpec, setup: Setup, port: int, ctx: int) -> list[str]:
    """The command line, with the ``--*-args`` given for this kind of server appended."""
    if spec.kind is Kind.LLMTRIO:
        argv = llmtrio_argv(setup, port, ctx)
    elif spec.kind is Kind.LLAMA_SERVER:
        argv = llama_server_argv(setup, port, ctx)
    else:
        argv = lcp_argv(setup, port, ctx, interrupt=spec.interrupt)
    return argv + list(setup.extra_args.get(spec.kind, ()))


async def is_ready(client: httpx.AsyncClient, base: str, kind: Kind) -> bool:
    """llmtrio: ``/health`` says ok with slots; llama-server: ``/health`` 200 (503 while
    loading); llama-cpp-python: ``/v1/models`` 200."""
    try:
        if kind is Kind.LCP:
            return (await client.get(f"{base}/v1/models")).status_code == 200
        response = await client.get(f"{base}/health")
        if kind is Kind.LLAMA_SERVER:
            return response.status_code == 200
        body = response.json()
        return bool(body.get("status") == "ok" and body["capacity"]["max_inflight"] > 0)
    except (httpx.HTTPError, ValueError, KeyError):
        return False


@dataclass
class Running:
    spec: ServerSpec
    base: str
    process: trio.Process
    log: Path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


async def stop_process(process: trio.Process) -> None:
    """SIGINT (graceful in all three), then SIGTERM after 20 s, then SIGKILL after 5 s more;
    any child processes left are killed too."""
    try:
        children = psutil.Process(process.pid).children(recursive=True)
    except psutil.Error:
        children = []
    for sig, grace in ((signal.SIGINT, 20.0), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        if process.returncode is not None:
            break
        process.send_signal(sig)
        with trio.move_on_after(grace):
            await process.wait()
    for child in children:
        with suppress(psutil.Error):
            child.kill()


@asynccontextmanager
async def running_server(
    spec: ServerSpec, setup: Setup, ctx: int, tag: str, argv: list[str] | None = None
) -> AsyncIterator[Running]:
    """Starts the server, waits until it answers, warms it with one short request, and yields.

    Resource handling: the process is stopped on exit, shielded and bounded (35 s at most).
    Error handling: raises ``RuntimeError`` with the log's tail when the server exits or is not
    ready within STARTUP_TIMEOUT_S.
    """
    port = free_port()
    base = f"http://{HOST}:{port}"
    log = setup.logdir / f"{tag}.log"
    argv = server_argv(spec, setup, port, ctx) if argv is None else [*argv, "--port", str(port)]
    log_file = await trio.to_thread.run_sync(log.open, "wb")
    env = None
    if spec.key == "llmtrio-base":
        assert setup.base_tree is not None
        env = {**os.environ, "PYTHONPATH": str(setup.base_tree)}
    try:
        process = await trio.lowlevel.open_process(
            argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, env=env
        )
        try:
            async with httpx.AsyncClient(timeout=5.0) as client:
                ready = False
                with trio.move_on_after(STARTUP_TIMEOUT_S):
                    for _ in range(int(STARTUP_TIMEOUT_S / 0.1) + 1):
                        if process.returncode is not None:
                            break
                        if await is_ready(client, base, spec.kind):
                            ready = True
                            break
                        await trio.sleep(0.1)
                if not ready:
                    raise RuntimeError(
                        f"{spec.label} did not start ({' '.join(argv)}):\n{tail(log)}"
                    )
            running = Running(spec, base, process, log)
            warm = await stream_chat(
                running, setup, PROMPTS[0], max_tokens=4, ignore_eos=spec.takes_ignore_eos
            )
            if warm.error is not None:
                raise RuntimeError(f"{spec.label}: warm-up failed: {warm.error}\n{tail(log)}")
            yield running
        finally:
            with trio.move_on_after(35.0, shield=True):
                await stop_process(process)
    finally:
        log_file.close()


@dataclass
class RequestResult:
    """One streamed chat completion. Times are ``time.perf_counter()`` seconds."""

    start: float
    end: float = 0.0
    token_times: list[float] = field(default_factory=list)
    usage_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    aborted: bool = False
    text: str = ""

    @property
    def tokens(self) -> int:
        """Completion tokens from the usage chunk, else the content chunks counted."""
        return self.usage_tokens if self.usage_tokens is not None else len(self.token_times)

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.start if self.token_times else None

    @property
    def latency(self) -> float:
        return self.end - self.start

    @property
    def decode_rate(self) -> float | None:
        """Tokens after the first over the time after the first."""
        ttft = self.ttft
        if ttft is None or self.tokens < 2 or self.latency <= ttft:
            return None
        return (self.tokens - 1) / (self.latency - ttft)


_request_numbers = itertools.count(1)


def chat_body(
    setup: Setup,
    prompt: str,
    *,
    max_tokens: int,
    ignore_eos: bool,
    response_format: dict[str, object] | None = None,
    messages: list[dict[str, str]] | None = None,
) -> dict[str, object]:
    """The request; the prompt starts with a request number unique in this run, so that no
    server can skip the prefill by reusing an earlier request's KV (llama-server's slot prompt
    reuse, llama-cpp-python's prefix reuse, llmtrio's prompt cache). ``messages``, when
    given, are sent as they are instead (the prompt-reuse part)."""
    content = f"Request {next(_request_numbers)}. {prompt}"
    body: dict[str, object] = {
        "model": "bench",
        "messages": messages or [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if response_format is None:
        body["logit_bias"] = setup.logit_bias()
    else:  # the grammar ends the reply: end of generation must stay possible
        body["response_format"] = response_format
    if ignore_eos:
        body["ignore_eos"] = True
    return body


async def stream_chat(
    server: Running,
    setup: Setup,
    prompt: str,
    *,
    max_tokens: int,
    ignore_eos: bool,
    abort_after: int | None = None,
    on_token: Callable[[float], None] | None = None,
    client: httpx.AsyncClient | None = None,
    response_format: dict[str, object] | None = None,
    messages: list[dict[str, str]] | None = None,
) -> RequestResult:
    """Streams one chat completion and records when each content chunk arrived.

    ``abort_after``: close the connection after that many content chunks (the result is then
    ``aborted`` and ``end`` is when the connection was closed). ``on_token`` is called with
    each content chunk's arrival time as it comes (for callers that cancel the stream).
    Errors (HTTP, a broken stream, a server error chunk) end up in ``error``, never raised;
    cancellation propagates.
    """
    if client is None:
        async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as own:
            return await stream_chat(
                server,
                setup,
                prompt,
                max_tokens=max_tokens,
                ignore_eos=ignore_eos,
                abort_after=abort_after,
                on_token=on_token,
                client=own,
                response_format=response_format,
                messages=messages,
            )
    body = chat_body(
        setup,
        prompt,
        max_tokens=max_tokens,
        ignore_eos=ignore_eos,
        response_format=response_format,
        messages=messages,
    )
    result = RequestResult(start=time.perf_counter())
    try:
        async with client.stream(
            "POST", f"{server.base}/v1/chat/completions", json=body
        ) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                result.error = f"HTTP {response.status_code}: {text[:200]}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = f"error chunk: {json.dumps(chunk['error'])[:200]}"
                    break
                usage = chunk.get("usage")
                if usage:
                    result.usage_tokens = int(usage.get("completion_tokens", 0))
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    if delta.get("content") or delta.get("reasoning_content"):
                        result.text += delta.get("content") or ""
                        now = time.perf_counter()
                        result.token_times.append(now)
                        if on_token is not None:
                            on_token(now)
                    if choice.get("finish_reason"):
                        result.finish_reason = choice["finish_reason"]
                if abort_after is not None and len(result.token_times) >= abort_after:
                    result.aborted = True
                    break
    except (httpx.HTTPError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:200]
    finally:
        result.end = time.perf_counter()
    return result


async def sample_rss(pid: int, peak: list[int], interval: float = 0.05) -> None:
    """Appends the process tree's RSS every ``interval`` s until cancelled (bounded: 1 h)."""
    try:
        root = psutil.Process(pid)
    except psutil.Error:
        return
    for _ in range(int(3600 / interval)):
        try:
            procs = [root, *root.children(recursive=True)]
            rss = 0
            for proc in procs:
                with suppress(psutil.Error):
                    rss += proc.memory_info().rss
            peak.append(rss)
        except psutil.Error:
            return
        await trio.sleep(interval)


# A bounded schema as pydantic writes one (Field(ge=, le=, gt=, pattern=, max_length=), Literal,
# date and email formats, a capped list, a nested model): every reply ends. llama-server's
# converter leaves number bounds and the email format unenforced.
GRAMMAR_SCHEMA: dict[str, object] = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 1, "maxLength": 40},
        "mood": {"type": "string", "enum": ["happy", "sad", "calm", "tense"]},
        "rating": {"type": "integer", "minimum": 1, "maximum": 5},
        "confidence": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "published": {"type": "string", "format": "date"},
        "contact": {"type": "string", "format": "email"},
        "keywords": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 4},
        "place": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 24},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": [
        "title", "mood", "rating", "confidence", "published", "contact", "keywords", "place"
    ],
    "additionalProperties": False,
}  # fmt: skip


def find_llama_server(explicit: Path | None) -> Path | None:
    """The given binary, else the one build_llama_server.sh cached (never builds here)."""
    if explicit is not None:
        return explicit
    done = subprocess.run(
        [str(BUILD_SCRIPT), "--print-path"], capture_output=True, text=True, check=False
    )
    path = done.stdout.strip()
    return Path(path) if done.returncode == 0 and path else None
