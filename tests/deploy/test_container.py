"""``deploy/Containerfile`` built with podman (``scripts/image-base.sh build``: base images from
Debian's packages, the llama-cpp-python wheel ``tests/deploy/test_image.py`` builds) and run as a
user runs it: as its image user, with a read-only root, models in a volume at ``/models``; an
ingress and workers in containers of their own, over the ring with mutual TLS and the
certificates ``deploy/kubernetes/make-secrets.sh`` makes; ``llmtrio pull`` into the volume.

Every server listens on loopback or on the test's own podman network (a pinned subnet, like
``tests/_netns.py``'s). Needs root and podman; ``scripts/test`` installs podman, debootstrap and
runc where they are missing and it runs as root.
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import shutil
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import httpx
import pytest

from .._procs import ROOT
from ..conftest import QWEN35_TINY
from ..engine.test_model_source import COMMIT, OTHER_REPO, FakeHub, _HubHandler, _HubServer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(platform.machine() != "x86_64", reason="the image is built for x86-64"),
]

TAG = "localhost/llmtrio:test"
USER = "10001"
# As scripts/image-base.sh says, for CI machines only: runc and cgroupfs (crun refuses these
# kernels' hybrid cgroups), and ulimits under this machine's hard nofile limit.
PODMAN = ("podman", "--runtime", "runc", "--cgroup-manager=cgroupfs")
RUN = ("--ulimit", "nofile=1024:20000", "--ulimit", "nproc=1024:1024")
# The ring's own network: a pinned subnet, the ingress at a pinned address, found by name.
SUBNET = "10.199.37"
INGRESS_IP = f"{SUBNET}.10"
CHAT = "/v1/chat/completions"
# Plain HTTP is for loopback only: the public listener's certificate (make-secrets.sh's) names
# "llmtrio", which the host's clients verify, connecting to podman's published loopback port.
SNI = {"sni_hostname": "llmtrio"}


def public_client(certificates: Path) -> httpx.Client:
    verify = ssl.create_default_context(cafile=str(certificates / "ingress-ca.crt"))
    return httpx.Client(timeout=120, verify=verify)


def unavailable() -> str | None:
    """Why the container tests cannot run here (``None``: they can)."""
    if os.geteuid() != 0:
        return "the container tests run podman as root (CI runs as root)"
    missing = [tool for tool in ("podman", "debootstrap", "runc") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed (scripts/test installs them as root)"
    return None


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PODMAN, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


@pytest.fixture(scope="module")
def image(request: pytest.FixtureRequest) -> str:
    """The image, built once for the module; its build time and size are printed."""
    if reason := unavailable():
        pytest.skip(reason)
    started = time.monotonic()
    built = subprocess.run(
        [str(ROOT / "scripts" / "image-base.sh"), "build", TAG],
        # the Python tests/deploy/test_image.py builds with
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True, text=True, timeout=3600, check=False,
    )  # fmt: skip
    seconds = time.monotonic() - started
    assert built.returncode == 0, built.stderr[-5000:]
    size = int(ok(podman("image", "inspect", "--format", "{{.Size}}", TAG)))
    # The script's own figures: debootstrap, the compiler, podman build, the wheel reused or not.
    steps = [
        line
        for line in built.stderr.splitlines()
        if line.startswith(("debootstrap: ", "build-essential: ", "built ", "this machine"))
    ]
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    assert capture is not None
    with capture.global_and_fixture_disabled():
        print(
            f"\ntest_container: {TAG} built in {seconds:.0f} s (base images included),"
            f" {size / 1e6:.0f} MB\n  " + "\n  ".join(steps)
        )
    return TAG


@attrs.define
class Containers:
    """Containers of one test, each logging to podman; all removed at the end."""

    image: str
    names: list[str] = attrs.Factory(list)
    prefix: str = attrs.Factory(lambda: f"lt37-{secrets.token_hex(3)}")

    def run(self, name: str, *args: str, options: tuple[str, ...] = ()) -> str:
        """``llmtrio ARGS`` detached in a read-only container as the image's user."""
        full = f"{self.prefix}-{name}"
        self.names.append(full)
        ok(podman("run", "-d", "--name", full, "--read-only", *RUN, *options, self.image, *args))
        return full

    def logs(self, name: str) -> str:
        result = podman("logs", name)
        return result.stdout + result.stderr

    def url(self, name: str, port: int, scheme: str = "http") -> str:
        """The loopback address podman published ``port`` at."""
        (address,) = ok(podman("port", name, f"{port}/tcp")).split()
        return f"{scheme}://{address}"

    def running(self, name: str) -> bool:
        return ok(podman("inspect", "--format", "{{.State.Running}}", name)).strip() == "true"

    def remove(self) -> None:
        for name in self.names:
            podman("rm", "-f", "-t", "0", name)


