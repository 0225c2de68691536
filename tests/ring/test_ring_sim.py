"""A short run of benchmarks/ring_sim.py: churn, ingress restarts, bursts and slow clients
over the real control channel lose no request."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Any

import pytest

SIM = Path(__file__).resolve().parents[2] / "benchmarks" / "ring_sim.py"


def load_sim() -> Any:
    spec = importlib.util.spec_from_file_location("ring_sim", SIM)
    assert spec is not None and spec.loader is not None
    sim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sim)
    return sim


@pytest.mark.parametrize(
    ("models", "layout"), [(0, "disjoint"), (2, "disjoint"), (2, "overlap")], ids=str
)
async def test_a_churning_ring_loses_no_request(models: int, layout: str) -> None:
    """Unrouted; two models on disjoint worker sets; two on overlapping ones (workers listing
    two models claim without naming one, as workers of the previous version do)."""
    sim = load_sim()
    args = argparse.Namespace(
        seconds=4 if not models else 3,
        ingresses=2,
        workers=3 if not models else 4,
        slots=2,
        token_ms=5,
        # With models each has fewer workers, so churn is gentler: a request is failed once
        # its workers died three times before its head (max_assignments), which on a loaded
        # machine 0.7 s churn over two workers per model can do.
        churn=0.7 if not models else 1.5,
        restart=1.5,
        seed=7,
        models=models,
        layout=layout,
    )
    stats, runs = await sim.simulate(args)
    assert stats.misrouted == []
    if models:
        assert set(stats.by_model) == {"m0", "m1"}
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
