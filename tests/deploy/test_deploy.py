"""The Kubernetes manifests (``deploy/kubernetes``), as CI checks them with no cluster:

- every overlay renders (``kubectl kustomize``) and validates against the Kubernetes 1.32
  schemas (``kubernetes-validate --strict``: an unknown field fails); its cert-manager and
  Prometheus-operator resources against those projects' CRD schemas, kept in
  ``deploy/kubernetes/schemas`` (strict too); a resource with no schema at all fails;
- checkov passes with no failed check, CKV_K8S_8, 9, 20, 22, 28, 31, 37 and 40 passed on every
  workload with no skip, and at most five checks skipped, each with its reason;
- what the manifests say agrees with what the processes do: every container's arguments parse
  with llmtrio's own command line; the grace periods cover preStop and --graceful-timeout; the
  probes hit /livez and /readyz on ports the containers have; the workers dial the control
  Service's name, which the control certificate carries; every Secret a pod mounts is made by
  cert-manager's Certificates and by make-secrets.sh, whose certificates make a working ring.

checkov and kubernetes-validate live in ``.venv/deploy-tools`` (``scripts/test`` installs
them); these tests skip, saying so, where they or kubectl are missing.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import attrs
import jsonschema
import pytest
import trio
import yaml

from llmtrio.api import LIVEZ_PATH, READYZ_PATH
from llmtrio.cli._catalog_build import parse_models_file
from llmtrio.cli._main import _parser
from llmtrio.engine import EngineConfig
from llmtrio.ring import (
    ControlConfig,
    DialConfig,
    Ring,
    client_ssl_context,
    connect_ring,
    serve_control,
    server_ssl_context,
)

from .._helpers import eventually
from .._procs import ROOT
from ..ring.test_ring_dial import Resolver

DEPLOY = ROOT / "deploy" / "kubernetes"
SCHEMAS = DEPLOY / "schemas"
TOOLS = ROOT / ".venv" / "deploy-tools" / "bin"
KUBECTL = shutil.which("kubectl")
OVERLAYS = sorted(path.name for path in (DEPLOY / "overlays").iterdir() if path.is_dir())
NAMED_CHECKS = {f"CKV_K8S_{n}" for n in (8, 9, 20, 22, 28, 31, 37, 40)}
WORKLOADS = {"Deployment.llmtrio.llmtrio-ingress", "Deployment.llmtrio.llmtrio-worker"}

needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl (with kustomize) not found")
needs_tools = pytest.mark.skipif(
    not (TOOLS / "checkov").exists() or not (TOOLS / "kubernetes-validate").exists(),
    reason=f"checkov and kubernetes-validate not in {TOOLS} (./scripts/test installs them)",
)


@attrs.frozen
class Rendered:
    overlay: str
    path: Path
    docs: list[dict[str, Any]]

    def one(self, kind: str, name: str) -> dict[str, Any]:
        (found,) = [d for d in self.docs if d["kind"] == kind and d["metadata"]["name"] == name]
        return found

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]


@cache
def _render(overlay: str, folder: Path) -> Rendered:
    assert KUBECTL is not None
    text = subprocess.run(
        [KUBECTL, "kustomize", str(DEPLOY / "overlays" / overlay)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    path = folder / f"{overlay}.yaml"
    path.write_text(text)
    return Rendered(overlay, path, [doc for doc in yaml.safe_load_all(text) if doc])


@pytest.fixture(params=OVERLAYS)
def rendered(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    if KUBECTL is None:
        pytest.skip("kubectl (with kustomize) not found")
    return _render(request.param, tmp_path_factory.getbasetemp())


# -- schemas ------------------------------------------------------------------------------------


def _strict(schema: Any) -> Any:
    """A CRD's schema as the API server applies it with strict field validation: an object
    with declared properties takes no other field (unless it preserves unknown fields)."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    strict = {key: _strict(value) for key, value in schema.items()}
    if (
        "properties" in strict
        and "additionalProperties" not in strict
        and not strict.get("x-kubernetes-preserve-unknown-fields")
    ):
        strict["additionalProperties"] = False
    return strict