@pytest.fixture
def containers(image: str) -> Iterator[Containers]:
    made = Containers(image)
    try:
        yield made
    finally:
        made.remove()


@pytest.fixture
def models(tmp_path: Path, gemma_path: Path) -> Path:
    """A folder with the gemma test model, to mount at ``/models``."""
    folder = tmp_path / "models"
    folder.mkdir()
    try:
        os.link(gemma_path, folder / "gemma.gguf")
    except OSError:
        shutil.copy(gemma_path, folder / "gemma.gguf")
    (folder / "gemma.gguf").chmod(0o644)
    folder.chmod(0o755)
    return folder


def until_ok(
    containers: Containers, name: str, url: str, client: httpx.Client, timeout: float = 120
) -> httpx.Response:
    """GET ``url`` until it answers 200 (failing at once if the container stops)."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            response = client.get(url, timeout=5, extensions=SNI)
        except httpx.TransportError as exc:
            last = repr(exc)
        else:
            if response.status_code == 200:
                return response
            last = f"{response.status_code} {response.text[:200]}"
        assert containers.running(name), containers.logs(name)[-3000:]
        time.sleep(0.2)
    raise AssertionError(f"{url}: {last}, not 200 in {timeout} s: {containers.logs(name)[-3000:]}")


def chat(max_tokens: int, *, stream: bool = False) -> dict[str, object]:
    return {
        "messages": [{"role": "user", "content": "Once upon a time"}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }


def test_serve_as_the_image_user_on_a_read_only_root(
    containers: Containers, models: Path, certificates: Path
) -> None:
    name = containers.run(
        "serve", "serve", "--model=/models/gemma.gguf", "--host=0.0.0.0", "--port=8443",
        "--tls-cert=/tls/public.crt", "--tls-key=/tls/public.key",
        "--threads=1", "--ctx-size=1024", "--max-inflight=1",
        options=(
            "-p", "127.0.0.1::8443", "-v", f"{models}:/models:ro", "-v", f"{certificates}:/tls:ro",
        ),
    )  # fmt: skip
    url = containers.url(name, 8443, "https")
    with public_client(certificates) as client:
        until_ok(containers, name, url + "/readyz", client)
        answer = client.post(url + CHAT, json=chat(8), extensions=SNI)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["choices"][0]["message"]["content"]
        assert 0 < body["usage"]["completion_tokens"] <= 8
        metrics = client.get(url + "/metrics", extensions=SNI)
    assert metrics.status_code == 200
    counted = f'llmtrio_http_requests_total{{path="{CHAT}",status="200",status_class="2xx"}} 1.0'
    assert counted in metrics.text, metrics.text[-3000:]
    # As the image's user, on a root nobody can write.
    assert ok(podman("exec", name, "id", "-u")).strip() == USER
    written = podman("exec", name, "touch", "/opt/llmtrio/written")
    assert written.returncode != 0 and "Read-only file system" in written.stderr


@pytest.fixture
def network() -> Iterator[str]:
    """The ring's network, on the pinned subnet (taken back from a run that was killed)."""
    for left in ok(podman("network", "ls", "--format", "{{.Name}}")).split():
        if left.startswith("lt37-"):
            podman("network", "rm", "-f", left)
    name = f"lt37-{secrets.token_hex(3)}"
    ok(podman("network", "create", "--subnet", f"{SUBNET}.0/24", name))
    try:
        yield name
    finally:
        podman("network", "rm", "-f", name)


