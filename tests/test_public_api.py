"""Each room's public face: ``__all__`` lists every public name once, and nothing else is
public there (private modules stay behind it)."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
import types
from pathlib import Path

import pytest

import llmtrio
import llmtrio.engine
import llmtrio.ring
import llmtrio.web
import llmtrio.worker


@pytest.mark.parametrize(
    "package", [llmtrio.engine, llmtrio.ring, llmtrio.worker, llmtrio.web], ids=lambda p: p.__name__
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
        # contract the rooms share (``llmtrio._fields``: the request fields and limits, in the
        # vocabulary of ``llmtrio._field_spec``).
        value = getattr(package, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            home = value.__module__
            shared = ("llmtrio._fields", "llmtrio._field_spec")
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
    """``llmtrio serve --no-local-worker`` imports the CLI and the ingress's composition root
    and builds its configs (their defaults read from their classes); none of it loads
    llama.cpp (or the engine or the worker)."""
    code = (
        "import sys, llmtrio._cli as cli, llmtrio._settings as s, llmtrio._ingress; "
        "args = cli._parser().parse_args(['serve', '--no-local-worker']); "
        "s.serve_config(args), s.request_limits(args), s.control_config(args, 'h'); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'llama_cpp' "
        "or m.startswith(('llmtrio.engine', 'llmtrio.worker'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


ROOMS = ("engine", "ring", "worker", "web")


@pytest.mark.parametrize("room", ROOMS)
def test_no_room_imports_another_rooms_private_modules(room: str) -> None:
    package = Path(llmtrio.__file__).parent
    offenders = []
    for path in (package / room).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                parts = node.module if node.level == 0 else f"{'.' * node.level}{node.module}"
                names = parts.lstrip(".").split(".")
                if node.level == 0 and names[0] == "llmtrio":
                    names = names[1:]
                elif node.level == 1:
                    continue  # the room's own modules
                if names and names[0] in ROOMS and names[0] != room and len(names) > 1:
                    offenders.append(f"{path.name}: {parts}")
    assert offenders == []
