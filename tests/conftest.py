"""Fixtures shared by the tests: the two real test models, and a live server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llmtrio.engine import demo_model_path
from llmtrio.ring import RingConfig
from llmtrio.web import ServeConfig

from ._helpers import engine_config
from ._server import LiveServer, start_server

# A copy of shared/test-models/qwen35-tiny-random.gguf (see data/README-qwen35.md).
QWEN35_TINY = Path(__file__).resolve().parent / "data" / "qwen35-tiny-random.gguf"
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """google/gemma-3-270m (base, Q4_K_M), assembled once from its PyPI package."""
    return demo_model_path()


@pytest.fixture(scope="session")
def qwen35_path() -> Path:
    """A 5 MB random-weight model of the qwen35 architecture (the default model's)."""
    return QWEN35_TINY


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def live_server(gemma_path: Path) -> Iterator[LiveServer]:
    """The gemma test model behind ``llmtrio serve`` on a free loopback port: 4 slots of
    512 tokens, up to 16 parked requests. Without speculative decoding: its tests compare
    greedy runs token for token, and drafts (whose number follows measured step times)
    change batch shapes and with them near-ties (tests/test_speculation.py serves with
    drafts)."""
    server = start_server(
        engine_config(gemma_path, max_inflight=4, ctx_size=512, spec=None),
        ServeConfig(host="127.0.0.1", port=0, ring=RingConfig(max_streams=16), graceful_timeout=2),
    )
    yield server
    server.stop()
