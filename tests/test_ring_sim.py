"""A short run of benchmarks/ring_sim.py: churn, ingress restarts, bursts and slow clients
over the real control channel lose no request."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

SIM = Path(__file__).resolve().parent.parent / "benchmarks" / "ring_sim.py"


async def test_a_churning_ring_loses_no_request() -> None:
    spec = importlib.util.spec_from_file_location("ring_sim", SIM)
    assert spec is not None and spec.loader is not None
    sim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sim)
    args = argparse.Namespace(
        seconds=4, ingresses=2, workers=3, slots=2, token_ms=5, churn=0.7, restart=1.5, seed=7
    )
    stats, runs = await sim.simulate(args)
    assert stats.sent > 50
    assert stats.lost == []
    assert stats.sent == (
        stats.completed
        + stats.failed_after_first_token
        + len(stats.failed_after_head)
        + stats.cancelled
        + stats.full
    )
    assert sum(runs.values()) >= stats.completed
