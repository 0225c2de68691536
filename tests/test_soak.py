"""A short run of benchmarks/soak.py: two ingresses and two worker processes over mutual TLS
on the gemma model, mixed requests with client aborts, a worker SIGKILLed and restarted and
an ingress restarted mid-run: every request is accounted for, the ring ends idle, and the
processes that lived through it hold no more files or threads than before."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parent.parent / "benchmarks" / "soak.py"

pytestmark = pytest.mark.slow


async def test_a_short_soak_with_a_kill_and_a_restart_accounts_for_every_request(
    gemma_path: Path, tmp_path: Path
) -> None:
    spec = importlib.util.spec_from_file_location("soak", SOAK)
    assert spec is not None and spec.loader is not None
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    config = soak.SoakConfig(
        model=gemma_path, requests=150, duration=240, concurrency=6, max_tokens=8, abort=0.15
    )
    result = await soak.soak(config, tmp_path)
    print(result.report())
    assert result.tally.sent == 150
    assert result.tally.unaccounted == []
    assert sum(result.tally.outcomes.values()) == 150
    assert result.tally.outcomes["aborted"] > 0
    assert result.tally.outcomes["completed"] + result.tally.outcomes["completed (stream)"] > 100
    assert (result.kills, result.restarts) == (1, 1)
    assert result.busy == []
    assert result.leaks == []
    assert set(result.exit_codes.values()) == {0}
    assert result.ok
    # w0 lived through the run, and its prompt cache reused the prompts' shared beginnings.
    assert result.caches["w0"]["hits"] > 0
