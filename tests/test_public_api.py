"""Each room's public face: ``__all__`` lists every public name once, and nothing else is
public there (private modules stay behind it)."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
import types
from pathlib import Path

import pytest

import llmtrio
import llmtrio.api
import llmtrio.cli
import llmtrio.engine
import llmtrio.ring
import llmtrio.web
import llmtrio.worker

ENGINE_PARTS = [
    importlib.import_module(f"llmtrio.engine.{part}")
    for part in ("grammar", "tools", "llama", "spec_decode", "models", "generate", "embed")
]


@pytest.mark.parametrize(
    "package",
    [
        llmtrio.api,
        llmtrio.cli,
        llmtrio.engine,
        llmtrio.ring,
        llmtrio.worker,
        llmtrio.web,
        *ENGINE_PARTS,
    ],
    ids=lambda p: p.__name__,
)
def test_all_lists_every_public_name_once(package: types.ModuleType) -> None:
    listed = list(package.__all__)
    assert len(listed) == len(set(listed))
    public = {
        name
        for name, value in vars(package).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(listed)
    for name in listed:
        # Classes and functions come from the room's own private modules, or from the
        # contract the rooms share (``llmtrio.api._fields``: the request fields and limits, in the
        # vocabulary of ``llmtrio.api._field_spec``).
        value = getattr(package, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            home = value.__module__
            shared = ("llmtrio.api._fields", "llmtrio.api._field_spec")
            assert home.startswith(package.__name__ + ".") or home in shared, (
                name,
                home,
            )


def test_the_web_room_is_a_pure_ingress() -> None:
    """Importing the ingress loads neither llama.cpp nor the engine or the worker."""
    code = (
        "import sys, llmtrio.web; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'llama_cpp' "
        "or m.startswith(('llmtrio.engine', 'llmtrio.worker'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_an_ingress_without_a_local_worker_loads_no_llama_cpp() -> None:
    """``llmtrio serve --no-local-worker`` imports the CLI and the composition root, builds
    its configs (their defaults read from their classes) and chooses the ingress alone; none
    of it loads llama.cpp (or the engine or the worker)."""
    code = (
        "import ssl, sys, llmtrio.cli._main as cli, llmtrio.cli._configs as s, llmtrio.cli; "
        "from llmtrio.ring import ControlConfig; "
        "args = cli._parser().parse_args(['serve', '--no-local-worker']); "
        "config = s.serve_config(args); s.control_config(args, 'h'); "
        "control = ControlConfig(ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)); "
        "llmtrio.cli.serving(config, control, s.request_limits(args), local_worker=False, "
        "engine_configs=lambda: 1 / 0); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'llama_cpp' "
        "or m.startswith(('llmtrio.engine', 'llmtrio.worker'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_the_import_contracts_hold() -> None:
    """The layering in pyproject.toml's ``[tool.importlinter]`` (the rooms, the engine's parts
    top to bottom, no circle, private modules kept inside their package) holds."""
    linter = Path(sys.executable).parent / "lint-imports"
    run = subprocess.run(
        [str(linter), str(Path(__file__).parents[1] / "pyproject.toml")],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout


def test_json_object_grammar_is_llama_cpps() -> None:
    """The engine's pure grammar package carries llama.cpp's any-JSON-object grammar as text
    (so it needs no llama.cpp); it is the binding's own."""
    from llama_cpp import llama_grammar

    from llmtrio.engine import JSON_OBJECT_GRAMMAR

    assert JSON_OBJECT_GRAMMAR == llama_grammar.JSON_GBNF


def test_every_ring_route_needs_a_model_kind_the_ring_knows() -> None:
    """The route table (``llmtrio.api``) says which kind of model each ring route needs; the
    kinds are the ring's own (heartbeats carry them), so the two cannot drift apart."""
    from llmtrio.api import MANAGE_PATHS, MODEL_KINDS, ROUTES
    from llmtrio.ring import KINDS

    assert set(MODEL_KINDS) == {route.path for route in ROUTES if route.ring}
    assert {kind for kind in MODEL_KINDS.values() if kind is not None} == set(KINDS)
    assert all(MODEL_KINDS[path] is None for path in MANAGE_PATHS)
    # the refusals name each kind the ring knows in words (only a newer worker's by its name)
    from llmtrio.api import wrong_model_kind

    for kind in KINDS:
        assert "of kind" not in wrong_model_kind("m", kind, "/x").message
