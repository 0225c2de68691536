"""Each room's public face: ``__all__`` lists every public name once, and nothing else is
public there (private modules stay behind it)."""

from __future__ import annotations

import inspect
import types

import pytest

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
        # Classes and functions come from the room's own private modules.
        value = getattr(package, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__module__.startswith(package.__name__ + "."), (name, value.__module__)
