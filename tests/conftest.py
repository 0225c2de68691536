"""Fixtures shared by the tests: the real test models (and the embedding reference), and a
live server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmtrio.engine import demo_model_path
from llmtrio.ring import RingConfig
from llmtrio.web import ServeConfig

from ._helpers import engine_config
from ._lora import Lora, gemma_shapes, qwen35_shapes, write_lora
from ._qwen35_real import write_qwen35_real
from ._rerankers import CLS, LAST, write_minilm_reranker, write_qwen3_reranker
from ._server import LiveServer, start_server

# The test models the repository carries (see data/README-qwen35.md, data/README-minilm.md).
DATA = Path(__file__).resolve().parent / "data"
QWEN35_TINY = DATA / "qwen35-tiny-random.gguf"
# The embedding test model and the vectors sentence-transformers gives for its reference inputs.
MINILM = DATA / "all-MiniLM-L6-v2-Q8_0.gguf"
MINILM_REFERENCE = DATA / "minilm-reference.json"
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
def qwen35_real_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The qwen35 tiny random model with the default model's own tokenizer (Qwen's 151,936
    tokens, its added tokens) and chat template (Qwen3.5's), 167 MB, written once per test
    session (see _qwen35_real.py) and removed at its end."""
    path = write_qwen35_real(tmp_path_factory.mktemp("qwen35-real") / "qwen35-real.gguf")
    yield path
    path.unlink()


@pytest.fixture(scope="session")
def qwen35_loras(tmp_path_factory: pytest.TempPathFactory) -> tuple[Lora, Lora]:
    """Two LoRA adapters of the qwen35 tiny model (tests/_lora.py), written once."""
    folder = tmp_path_factory.mktemp("qwen35-loras")
    shapes = qwen35_shapes()
    return (
        write_lora(folder / "a.gguf", "qwen35", shapes, seed=1, std=0.15),
        write_lora(folder / "b.gguf", "qwen35", shapes, seed=2, std=0.15),
    )


@pytest.fixture(scope="session")
def gemma_loras(tmp_path_factory: pytest.TempPathFactory, gemma_path: Path) -> tuple[Lora, Lora]:
    """Two LoRA adapters of the gemma test model (tests/_lora.py), written once."""
    folder = tmp_path_factory.mktemp("gemma-loras")
    shapes = gemma_shapes(gemma_path)
    return (
        write_lora(folder / "a.gguf", "gemma3", shapes, seed=1),
        write_lora(folder / "b.gguf", "gemma3", shapes, seed=2),
    )


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """sentence-transformers/all-MiniLM-L6-v2 (BERT, mean pooling, 384 dimensions), Q8_0."""
    return MINILM


@pytest.fixture(scope="session")
def minilm_rerank_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MiniLM as a cross-encoder: rank pooling, one label, a random ``cls`` and
    ``cls.output`` head (26 MB, written once per test session; see _rerankers.py)."""
    return write_minilm_reranker(tmp_path_factory.mktemp("rerank") / "minilm-rerank.gguf")


@pytest.fixture(scope="session")
def minilm_cls_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same weights as ``minilm_rerank_path``, pooled as the ``[CLS]`` state: what the
    cross-encoder's head reads."""
    path = tmp_path_factory.mktemp("rerank") / "minilm-cls.gguf"
    return write_minilm_reranker(path, pooling=CLS)


@pytest.fixture(scope="session")
def qwen3_rerank_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen3 reranker: labels yes/no, ``cls.output``, the ``rerank`` template
    (26 MB, written once per test session; see _rerankers.py)."""
    return write_qwen3_reranker(tmp_path_factory.mktemp("rerank") / "qwen3-rerank.gguf")


@pytest.fixture(scope="session")
def qwen3_last_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same weights as ``qwen3_rerank_path``, pooled as the last token's state."""
    path = tmp_path_factory.mktemp("rerank") / "qwen3-last.gguf"
    return write_qwen3_reranker(path, pooling=LAST)


@pytest.fixture(scope="session")
def minilm_reference() -> dict[str, Any]:
    """The inputs and the vectors sentence-transformers gives for them (normalized)."""
    data: dict[str, Any] = json.loads(MINILM_REFERENCE.read_text())
    return data


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def live_server(gemma_path: Path) -> Iterator[LiveServer]:
    """The gemma test model behind ``llmtrio serve`` on a free loopback port: 4 slots of
    512 tokens, up to 16 parked requests. Without speculative decoding: its tests compare
    greedy runs token for token, and drafts (whose number follows measured step times)
    change batch shapes and with them near-ties
    (tests/engine/test_spec_decode_end_to_end.py serves with drafts)."""
    server = start_server(
        engine_config(gemma_path, max_inflight=4, ctx_size=512, spec=None),
        ServeConfig(host="127.0.0.1", port=0, ring=RingConfig(max_streams=16), graceful_timeout=2),
    )
    yield server
    server.stop()


# The servers the real clients run against (tests/clients/), once per session.
from ._client_targets import _ring_qwen35, _serve_gemma, _serve_qwen35, client_target  # noqa: E402, F401
