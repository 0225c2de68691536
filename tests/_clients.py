"""The real clients the tests capture from and run, pinned: Claude Code and Codex from npm,
and MCP servers from npm and PyPI.

:func:`install` puts a package in ``~/.cache/llmtrio/clients/<name>-<version>/`` (npm's
``--prefix`` tree, or a virtual environment for PyPI's), once: a tree that finished
installing holds ``.installed``, and a later call only returns its executable. Installs are
serialized by a lock file, so parallel test processes share one install. Moving a pin is
editing :data:`CLAUDE_CODE`, :data:`CODEX` or :data:`MCP_SERVERS` here, then refreshing the
captured fixtures (``python -m tests._capture``, see ``tests/data/clients/README.md``).

    python -m tests._clients            # install every pinned client
    python -m tests._clients codex      # one, by name
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import attrs

__all__ = [
    "AGENTS_SDK",
    "CACHE",
    "CLAUDE_CODE",
    "CLIENTS",
    "CODEX",
    "LANGCHAIN_OPENAI",
    "LLAMA_CPP_PYTHON",
    "MCP_SERVERS",
    "InstallError",
    "Package",
    "install",
    "llama_templates",
]

#: Where installed clients live (``LLMTRIO_CLIENTS_CACHE`` moves it).
CACHE = Path(
    os.environ.get("LLMTRIO_CLIENTS_CACHE", Path.home() / ".cache" / "llmtrio" / "clients")
)

#: Words in an installer's output that mean the registry could not be reached (not that the
#: package or version is wrong).
_OFFLINE = (
    "ENOTFOUND",
    "EAI_AGAIN",
    "ECONNREFUSED",
    "ECONNRESET",
    "ETIMEDOUT",
    "network",
    "Temporary failure in name resolution",
    "Failed to establish a new connection",
    "Max retries exceeded",
)


class InstallError(RuntimeError):
    """A package could not be installed; ``offline``: because its registry could not be
    reached (a test skips then, saying so), not because of the package."""

    def __init__(self, message: str, *, offline: bool) -> None:
        super().__init__(message)
        self.offline = offline


@attrs.frozen
class Package:
    """One pinned package: ``name`` names its fixtures and its cache folder; ``command`` is
    the executable it installs; ``args`` what an MCP server is started with (``{root}``
    stands for a scratch folder the caller gives)."""

    name: str
    registry: Literal["npm", "pypi"]
    package: str
    version: str
    command: str
    args: tuple[str, ...] = ()

    @property
    def home(self) -> Path:
        return CACHE / f"{self.name}-{self.version}"

    @property
    def executable(self) -> Path:
        if self.registry == "npm":
            return self.home / "node_modules" / ".bin" / self.command
        return self.home / "bin" / self.command

    def argv(self, root: Path) -> list[str]:
        """The command line that starts it (an MCP server: over stdio)."""
        return [str(self.executable), *(a.replace("{root}", str(root)) for a in self.args)]


def _npm(name: str, package: str, version: str, command: str, *args: str) -> Package:
    return Package(name, "npm", package, version, command, args)


def _pypi(name: str, version: str, *args: str) -> Package:
    return Package(name, "pypi", name, version, name, args)


def _library(name: str, version: str) -> Package:
    """A Python library, in a virtual environment of its own: run by that environment's
    ``python`` (a script beside the tests, ``tests/_drive_*.py``, drives it)."""
    return Package(name, "pypi", name, version, "python")


#: Claude Code, run in print mode against ``ANTHROPIC_BASE_URL``.
CLAUDE_CODE = _npm("claude-code", "@anthropic-ai/claude-code", "2.1.197", "claude")
#: Codex, ``codex exec`` with a Responses provider.
CODEX = _npm("codex", "@openai/codex", "0.171.0", "codex")
_MCP = "@modelcontextprotocol/"
#: MCP servers whose tool lists are captured (each lists its tools with no account, key or
#: network; the ones that need an argument get a scratch folder or file).
MCP_SERVERS: tuple[Package, ...] = (
    _npm(
        "server-filesystem",
        _MCP + "server-filesystem",
        "2026.8.31",
        "mcp-server-filesystem",
        "{root}",
    ),
    _npm("server-memory", _MCP + "server-memory", "2026.8.31", "mcp-server-memory"),
    _npm("server-everything", _MCP + "server-everything", "2026.8.31", "mcp-server-everything"),
    _npm(
        "server-sequential-thinking",
        _MCP + "server-sequential-thinking",
        "2026.8.31",
        "mcp-server-sequential-thinking",
    ),
    _npm("server-github", _MCP + "server-github", "2025.4.8", "mcp-server-github"),
    _npm(
        "server-postgres",
        _MCP + "server-postgres",
        "0.6.2",
        "mcp-server-postgres",
        "postgresql://127.0.0.1:1/none",
    ),
    _pypi("mcp-server-fetch", "2026.10.24"),
    _pypi("mcp-server-time", "2026.10.19", "--local-timezone", "UTC"),
    _pypi("mcp-server-git", "2026.10.19"),
)
#: OpenAI's Agents SDK and LangChain's OpenAI integration, each with the ``openai`` it pins.
AGENTS_SDK = _library("openai-agents", "0.25.0")
LANGCHAIN_OPENAI = _library("langchain-openai", "1.8.1")
CLIENTS: dict[str, Package] = {
    p.name: p for p in (CLAUDE_CODE, CODEX, AGENTS_SDK, LANGCHAIN_OPENAI, *MCP_SERVERS)
}


@contextmanager
def _locked(name: str) -> Iterator[None]:
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / f".{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=900)
    if done.returncode != 0:
        output = (done.stdout + done.stderr)[-3000:]
        offline = any(word in output for word in _OFFLINE)
        raise InstallError(f"installing {what} failed:\n{output}", offline=offline)


def install(package: Package) -> Path:
    """``package``'s executable, installed first unless it is already (idempotent).

    Error handling: :class:`InstallError` (``offline`` when the registry is unreachable).
    """
    marker = package.home / ".installed"
    with _locked(package.name):
        if marker.exists() and package.executable.exists():
            return package.executable
        shutil.rmtree(package.home, ignore_errors=True)
        package.home.mkdir(parents=True)
        what = f"{package.package}=={package.version}"
        if package.registry == "npm":
            spec = f"{package.package}@{package.version}"
            argv = ["npm", "install", "--prefix", str(package.home), "--no-fund", "--no-audit"]
            _run([*argv, "--loglevel=error", spec], what)
        else:
            _run([sys.executable, "-m", "venv", str(package.home)], what)
            pip = [str(package.home / "bin" / "python"), "-m", "pip", "install", "-q"]
            _run([*pip, "--disable-pip-version-check", what], what)
        if not package.executable.exists():
            raise InstallError(f"{what} installed no {package.command}", offline=False)
        marker.write_text(package.version + "\n")
        return package.executable


#: The llama-cpp-python release whose source distribution's chat templates are swept
#: (``vendor/llama.cpp/models/templates``): the one llmtrio builds on.
LLAMA_CPP_PYTHON = "0.3.36"


def llama_templates() -> Path:
    """The folder of every chat template in llama-cpp-python's source distribution
    (:data:`LLAMA_CPP_PYTHON`), downloaded from PyPI once and kept in the cache (the
    templates alone).

    Error handling: :class:`InstallError` (``offline`` when PyPI is unreachable)."""
    home = CACHE / f"llama-cpp-python-{LLAMA_CPP_PYTHON}-templates"
    marker = home / ".installed"
    with _locked("llama-cpp-python-templates"):
        if marker.exists():
            return home
        shutil.rmtree(home, ignore_errors=True)
        download = CACHE / ".sdist"
        shutil.rmtree(download, ignore_errors=True)
        what = f"llama-cpp-python=={LLAMA_CPP_PYTHON}"
        pip = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check"]
        _run([*pip, "--no-binary", ":all:", "--no-deps", "-d", str(download), what], what)
        (archive,) = download.glob("*.tar.gz")
        home.mkdir(parents=True)
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                parts = Path(member.name).parts
                if parts[1:-1] == ("vendor", "llama.cpp", "models", "templates") and (
                    member.isfile() and member.name.endswith(".jinja")
                ):
                    source = tar.extractfile(member)
                    assert source is not None
                    (home / parts[-1]).write_bytes(source.read())
        shutil.rmtree(download, ignore_errors=True)
        if not any(home.glob("*.jinja")):
            raise InstallError(f"{what}'s source distribution holds no templates", offline=False)
        marker.write_text(LLAMA_CPP_PYTHON + "\n")
        return home


def main(names: list[str]) -> None:
    for name in names or list(CLIENTS):
        print(f"{name}: {install(CLIENTS[name])}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
