"""Real ``llmtrio`` processes for tests: ingresses (``serve --no-local-worker``, or ``serve``
with its local worker) and ``llmtrio worker`` processes on loopback, with real TLS (trustme: one
CA for the ingresses, another for the workers) and the gemma test model. Each process logs to a
file the test reads."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import attrs
import httpx
import trustme

from ._helpers import wait_until

__all__ = ["Ingress", "Proc", "Ring"]

ROOT = Path(__file__).resolve().parent.parent


@attrs.define
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float = 60) -> re.Match[str]:
        """The first match of ``pattern`` in the log, once it is there; fails at once if the
        process exits first."""

        def found() -> re.Match[str] | None:
            exited = self.popen.poll() is not None
            match = re.search(pattern, self.text())
            if match is None and exited:
                raise AssertionError(f"{self.name} exited: {self.text()[-3000:]}")
            return match

        return wait_until(
            found, lambda: f"{self.name}: {pattern!r} in {self.text()[-3000:]}", within=timeout
        )

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=30)


@attrs.define
class Ingress:
    proc: Proc
    url: str
    control: str

    def health(self) -> dict[str, object]:
        data: dict[str, object] = httpx.get(self.url + "/health", timeout=10).json()
        return data

    def workers(self) -> list[dict[str, object]]:
        workers = self.health()["workers"]
        assert isinstance(workers, list)
        return workers

    def wait_workers(self, names: set[str], timeout: float = 60) -> None:
        wait_until(
            lambda: {str(w["id"]).split("#")[0] for w in self.workers()} == names,
            lambda: f"workers {names} attached: {self.workers()}",
            within=timeout,
        )


@attrs.define
class Ring:
    tmp: Path
    gemma: Path
    ingress_ca: trustme.CA
    worker_ca: trustme.CA
    procs: list[Proc] = attrs.field(factory=list)

    @classmethod
    @contextmanager
    def opened(cls, tmp: Path, gemma: Path) -> Iterator[Ring]:
        """A ring's certificates in ``tmp``; every process it spawned is killed on exit."""
        ingress_ca, worker_ca = trustme.CA(), trustme.CA()
        ingress_ca.cert_pem.write_to_path(str(tmp / "ingress-ca.pem"))
        worker_ca.cert_pem.write_to_path(str(tmp / "worker-ca.pem"))
        ring = cls(tmp, gemma, ingress_ca, worker_ca)
        try:
            yield ring
        finally:
            for proc in ring.procs:
                proc.stop()

    def spawn(
        self,
        name: str,
        *args: str,
        prefix: Sequence[str] = (),
        python_path: Path | None = None,
    ) -> Proc:
        """``llmtrio ARGS`` logging to a file; ``prefix`` runs it elsewhere (``ip netns exec
        NS``: on a test host); ``python_path`` runs the llmtrio found there instead of this
        tree's (another version of it)."""
        log = self.tmp / f"{name}-{len(self.procs)}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        python = [sys.executable]
        if python_path is not None:
            env["PYTHONPATH"] = str(python_path)
            python.append("-P")  # not the working directory's llmtrio first
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [*prefix, *python, "-m", "llmtrio", *args],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def ingress(self, name: str, *extra: str, python_path: Path | None = None) -> Ingress:
        cert = self.tmp / f"{name}.pem"
        self.ingress_ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(
            str(cert)
        )
        proc = self.spawn(
            name,
            "serve",
            "--no-local-worker",
            "--port=0",
            "--control-port=0",
            f"--control-cert={cert}",
            f"--control-key={cert}",
            f"--control-ca={self.tmp / 'worker-ca.pem'}",
            "--worker-timeout=3",
            "--cancel-ack-timeout=3",
            "--graceful-timeout=1",
            *extra,
            python_path=python_path,
        )
        url = proc.wait_for(r"serving .*? on (http://\S+)").group(1)
        control = proc.wait_for(r"control listener for workers on (wss://\S+)").group(1)
        return Ingress(proc, url, control)

    def certificate(self, name: str, ca: trustme.CA | None = None) -> Path:
        path = self.tmp / f"{name}.pem"
        (ca or self.worker_ca).issue_cert(name).private_key_and_cert_chain_pem.write_to_path(
            str(path)
        )
        return path

    def serve(self, name: str, *extra: str) -> Ingress:
        """``llmtrio serve`` with its local worker (no control listener)."""
        proc = self.spawn(
            name,
            "serve",
            f"--model={self.gemma}",
            "--port=0",
            "--max-inflight=2",
            "--ctx-size=2048",
            "--threads=1",
            *extra,
        )
        url = proc.wait_for(r"serving .*? on (http://\S+)").group(1)
        return Ingress(proc, url, "")

    def worker(
        self,
        name: str,
        ingresses: list[Ingress],
        cert: Path | None = None,
        *extra: str,
        python_path: Path | None = None,
    ) -> Proc:
        return self.spawn(
            name,
            "worker",
            *(f"--ingress-url={ingress.control}" for ingress in ingresses),
            f"--tls-cert={cert or self.certificate(name)}",
            f"--ca={self.tmp / 'ingress-ca.pem'}",
            f"--model={self.gemma}",
            "--max-inflight=2",
            "--ctx-size=2048",
            "--threads=1",
            *extra,
            python_path=python_path,
        )
