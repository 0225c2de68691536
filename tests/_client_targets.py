"""The servers the real clients run against (``tests/clients/``), each once per test
session: ``llmtrio serve`` on gemma (llama.cpp's built-in gemma template: tools described
Hermes-style) and on the Qwen3.5 real-template test model (its own template: a system message
only first, calls in the XML form), and a ring, an ingress with a remote worker over mutual
TLS, on the Qwen3.5 one.

One slot each, one thread, a context that holds Claude Code's prompt (about 16,300 tokens
with gemma's tokenizer, 21,000 with Qwen's), and 32 tokens of output for a request that names
no limit (Codex names none): the tiny models' replies are noise, so what is checked is the
protocol. Registered in ``conftest.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest

from llmtrio.ring import RingConfig
from llmtrio.web import ServeConfig
from llmtrio.worker import RequestLimits

from ._clients import InstallError, Package, install
from ._helpers import engine_config
from ._procs import Ring
from ._server import start_server

__all__ = ["CONTEXT", "DEFAULT_MAX_TOKENS", "TARGETS", "Target", "client_target", "installed"]

#: Each target's context: Claude Code's prompt and a reply fit, a prompt of 30,000 words not.
CONTEXT = 24576
#: What a request that names no output limit generates at most: room for a short JSON reply
#: and the whitespace the grammar lets a model put between its tokens.
DEFAULT_MAX_TOKENS = 32
TARGETS = ("gemma", "qwen35", "ring-qwen35")


@attrs.frozen
class Target:
    """A server the clients run against: ``url`` (no ``/v1``), the ``model`` it serves."""

    name: str
    url: str
    model: str

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def models(self) -> list[dict[str, Any]]:
        data: list[dict[str, Any]] = httpx.get(self.v1 + "/models", timeout=10).json()["data"]
        return data


def installed(package: Package) -> Path:
    """``package``'s executable, installed into the clients' cache first when it is not; the
    test is skipped, saying why, only when its registry cannot be reached."""
    try:
        return install(package)
    except InstallError as error:
        if error.offline:
            pytest.skip(f"{package.package} {package.version}: its registry cannot be reached")
        raise


@pytest.fixture(scope="session")
def _serve_gemma(gemma_path: Path) -> Iterator[Target]:
    yield from _serve("gemma", gemma_path)


@pytest.fixture(scope="session")
def _serve_qwen35(qwen35_real_path: Path) -> Iterator[Target]:
    yield from _serve("qwen35", qwen35_real_path)


def _serve(name: str, model: Path) -> Iterator[Target]:
    server = start_server(
        engine_config(model, max_inflight=1, ctx_size=CONTEXT, threads=1),
        ServeConfig(host="127.0.0.1", port=0, ring=RingConfig(max_streams=8), graceful_timeout=2),
        RequestLimits(default_max_tokens=DEFAULT_MAX_TOKENS),
    )
    yield Target(name, server.url, model.stem)
    server.stop()


@pytest.fixture(scope="session")
def _ring_qwen35(
    tmp_path_factory: pytest.TempPathFactory, qwen35_real_path: Path
) -> Iterator[Target]:
    tmp = tmp_path_factory.mktemp("client-ring")
    with Ring.opened(tmp, qwen35_real_path) as ring:
        ingress = ring.ingress("ingress", f"--default-model={qwen35_real_path.stem}")
        ring.worker(
            "w",
            [ingress],
            None,
            "--max-inflight=1",
            f"--ctx-size={CONTEXT}",
            f"--default-max-tokens={DEFAULT_MAX_TOKENS}",
            "--no-spec",
        )
        ingress.wait_workers({"w"}, timeout=180)
        yield Target("ring-qwen35", ingress.url, qwen35_real_path.stem)


@pytest.fixture(params=TARGETS)
def client_target(request: pytest.FixtureRequest) -> Target:
    """Each target in turn (its server started once per session, on first use)."""
    name = {"gemma": "_serve_gemma", "qwen35": "_serve_qwen35", "ring-qwen35": "_ring_qwen35"}
    target: Target = request.getfixturevalue(name[request.param])
    return target
