"""The container image's build steps outside a container: CI runs ``scripts/image-build.sh``,
the script ``deploy/Containerfile`` runs in its two stages
(``tests/deploy/test_container.py`` builds and runs the image itself with podman, from the
same llama-cpp-python wheel: whichever test runs first builds it, once, into
``scripts/llama-wheel.sh``'s cache). The
wheels step builds llama.cpp at the image's CPU baseline (x86-64-v3, whatever this machine's
CPU), the install step makes a venv from those wheels alone, and its ``llmtrio`` runs the
model; the CPU backend it built holds AVX2 code and no AVX-512 instruction, so the image runs on
any x86-64-v3 node."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .._procs import ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(platform.machine() != "x86_64", reason="the CPU baseline is x86-64's"),
]

SCRIPT = ROOT / "scripts" / "image-build.sh"


def steps(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable, "BACKEND": "cpu"}
    result = subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, env=env, check=False, timeout=3600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def test_the_baseline_ignores_this_cpu() -> None:
    flags = steps("flags").stdout.split()
    assert "-DGGML_NATIVE=OFF" in flags and "-DGGML_AVX2=ON" in flags
    assert "-DGGML_AVX512=OFF" in flags
    assert not [flag for flag in flags if "AVX512_" in flag or "AVX_VNNI" in flag]
    assert all(flag.endswith("=OFF") for flag in flags if "AMX" in flag)


def test_the_image_steps_build_and_install_a_working_llmtrio(
    tmp_path: Path, gemma_path: Path
) -> None:
    wheels, prefix = tmp_path / "wheels", tmp_path / "opt" / "llmtrio"
    steps("wheels", str(ROOT), str(wheels))
    names = sorted(path.name for path in wheels.iterdir())
    assert any(name.startswith("llama_cpp_python-0.3.36-") for name in names)
    assert any(name.startswith("llmtrio-") for name in names)
    # The runtime stage: from the wheels alone (pip --no-index), no compiler needed.
    installed = steps("install", str(wheels), str(prefix))
    assert "llama-cpp-python 0.3.36" in installed.stdout
    generated = subprocess.run(
        [str(prefix / "bin" / "llmtrio"), "generate", "--model", str(gemma_path),
         "--prompt", "Hello", "--max-tokens", "4", "--threads", "2"],
        capture_output=True, text=True, check=False, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert generated.returncode == 0, generated.stderr[-3000:]
    assert "completion 4 tokens" in generated.stderr
    # Built for the baseline: AVX2 code (ymm registers), nothing of AVX-512 (zmm registers
    # or mask registers), whatever this machine's CPU has.
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump not found: the instructions built are not checked")
    (backend,) = prefix.glob("lib/python*/site-packages/llama_cpp/lib/libggml-cpu.so")
    code = subprocess.run(
        [objdump, "-d", "--no-show-raw-insn", str(backend)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "%ymm" in code
    assert "%zmm" not in code and "{%k" not in code
