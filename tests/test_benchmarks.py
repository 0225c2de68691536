"""Every benchmark still runs: each script answers ``--help`` (importing all it uses), and the
shell scripts parse. A benchmark that rots (an import of a name that is gone) fails here,
not on the day its figures are wanted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


# A module whose name starts with "_" is a script's helper (data, shared code), not a script.
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_each_benchmark_answers_help(script: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout


@pytest.mark.parametrize("script", sorted(BENCHMARKS.glob("*.sh")), ids=lambda p: p.name)
def test_each_benchmark_script_parses(script: Path) -> None:
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)