def crd_schema(api_version: str, kind: str) -> dict[str, Any] | None:
    group, _, version = api_version.rpartition("/")
    path = SCHEMAS / group / f"{kind.lower()}_{version}.json"
    if not group or not path.exists():
        return None
    schema: dict[str, Any] = _strict(json.loads(path.read_text()))
    return schema


def validate_custom(doc: dict[str, Any]) -> None:
    schema = crd_schema(doc["apiVersion"], doc["kind"])
    assert schema is not None, f"no schema for {doc['apiVersion']} {doc['kind']}"
    jsonschema.Draft7Validator(schema).validate(doc)


def kubernetes_validate(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(TOOLS / "kubernetes-validate"), "--strict", "-k", "1.32.0", str(path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip


@needs_tools
def test_every_resource_validates_against_its_schema(rendered: Rendered) -> None:
    result = kubernetes_validate(rendered.path)
    assert result.returncode == 0, result.stdout + result.stderr
    passed = re.findall(r"passed for resource (\S+) against version 1\.32", result.stdout)
    unknown = re.findall(
        r"Couldn't find schema for kind (\S+) with api version (\S+)", result.stdout
    )
    assert len(passed) + len(unknown) == len(rendered.docs)
    # What Kubernetes itself has no schema for is validated against its CRD, or fails.
    custom = [d for d in rendered.docs if (d["kind"], d["apiVersion"]) in set(unknown)]
    assert len(custom) == len(unknown)
    for doc in custom:
        validate_custom(doc)


@needs_tools
def test_the_validation_is_strict(tmp_path: Path) -> None:
    """A check that cannot fail proves nothing: an unknown field fails both validators."""
    rendered = _render("cpu", tmp_path)
    worker = json.loads(json.dumps(rendered.one("Deployment", "llmtrio-worker")))
    worker["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "x"
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(worker))
    assert kubernetes_validate(broken).returncode != 0
    certificate = json.loads(json.dumps(rendered.one("Certificate", "llmtrio-control")))
    certificate["spec"]["dnsName"] = ["typo"]
    with pytest.raises(jsonschema.ValidationError, match="dnsName"):
        validate_custom(certificate)
    with pytest.raises(AssertionError, match="no schema"):
        validate_custom({"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {}})


@needs_tools
def test_checkov_passes_with_the_named_checks_and_few_skips(rendered: Rendered) -> None:
    result = subprocess.run(
        [str(TOOLS / "checkov"), "-f", str(rendered.path), "--framework", "kubernetes",
         "--skip-download", "--output", "json"],
        capture_output=True, text=True, check=False, cwd=rendered.path.parent,
    )  # fmt: skip
    report = json.loads(result.stdout)
    results = report["results"]
    failed = [(c["check_id"], c["resource"]) for c in results["failed_checks"]]
    assert failed == [] and result.returncode == 0, failed
    passed = {(c["check_id"], c["resource"]) for c in results["passed_checks"]}
    for check in NAMED_CHECKS:
        for workload in WORKLOADS:
            assert (check, workload) in passed, (check, workload)
    skipped = results["skipped_checks"]
    assert not NAMED_CHECKS & {c["check_id"] for c in skipped}
    assert len({c["check_id"] for c in skipped}) <= 5
    assert all(c["check_result"].get("suppress_comment") for c in skipped)  # with a reason


# -- what the manifests say, against what the processes do ----------------------------------


def container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    spec = deployment["spec"]["template"]["spec"]
    (found,) = [c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == name]
    return found


def flag(args: list[str], name: str) -> str:
    (value,) = [arg.split("=", 1)[1] for arg in args if arg.startswith(f"--{name}=")]
    return value


@needs_kubectl
def test_the_manifests_agree_with_the_processes(rendered: Rendered) -> None:
    ingress = rendered.one("Deployment", "llmtrio-ingress")
    worker = rendered.one("Deployment", "llmtrio-worker")
    serve, engine = container(ingress, "ingress"), container(worker, "worker")
    pull = container(worker, "pull")
    # Every container's arguments are llmtrio's own.
    parser = _parser()
    for each in (serve, engine, pull):
        parser.parse_args(each["args"])

    # SIGTERM: preStop, then --graceful-timeout for what is in flight, within the grace period.
    for deployment, each in ((ingress, serve), (worker, engine)):
        grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        pre_stop = each.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
        graceful = float(flag(each["args"], "graceful-timeout"))
        assert pre_stop + graceful < grace <= pre_stop + graceful + 15

    # Probes: /livez and /readyz on a port the container has, over HTTPS where it serves TLS.
    for each, tls in ((serve, True), (engine, False)):
        ports = {port["name"]: port["containerPort"] for port in each["ports"]}
        for probe, path in (
            ("startupProbe", LIVEZ_PATH),
            ("livenessProbe", LIVEZ_PATH),
            ("readinessProbe", READYZ_PATH),
        ):
            get = each[probe]["httpGet"]
            assert get["path"] == path and get["port"] in ports
            assert (get.get("scheme", "HTTP") == "HTTPS") is tls
    assert ports["metrics"] == int(flag(engine["args"], "metrics-port"))

    # The workers dial the control Service's name, on its port; it is headless, publishes
    # starting ingresses, and the control certificate carries that name.
    url = re.fullmatch(r"wss://([^:]+):(\d+)", flag(engine["args"], "ingress-url"))
    assert url is not None
    control = rendered.one("Service", url[1])
    assert control["spec"]["clusterIP"] == "None" and control["spec"]["publishNotReadyAddresses"]
    (port,) = control["spec"]["ports"]
    assert port["port"] == int(url[2]) == int(flag(serve["args"], "control-port"))
    pod_labels = ingress["spec"]["template"]["metadata"]["labels"]
    assert control["spec"]["selector"].items() <= pod_labels.items()
    certificates = rendered.all("Certificate")
    if certificates:
        (cert,) = [c for c in certificates if c["spec"]["secretName"] == "llmtrio-control-tls"]
        assert url[1] in cert["spec"]["dnsNames"]

    # The endpoint picker reads the ingresses' vllm: metrics by this label.
    assert pod_labels["llm-d.ai/engine-type"] == "vllm"
    # The init container pulls what the worker serves, into the volume it serves it from.
    assert pull["args"] == ["pull", "$(MODEL_REPO):$(MODEL_QUANT)"]
    assert flag(engine["args"], "hf-repo") == "$(MODEL_REPO)"
    assert flag(engine["args"], "quant") == "$(MODEL_QUANT)"
    env = {e["name"]: e.get("value") for e in engine["env"]}
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["HF_HOME"] == {e["name"]: e.get("value") for e in pull["env"]}["HF_HOME"]

    # Models on demand: the models file is the ConfigMap's, mounted where the flag says, and
    # it parses (every key of the right type); the catalog folder is a volume of the pod.
    mounts = {m["name"]: m["mountPath"] for m in engine["volumeMounts"]}
    volumes = {v["name"]: v for v in worker["spec"]["template"]["spec"]["volumes"]}
    models_file = Path(flag(engine["args"], "models-file"))
    (mounted_file,) = [n for n, path in mounts.items() if path == str(models_file.parent)]
    config_map = volumes[mounted_file]["configMap"]["name"]
    data = rendered.one("ConfigMap", config_map)["data"][models_file.name]
    models = parse_models_file(tomllib.loads(data), models_file, EngineConfig(threads=1))
    assert models and all(m.origin == "models-file" for m in models)
    assert flag(engine["args"], "models-dir") in mounts.values()
    budget_mib = int(flag(engine["args"], "memory-budget"))
    limit = engine["resources"]["limits"]["memory"]
    assert limit.endswith("Gi") and budget_mib < int(limit[:-2]) * 1024

    # Disruption budgets select the pods they guard.
    for budget in rendered.all("PodDisruptionBudget"):
        selector = budget["spec"]["selector"]["matchLabels"]
        guarded = [
            d for d in (ingress, worker)
            if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]  # fmt: skip
        assert len(guarded) == 1, budget["metadata"]["name"]

    # Every Secret a pod mounts is made by a Certificate (where cert-manager is used).
    mounted = {
        v["secret"]["secretName"]
        for d in (ingress, worker)
        for v in d["spec"]["template"]["spec"]["volumes"]
        if "secret" in v
    }
    assert mounted == SECRET_NAMES
    if certificates:
        assert {c["spec"]["secretName"] for c in certificates} >= mounted

    if rendered.overlay == "gpu":
        assert engine["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert engine["image"].endswith("-cuda")


SECRET_NAMES = {
    "llmtrio-public-tls",
    "llmtrio-control-tls",
    "llmtrio-worker-tls",
    "llmtrio-ingress-ca",
    "llmtrio-worker-ca",
}


# -- make-secrets.sh ------------------------------------------------------------------------


@pytest.fixture
def made_secrets(tmp_path: Path) -> Iterator[dict[str, dict[str, bytes]]]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not found")
    script = DEPLOY / "make-secrets.sh"
    result = subprocess.run(
        [str(script), "llmtrio", str(tmp_path / "ca")], capture_output=True, text=True, check=True
    )
    secrets = {
        doc["metadata"]["name"]: {k: base64.b64decode(v) for k, v in doc["data"].items()}
        for doc in yaml.safe_load_all(result.stdout)
        if doc
    }
    yield secrets


async def test_make_secrets_makes_the_secrets_of_a_working_ring(
    made_secrets: dict[str, dict[str, bytes]], tmp_path: Path
) -> None:
    assert set(made_secrets) == SECRET_NAMES
    # The CAs' keys stay out of the cluster.
    assert set(made_secrets["llmtrio-ingress-ca"]) == set(made_secrets["llmtrio-worker-ca"])
    assert set(made_secrets["llmtrio-worker-ca"]) == {"tls.crt"}
    files = {}
    for name, data in made_secrets.items():
        for key, value in data.items():
            files[f"{name}/{key}"] = path = tmp_path / name / key
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(value)
    # Mounted as the manifests mount them, they make a ring: an ingress with its control
    # certificate, a worker dialing the control Service's name.
    resolver = Resolver()
    resolver.answers["llmtrio-control"] = ["127.0.0.1"]
    trio.socket.set_custom_hostname_resolver(resolver)
    server = server_ssl_context(
        files["llmtrio-control-tls/tls.crt"],
        files["llmtrio-control-tls/tls.key"],
        files["llmtrio-worker-ca/tls.crt"],
    )
    client = client_ssl_context(
        files["llmtrio-worker-tls/tls.crt"],
        files["llmtrio-worker-tls/tls.key"],
        files["llmtrio-ingress-ca/tls.crt"],
    )
    ring = Ring(max_streams=4)
    async with trio.open_nursery() as nursery:
        address = await nursery.start(serve_control, ring, ControlConfig(server, port=0))
        url = f"wss://llmtrio-control:{address.rsplit(':', 1)[1]}"
        async with connect_ring([url], client, worker_id="w", max_inflight=1, config=DialConfig()):
            await eventually(lambda: ring.stats().workers, within=20)
            (worker,) = ring.stats().workers
            assert worker.worker_id.startswith("llmtrio-worker#")  # named by its certificate
        nursery.cancel_scope.cancel()
    trio.socket.set_custom_hostname_resolver(None)


def test_the_crd_schemas_kept_are_the_ones_used() -> None:
    kept = {path.relative_to(SCHEMAS).as_posix() for path in SCHEMAS.rglob("*.json")}
    assert kept == {
        "cert-manager.io/certificate_v1.json",
        "cert-manager.io/issuer_v1.json",
        "monitoring.coreos.com/podmonitor_v1.json",
    }
