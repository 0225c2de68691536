"""LoRA adapters in the catalog: ``--lora NAME=PATH[:SCALE][@BASE]`` and a models file's
``lora = [...]``, each served as a model of its own on its base model, and what is checked of
them at start.

A models file lists a model's adapters in its table, as ``--lora`` values without ``@BASE``
or as tables (paths relative to the file)::

    [models."qwen3.5"]
    source = "unsloth/Qwen3.5-0.8B-GGUF:Q4_K_M"
    lora = ["sql=adapters/sql.gguf", { name = "fr", path = "adapters/fr.gguf", scale = 0.8 }]

Refused at start, naming what: an adapter named as a model, an alias or another adapter; an
adapter of a model that is not found, or of a model that generates nothing (embedding,
reranking); a file that is not a LoRA adapter, or one made for another architecture than its
base's (naming both; a base model not on disk yet, a repository's, is checked as it loads).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from ._catalog import CatalogError, CatalogModel
from ._values import LoraFlag

if TYPE_CHECKING:
    from ..engine import LoraSpec

__all__ = ["attach_adapters", "check_adapters", "file_adapters"]


def file_adapters(file: Path, model: str, value: Any) -> tuple[LoraSpec, ...]:
    """A models file's ``lora`` for ``model``.

    Error handling: :class:`CatalogError` naming the file, the model and the key."""
    from ..engine import LoraSpec

    where = f"models file {file}: model {model!r}: key 'lora'"
    if not isinstance(value, list):
        raise CatalogError(f"{where}: must be a list of adapters, not {value!r}")
    specs = []
    for item in value:
        try:
            if isinstance(item, str):
                parsed = LoraFlag.parse(item)
                if parsed.base is not None:
                    raise ValueError(f"{item!r}: no @BASE here (the table names the model)")
                name, path, scale = parsed.name, parsed.path, parsed.scale
            elif isinstance(item, dict) and set(item) <= {"name", "path", "scale"}:
                given, text, scale = item.get("name"), item.get("path"), item.get("scale", 1.0)
                if not isinstance(given, str) or not isinstance(text, str):
                    raise ValueError(f"{item!r}: give a name and a path")
                if isinstance(scale, bool) or not isinstance(scale, int | float):
                    raise ValueError(f"{item!r}: the scale must be a number")
                name, path = given, Path(text).expanduser()
            else:
                raise ValueError(f'{item!r}: give "NAME=PATH[:SCALE]" or {{ name, path, scale }}')
            full = path if path.is_absolute() else file.parent / path
            specs.append(LoraSpec(name, full, scale))
        except ValueError as exc:
            raise CatalogError(f"{where}: {exc}") from None
    return tuple(specs)


def attach_adapters(
    models: Sequence[CatalogModel], flags: Sequence[LoraFlag]
) -> list[CatalogModel]:
    """``models`` with each ``--lora`` added to its base's adapters (its base named by name
    or alias; the one model when it names none).

    Error handling: :class:`CatalogError` for a base that is not served, or none named with
    several models."""
    from ..engine import LoraSpec

    adapters: dict[str, list[LoraSpec]] = {}
    for flag in flags:
        text = f"--lora {flag.name}"
        if flag.base is None:
            if len(models) != 1:
                served = ", ".join(model.name for model in models)
                raise CatalogError(f"{text}: say which model it is for: NAME=PATH@BASE ({served})")
            base = models[0]
        else:
            found = [m for m in models if flag.base == m.name or flag.base in m.aliases]
            if not found:
                raise CatalogError(f"{text}: no model is served as {flag.base!r}")
            base = found[0]
        adapters.setdefault(base.name, []).append(LoraSpec(flag.name, flag.path, flag.scale))
    out = []
    for model in models:
        extra = adapters.get(model.name)
        if extra:
            config = attrs.evolve(model.config, lora=(*model.config.lora, *extra))
            model = attrs.evolve(model, config=config)
        out.append(model)
    return out


def check_adapters(models: Sequence[CatalogModel]) -> None:
    """Refuse what cannot be served (see the module).

    Error handling: :class:`CatalogError` naming the adapter and the model."""
    from ..engine import EngineError, check_lora
    from ..engine.models import check_gguf, model_kind

    names = {name: model.name for model in models for name in (model.name, *model.aliases)}
    for model in models:
        if not model.config.lora:
            continue
        base = model.config.model
        architecture: str | None = None
        if base is not None:
            try:
                info = check_gguf(base)
            except EngineError:
                info = None  # its load says what is wrong with it
            if info is not None:
                kind = model_kind(info)
                if kind != "chat":
                    raise CatalogError(
                        f"model {model.name!r} is a model of kind {kind!r}: LoRA adapters "
                        "are served on generating models only"
                    )
                architecture = info.architecture
        for spec in model.config.lora:
            where = f"LoRA adapter {spec.name!r} of model {model.name!r}"
            other = names.get(spec.name)
            if other is not None:
                what = "a model" if other == spec.name else f"a name of model {other!r}"
                raise CatalogError(f"{where}: {spec.name!r} is {what} already")
            names[spec.name] = model.name
            try:
                check_lora(spec.path, architecture)
            except EngineError as exc:
                raise CatalogError(f"{where}: {exc}") from None
