"""Captures what the pinned real clients send, into ``tests/data/clients/`` (see its README):

- Claude Code (``claude -p "Say hi" --output-format json``) and Codex (``codex exec``, with
  a Responses provider; once as configured by default and once with the freeform
  ``apply_patch`` tool) against a recording HTTP server on 127.0.0.1 that answers each
  request with a minimal valid reply; every request is kept (method, path, headers without
  secrets, JSON body);
- each MCP server's tools, listed over stdio (JSON-RPC lines: ``initialize``, the
  ``notifications/initialized`` notification, then ``tools/list`` until no ``nextCursor``).

Each client runs in a fixed scratch folder (``/tmp/llmtrio-capture``: its HOME, its
project), made anew each run, so the paths in the bodies are the same on every machine.

    python -m tests._capture                 # everything
    python -m tests._capture claude codex    # some: claude, codex, mcp
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from ._clients import CLAUDE_CODE, CODEX, MCP_SERVERS, Package, install

__all__ = [
    "FIXTURES",
    "Recorder",
    "codex_home",
    "list_mcp_tools",
    "main",
    "run_claude",
    "run_codex",
    "scratch",
]

FIXTURES = Path(__file__).resolve().parent / "data" / "clients"
SCRATCH = Path("/tmp/llmtrio-capture")
_SECRET_HEADERS = frozenset({"authorization", "x-api-key", "cookie", "proxy-authorization"})
_MODEL = "llmtrio-test"


def _sse(events: list[tuple[str, dict[str, Any]]]) -> bytes:
    return b"".join(
        f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events
    )


def _anthropic_reply(body: dict[str, Any]) -> tuple[str, bytes]:
    usage = {"input_tokens": 10, "output_tokens": 1}
    message = {
        "id": "msg_capture",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", _MODEL),
        "content": [{"type": "text", "text": "hi"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": usage,
    }
    if not body.get("stream"):
        return "application/json", json.dumps(message).encode()
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 0}}
    return "text/event-stream", _sse(
        [
            ("message_start", {"type": "message_start", "message": start}),
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                },
            ),
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": "hi"},
                },
            ),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": 1},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ]
    )


def _responses_reply(body: dict[str, Any]) -> tuple[str, bytes]:
    item = {
        "id": "msg_capture",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "hi", "annotations": []}],
    }
    usage = {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 1,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 11,
    }
    response = {
        "id": "resp_capture",
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": body.get("model", _MODEL),
        "output": [item],
        "usage": usage,
    }
    if not body.get("stream"):
        return "application/json", json.dumps(response).encode()
    created = {**response, "status": "in_progress", "output": [], "usage": None}
    return "text/event-stream", _sse(
        [
            ("response.created", {"type": "response.created", "response": created}),
            (
                "response.output_item.added",
                {"type": "response.output_item.added", "output_index": 0, "item": item},
            ),
            (
                "response.output_text.delta",
                {
                    "type": "response.output_text.delta",
                    "item_id": "msg_capture",
                    "output_index": 0,
                    "content_index": 0,
                    "delta": "hi",
                },
            ),
            (
                "response.output_item.done",
                {"type": "response.output_item.done", "output_index": 0, "item": item},
            ),
            ("response.completed", {"type": "response.completed", "response": response}),
        ]
    )


class Recorder:
    """An HTTP server on 127.0.0.1 (port 0) that keeps every request and answers
    Anthropic's ``/v1/messages`` and OpenAI's ``/v1/responses`` with a minimal valid reply
    (streamed when asked), ``/v1/models`` with one model, and anything else with a 404."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _record(self) -> dict[str, Any]:
                size = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(size) if size else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                pairs = [(k.lower(), v) for k, v in self.headers.items()]
                headers = {k: v for k, v in pairs if k not in _SECRET_HEADERS}
                if "host" in headers:  # the recorder's port, new each run
                    headers["host"] = "127.0.0.1:PORT"
                entry = {"method": self.command, "path": self.path, "headers": headers}
                entry["body"] = body
                recorder.requests.append(entry)
                return body if isinstance(body, dict) else {}

            def _send(self, status: int, kind: str, data: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._record()
                if self.path.split("?")[0].rstrip("/").endswith("/models"):
                    models = {"object": "list", "data": [{"id": _MODEL, "object": "model"}]}
                    self._send(200, "application/json", json.dumps(models).encode())
                else:
                    self._send(404, "application/json", b'{"error": "not found"}')

            def do_POST(self) -> None:
                body = self._record()
                path = self.path.split("?")[0]
                if path.endswith("/messages/count_tokens"):
                    self._send(200, "application/json", b'{"input_tokens": 10}')
                elif path.endswith("/messages"):
                    self._send(200, *_anthropic_reply(body))
                elif path.endswith("/responses"):
                    self._send(200, *_responses_reply(body))
                else:
                    self._send(404, "application/json", b'{"error": "not found"}')

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    @contextmanager
    def serving(self) -> Iterator[Recorder]:
        thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()
            thread.join()


def scratch(root: Path = SCRATCH) -> tuple[Path, Path]:
    """A fresh HOME and project folder in ``root`` (by default the fixed paths captures use,
    so the paths in the bodies are the same on every machine)."""
    shutil.rmtree(root, ignore_errors=True)
    home, project = root / "home", root / "project"
    home.mkdir(parents=True)
    project.mkdir()
    (project / "README.md").write_text("# capture\n\nA scratch project.\n")
    return home, project


def _environment(home: Path, **extra: str) -> dict[str, str]:
    keep = ("PATH", "LANG", "LC_ALL", "TERM")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(HOME=str(home), TMPDIR=str(home.parent), **extra)
    return env


def _run(
    argv: list[str], cwd: Path, env: dict[str, str], stdin: str | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        input=stdin,
        stdin=subprocess.DEVNULL if stdin is None else None,
        timeout=timeout,
        check=False,
    )


def run_claude(
    url: str,
    args: list[str],
    home: Path,
    project: Path,
    *,
    stdin: str | None = None,
    timeout: float = 300,
    **env: str,
) -> subprocess.CompletedProcess[str]:
    """``claude ARGS`` in ``project`` against the Messages API at ``url``, with only ``PATH``,
    ``LANG``, ``LC_ALL`` and ``TERM`` of this environment, no telemetry, and ``env``."""
    claude = install(CLAUDE_CODE)
    environment = _environment(
        home,
        ANTHROPIC_BASE_URL=url,
        ANTHROPIC_API_KEY="dummy",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        DISABLE_TELEMETRY="1",
        DISABLE_AUTOUPDATER="1",
        **env,
    )
    return _run([str(claude), *args], project, environment, stdin, timeout)


def capture_claude(package: Package = CLAUDE_CODE) -> dict[str, Any]:
    """The requests of ``claude -p "Say hi" --output-format json``."""
    home, project = scratch()
    args = ["-p", "Say hi", "--output-format", "json"]
    with Recorder().serving() as recorder:
        done = run_claude(recorder.url, args, home, project)
    return _document(package, ["claude", *args], done, recorder.requests)


_CODEX_CONFIG = """\
model = "{model}"
model_provider = "llmtrio"
approval_policy = "never"
sandbox_mode = "workspace-write"
include_apply_patch_tool = true

[model_providers.llmtrio]
name = "llmtrio"
base_url = "{url}/v1"
wire_api = "responses"
env_key = "LLMTRIO_API_KEY"
"""


def _codex_model(slug: str) -> dict[str, Any]:
    """A model catalog entry (Codex's ``model_catalog_json``) whose ``apply_patch`` tool is
    the freeform one, as Codex's own GPT-5 family entries have it."""
    return {
        "slug": slug,
        "display_name": slug,
        "description": "llmtrio test model",
        "default_reasoning_level": "medium",
        "supported_reasoning_levels": [{"effort": "medium", "description": "Medium"}],
        "shell_type": "shell_command",
        "visibility": "list",
        "supported_in_api": True,
        "priority": 1,
        "base_instructions": "",
        "supports_reasoning_summaries": False,
        "default_reasoning_summary": "none",
        "support_verbosity": False,
        "default_verbosity": None,
        "apply_patch_tool_type": "freeform",
        "truncation_policy": {"mode": "tokens", "limit": 10000},
        "supports_parallel_tool_calls": True,
        "context_window": 32768,
        "effective_context_window_percent": 95,
        "experimental_supported_tools": [],
        "input_modalities": ["text"],
        "supports_search_tool": False,
    }


def codex_home(home: Path, url: str, model: str, *, freeform: bool = False) -> Path:
    """A ``CODEX_HOME`` in ``home`` whose ``config.toml`` names a Responses provider at
    ``url`` serving ``model`` (``freeform``: and ``apply_patch_freeform`` on, with ``model`` in
    a ``model_catalog_json`` whose entry asks for the freeform tool)."""
    folder = home / ".codex"
    folder.mkdir(exist_ok=True)
    config = _CODEX_CONFIG.format(model=model, url=url)
    if freeform:
        catalog = folder / "catalog.json"
        catalog.write_text(json.dumps({"models": [_codex_model(model)]}, indent=1))
        config = f'model_catalog_json = "{catalog}"\n' + config
        config += "\n[features]\napply_patch_freeform = true\n"
    (folder / "config.toml").write_text(config)
    return folder


def run_codex(
    url: str,
    model: str,
    args: list[str],
    home: Path,
    project: Path,
    *,
    freeform: bool = False,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """``codex ARGS`` in ``project`` with a Responses provider at ``url`` serving ``model``
    (see :func:`codex_home`)."""
    codex = install(CODEX)
    folder = codex_home(home, url, model, freeform=freeform)
    env = _environment(home, CODEX_HOME=str(folder), LLMTRIO_API_KEY="dummy")
    return _run([str(codex), *args], project, env, timeout=timeout)


def capture_codex(package: Package = CODEX, *, freeform: bool = False) -> dict[str, Any]:
    """The requests of ``codex exec "Say hi"`` with a Responses provider (``freeform``: and
    ``apply_patch_freeform`` on, so ``apply_patch`` is a ``custom`` tool with a Lark
    grammar)."""
    home, project = scratch()
    args = ["exec", "--skip-git-repo-check", "Say hi"]
    with Recorder().serving() as recorder:
        done = run_codex(recorder.url, _MODEL, args, home, project, freeform=freeform)
    folder = home / ".codex"
    config = (folder / "config.toml").read_text()
    document = _document(package, ["codex", *args], done, recorder.requests)
    document["config.toml"] = config.replace(recorder.url, "http://127.0.0.1:PORT")
    if freeform:
        document["catalog.json"] = json.loads((folder / "catalog.json").read_text())
    return document


def _document(
    package: Package, argv: list[str], done: subprocess.CompletedProcess[str], requests: list[Any]
) -> dict[str, Any]:
    if not requests:
        raise RuntimeError(
            f"{package.name} sent nothing (exit {done.returncode}):\n{done.stdout}\n{done.stderr}"
        )
    return {
        "client": package.package,
        "version": package.version,
        "command": argv,
        "exit_code": done.returncode,
        "requests": requests,
    }


def _read_reply(process: subprocess.Popen[str], lines: queue.Queue[str], wanted: int) -> Any:
    deadline = time.monotonic() + 60
    while True:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            if process.poll() is None and time.monotonic() < deadline:
                continue
            raise RuntimeError(f"no reply to request {wanted} (exit {process.poll()})") from None
        try:
            message = json.loads(line)
        except ValueError:
            continue  # a server's log line on stdout
        if message.get("id") == wanted:
            if "error" in message:
                raise RuntimeError(f"request {wanted} failed: {message['error']}")
            return message["result"]


def list_mcp_tools(package: Package) -> dict[str, Any]:
    """``package``'s MCP server started over stdio, asked for its tools."""
    executable = install(package)
    home, project = scratch()
    env = _environment(home)
    argv = package.argv(project)
    argv[0] = str(executable)
    process = subprocess.Popen(
        argv,
        cwd=project,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdin is not None and process.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    stdout = process.stdout
    threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True).start()

    def send(message: dict[str, Any]) -> None:
        assert process.stdin is not None
        process.stdin.write(json.dumps(message) + "\n")
        process.stdin.flush()

    try:
        send(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "llmtrio-capture", "version": "1"},
                },
            }
        )
        server = _read_reply(process, lines, 1)
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        tools: list[Any] = []
        cursor = None
        for request_id in range(2, 100):
            params = {"cursor": cursor} if cursor else {}
            send({"jsonrpc": "2.0", "id": request_id, "method": "tools/list", "params": params})
            page = _read_reply(process, lines, request_id)
            tools += page.get("tools", [])
            cursor = page.get("nextCursor")
            if not cursor:
                break
    finally:
        process.kill()
        process.wait()
    return {
        "server": package.package,
        "registry": package.registry,
        "version": package.version,
        "command": [package.command, *package.args],
        "serverInfo": server.get("serverInfo"),
        "protocolVersion": server.get("protocolVersion"),
        "tools": tools,
    }


