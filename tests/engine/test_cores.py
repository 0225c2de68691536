"""The cores a process may use (affinity and cgroup quota) and the start-up warning when
llama.cpp's threads and llmtrio's own exceed them (issue 48), read from made-up cgroup
files; the warning's wiring through a served model."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest

import llmtrio.engine
from llmtrio.engine import Cores, EngineConfig, oversubscription, read_cores, usable_cores
from llmtrio.engine._cores import cgroup_cpu_quota
from llmtrio.engine.llama import LlamaModel
from llmtrio.web import ServeConfig

from .._core_helpers import core_request, open_core, run_core
from .._helpers import engine_config
from .._server import start_server


def reader(files: dict[str, str]) -> Callable[[str], str | None]:
    return files.get


def test_a_cgroup_v2_quota_in_cpus() -> None:
    files = {"/sys/fs/cgroup/cpu.max": "200000 100000\n"}
    assert cgroup_cpu_quota("0::/\n", reader(files)) == 2.0
    assert cgroup_cpu_quota("0::/\n", reader({"/sys/fs/cgroup/cpu.max": "max 100000\n"})) is None


def test_the_smallest_quota_above_a_cgroup_wins() -> None:
    files = {
        "/sys/fs/cgroup/kubepods/pod1/ctr/cpu.max": "max 100000",
        "/sys/fs/cgroup/kubepods/pod1/cpu.max": "150000 100000",
        "/sys/fs/cgroup/kubepods/cpu.max": "400000 100000",
    }
    assert cgroup_cpu_quota("0::/kubepods/pod1/ctr\n", reader(files)) == 1.5


def test_a_cgroup_v1_quota() -> None:
    text = "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n"
    files = {
        "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "100000\n",
        "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
    }
    assert cgroup_cpu_quota(text, reader(files)) == 1.0
    files["/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us"] = "-1\n"
    assert cgroup_cpu_quota(text, reader(files)) is None


def test_no_readable_cgroup_is_no_quota() -> None:
    assert cgroup_cpu_quota("0::/a\n", reader({})) is None
    assert cgroup_cpu_quota("", reader({})) is None
    assert cgroup_cpu_quota("0::/\n", reader({"/sys/fs/cgroup/cpu.max": "oops"})) is None


def test_usable_cores_are_the_affinity_under_the_quota() -> None:
    assert Cores(64, 2.0).usable == 2  # a container given 2 CPUs on a 64-core host
    assert Cores(2).usable == 2
    assert Cores(4, 1.5).usable == 1
    assert Cores(1, 0.5).usable == 1
    assert Cores(2, 8.0).usable == 2


def test_this_process_reads_its_affinity() -> None:
    cores = read_cores()
    assert cores.affinity == len(os.sched_getaffinity(0))
    assert usable_cores() == cores.usable
    assert EngineConfig().threads == cores.usable  # the default: what this process may use


def test_the_warning_says_what_exceeds_and_what_fits() -> None:
    assert oversubscription(1, Cores(2)) is None
    message = oversubscription(2, Cores(64, 2.0))
    assert message is not None
    assert "2 llama.cpp thread(s)" in message and "2 usable" in message
    assert "quota of 2 CPUs" in message and "1 thread(s) would leave a core" in message
    assert oversubscription(4, Cores(8)) is None


def test_serve_warns_at_start_when_threads_exceed_the_cores(
    gemma_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(llmtrio.engine, "read_cores", lambda: Cores(4, 1.0))
    with caplog.at_level(logging.WARNING, logger="llmtrio.serve"):
        server = start_server(
            engine_config(gemma_path, threads=1, max_inflight=1),
            ServeConfig(host="127.0.0.1", port=0),
        )
        server.stop()
    warnings = [r.getMessage() for r in caplog.records if r.name == "llmtrio.serve"]
    assert any("exceed the cores" in w and "quota of 1 CPUs" in w for w in warnings)


def test_the_chat_core_measures_its_steps_on_fewer_threads_too(qwen35_path: Path) -> None:
    model = LlamaModel(qwen35_path, slots=2, ctx_size=256, threads=2, n_batch=64)
    try:
        core, stats = open_core(model, threads=2, spec=None)
        run = run_core(core, [core_request(0, list(range(10, 40)), 12)])
        assert len(run.tokens[0]) == 12
        # Each size of step ran on the configured 2 threads first, then once on 1: the
        # faster count is the one used (a busy machine: 1; a quiet one: 2).
        assert 1 <= stats.fewer_threads_steps < stats.steps
    finally:
        model.close()