@pytest.fixture
def certificates(tmp_path: Path) -> Path:
    """The ring's certificates as deploy/kubernetes/make-secrets.sh makes them (llmtrio for
    the public listener, llmtrio-control for the workers', llmtrio-worker for the workers),
    readable by the image's user."""
    folder = tmp_path / "tls"
    made = subprocess.run(
        [str(ROOT / "deploy" / "kubernetes" / "make-secrets.sh"), "llmtrio", str(folder)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert made.stdout.count("kind: Secret") == 5
    for path in [folder, *folder.iterdir()]:
        os.chown(path, int(USER), int(USER))
    return folder


def test_an_ingress_and_workers_in_containers_over_the_ring(
    containers: Containers, models: Path, network: str, certificates: Path
) -> None:
    tls = ("-v", f"{certificates}:/tls:ro")
    ingress = containers.run(
        "ingress", "serve", "--no-local-worker", "--host=0.0.0.0", "--port=8443",
        "--tls-cert=/tls/public.crt", "--tls-key=/tls/public.key",
        "--control-host=0.0.0.0", "--control-port=9443",
        "--control-cert=/tls/control.crt", "--control-key=/tls/control.key",
        "--control-ca=/tls/worker-ca.crt", "--worker-timeout=3", "--graceful-timeout=1",
        options=("--network", network, "--ip", INGRESS_IP, "-p", "127.0.0.1::8443", *tls),
    )  # fmt: skip

    def worker(name: str) -> str:
        return containers.run(
            name, "worker", "--ingress-url=wss://llmtrio-control:9443",
            "--tls-cert=/tls/worker.crt", "--tls-key=/tls/worker.key", "--ca=/tls/ingress-ca.crt",
            f"--name={name}", "--model=/models/gemma.gguf", "--no-fallback",
            "--threads=1", "--ctx-size=1024", "--max-inflight=1",
            options=(
                "--network", network, "--add-host", f"llmtrio-control:{INGRESS_IP}",
                "-v", f"{models}:/models:ro", *tls,
            ),
        )  # fmt: skip

    url = containers.url(ingress, 8443, "https")

    def workers(client: httpx.Client) -> list[str]:
        health = client.get(url + "/health", extensions=SNI).json()
        return [str(each["id"]) for each in health["workers"]]

    def attached(client: httpx.Client, container: str, gone: str = "") -> str:
        """The one worker attached, once it is not ``gone`` (the killed one)."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            now = workers(client)
            if len(now) == 1 and now[0] != gone:
                return now[0]
            assert containers.running(container), containers.logs(container)[-3000:]
            time.sleep(0.2)
        raise AssertionError(f"no worker attached: {containers.logs(container)[-3000:]}")

    with public_client(certificates) as client:
        until_ok(containers, ingress, url + "/livez", client)
        first = worker("worker-1")
        # The worker's certificate names it to the ingress: llmtrio-worker, as in Kubernetes.
        first_id = attached(client, first)
        assert first_id.startswith("llmtrio-worker#")

        served = client.post(url + CHAT, json=chat(8), extensions=SNI)
        assert served.status_code == 200, served.text
        assert served.json()["choices"][0]["message"]["content"]
        assert served.headers["x-llmtrio-worker"] == first_id

        # The worker's container killed mid-stream: the documented error event, then the end.
        with client.stream("POST", url + CHAT, json=chat(400, stream=True), extensions=SNI) as (
            response
        ):
            assert response.headers["x-llmtrio-worker"] == first_id
            lines = response.iter_lines()
            for line in lines:
                if '"content"' in line:
                    break
            ok(podman("kill", first))
            rest = list(lines)
        events = [json.loads(line[6:]) for line in rest if line.startswith("data: {")]
        assert events and events[-1]["error"]["code"] == "worker_failed", rest[-5:]
        assert ok(podman("inspect", "--format", "{{.State.ExitCode}}", first)).strip() == "137"

        # A new worker's container serves the next request.
        second = worker("worker-2")
        second_id = attached(client, second, gone=first_id)
        assert second_id != first_id and second_id.startswith("llmtrio-worker#")
        again = client.post(url + CHAT, json=chat(8), extensions=SNI)
        assert again.status_code == 200, again.text
        assert again.headers["x-llmtrio-worker"] == second_id


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    """tests/engine/test_model_source.py's Hub, on loopback."""
    server = _HubServer(("127.0.0.1", 0), _HubHandler)
    server.hub = FakeHub(repos={})
    server.hub.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server.hub
    finally:
        server.shutdown()
        server.server_close()


def test_pull_writes_into_the_models_volume(image: str, hub: FakeHub, tmp_path: Path) -> None:
    """As the worker's init container does: into HF_HOME=/models, the image's default."""
    hub.repos[OTHER_REPO] = {"Other-Q8_0.gguf": QWEN35_TINY.read_bytes()}
    volume = tmp_path / "models"
    volume.mkdir()
    os.chown(volume, int(USER), int(USER))
    # The host's network, to reach the Hub on loopback.
    pulled = podman(
        "run", "--rm", "--read-only", *RUN, "--network", "host",
        "-e", f"HF_ENDPOINT={hub.endpoint}", "-v", f"{volume}:/models", image,
        "pull", f"{OTHER_REPO}:Q8_0",
    )  # fmt: skip
    assert pulled.returncode == 0, pulled.stderr[-3000:]
    inside = pulled.stdout.strip()
    folder = "models--" + OTHER_REPO.replace("/", "--")
    assert inside == f"/models/hub/{folder}/snapshots/{COMMIT}/Other-Q8_0.gguf"
    assert f"{OTHER_REPO}:Q8_0: downloaded: {inside}" in pulled.stderr
    written = volume / inside.removeprefix("/models/")
    assert written.read_bytes() == QWEN35_TINY.read_bytes()
    assert written.resolve().stat().st_uid == int(USER)
    # Again, offline as the worker reads it: the volume alone answers.
    offline = podman(
        "run", "--rm", "--read-only", *RUN, "--network", "none", "-e", "HF_HUB_OFFLINE=1",
        "-v", f"{volume}:/models", image, "pull", f"{OTHER_REPO}:Q8_0",
    )  # fmt: skip
    assert (offline.returncode, offline.stdout.strip()) == (0, inside), offline.stderr
    assert "already in the cache" in offline.stderr