def _write(name: str, document: dict[str, Any]) -> None:
    path = FIXTURES / name
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(document, indent=1, ensure_ascii=False) + "\n"
    path.write_text(text)
    print(f"wrote {path.relative_to(FIXTURES.parent.parent.parent)}", flush=True)


def main(parts: list[str]) -> None:
    parts = parts or ["claude", "codex", "mcp"]
    if "claude" in parts:
        _write(f"claude-code-{CLAUDE_CODE.version}.messages.json", capture_claude())
    if "codex" in parts:
        _write(f"codex-{CODEX.version}.responses.json", capture_codex())
        freeform = capture_codex(freeform=True)
        _write(f"codex-{CODEX.version}-freeform.responses.json", freeform)
        for tool in freeform["requests"][-1]["body"]["tools"]:
            if tool.get("type") == "custom" and tool.get("format", {}).get("syntax") == "lark":
                lark = FIXTURES / f"codex-{CODEX.version}-{tool['name']}.lark"
                lark.write_text(tool["format"]["definition"])
                print(f"wrote {lark.name}", flush=True)
    if "mcp" in parts:
        for package in MCP_SERVERS:
            _write(f"mcp/{package.name}-{package.version}.tools.json", list_mcp_tools(package))
    shutil.rmtree(SCRATCH, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
