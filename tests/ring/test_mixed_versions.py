"""A rolling upgrade mixes versions: the manifests roll the ingresses and the workers as two
Deployments, so for a while workers of the previous release attach to new ingresses, and new
workers to ingresses of the previous release. Both must serve.

The previous release is this repository at ``PREVIOUS`` (the commit issue 19 started from:
protocol version 1, heartbeats without the KV-cache fields), run from a ``git archive`` of it
with the same installed dependencies; skipped where the clone does not have that commit.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path

import httpx
import pytest

from llmtrio.api import CHAT_PATH

from .._procs import ROOT, Ingress, Ring

pytestmark = pytest.mark.slow

PREVIOUS = "4b3693f8ea2b8bd7f72c5e01b834dbdd982dc023"


@pytest.fixture
def previous(tmp_path: Path) -> Path:
    """The previous release's ``llmtrio`` package, unpacked; its parent is a PYTHONPATH."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("no git repository to take the previous release from")
    archive = subprocess.run(
        [git, "-C", str(ROOT), "archive", PREVIOUS, "llmtrio"], capture_output=True, check=False
    )
    if archive.returncode:
        pytest.skip(f"the previous release {PREVIOUS[:10]} is not in this clone (shallow?)")
    folder = tmp_path / "previous"
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(folder, filter="data")
    return folder


@pytest.fixture
def ring(tmp_path: Path, gemma_path: Path) -> Iterator[Ring]:
    with Ring.opened(tmp_path, gemma_path) as ring:
        yield ring


def serves(ingress: Ingress) -> str:
    """A streamed and a JSON chat through ``ingress``, both whole; the worker that served."""
    body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 6}
    with httpx.Client(timeout=120) as client:
        plain = client.post(ingress.url + CHAT_PATH, json=body)
        assert plain.status_code == 200, plain.text
        assert plain.json()["usage"]["completion_tokens"] >= 1
        streamed = client.post(ingress.url + CHAT_PATH, json={**body, "stream": True})
        assert streamed.status_code == 200, streamed.text
        assert streamed.text.rstrip().endswith("data: [DONE]") and '"error"' not in streamed.text
    return str(plain.headers["x-llmtrio-worker"]).split("#")[0]


def test_old_workers_on_new_ingresses_and_new_workers_on_old_ingresses(
    ring: Ring, previous: Path
) -> None:
    new_ingress = ring.ingress("new-ingress")
    old_ingress = ring.ingress("old-ingress", python_path=previous)
    ring.worker("old-worker", [new_ingress], python_path=previous)
    ring.worker("new-worker", [old_ingress])
    new_ingress.wait_workers({"old-worker"})
    old_ingress.wait_workers({"new-worker"})
    assert serves(new_ingress) == "old-worker"
    assert serves(old_ingress) == "new-worker"
    # The new ingress routes by model: the old worker's claims name no model, so they take
    # the model its Attach listed; an unknown model is a 404 there, before any worker sees it.
    # (The new worker's claims name its model; the old ingress ignores the field.)
    gemma = ring.gemma.stem
    for ingress, worker in ((new_ingress, "old-worker"), (old_ingress, "new-worker")):
        body = {"model": gemma, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        named = httpx.post(ingress.url + CHAT_PATH, json=body, timeout=120)
        assert named.status_code == 200, named.text
        assert named.headers["x-llmtrio-worker"].split("#")[0] == worker
    unknown = httpx.post(new_ingress.url + CHAT_PATH, json={**body, "model": "nope"}, timeout=30)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    # The new ingress reads the old worker's heartbeats, KV fields missing, as reporting no
    # KV cache (a new worker's 2 slots of 2048 cells would be 256 blocks of 16).
    metrics = httpx.get(new_ingress.url + "/metrics", timeout=10).text
    assert re.search(r"^vllm:kv_cache_usage_perc 0\.0$", metrics, re.M), metrics
    assert 'vllm:cache_config_info{block_size="16",num_gpu_blocks="0"} 1.0' in metrics
