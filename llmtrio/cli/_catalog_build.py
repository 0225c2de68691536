"""The catalog built (:func:`build_catalog`): ``--model``, the models file (read here), a models
folder and the Hugging Face cache, as ``llmtrio.cli._catalog`` describes them.

Pure but for reading the file; nothing is loaded here. Error handling: :class:`CatalogError`
(a ``ValueError``) naming the file, the model and the key.
"""

from __future__ import annotations

import logging
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from ..api import FOREVER, keep_alive_seconds
from ._catalog import (
    HF_REPO,
    Catalog,
    CatalogError,
    CatalogModel,
    folder_model,
    scan_hf_cache,
    scan_models_dir,
)

if TYPE_CHECKING:
    from ..engine import EngineConfig

__all__ = ["build_catalog", "parse_models_file", "read_models_file"]

logger = logging.getLogger("llmtrio.catalog")


# -- the models file -------------------------------------------------------------------------


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("an integer")
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError("true or false")
    return value


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("a string")
    return value


def _spec(value: Any) -> str | None:
    if value is False or value in ("off", "none"):
        return None
    if value == "ngram":
        return "ngram"
    raise TypeError('"ngram", or "off" (or false)')


def _flash_attn(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if value in ("auto", "on", "off"):
        return str(value)
    raise TypeError('true, false or "auto"')


#: The settings of a model's table: the key, the ``EngineConfig`` field it sets and the
#: check of its TOML value (which raises ``TypeError`` naming what was expected).
ENGINE_KEYS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "ctx_size": ("ctx_size", _int),
    "max_inflight": ("max_inflight", _int),
    "threads": ("threads", _int),
    "kv_unified": ("kv_unified", _bool),
    "max_request_ctx": ("max_request_ctx", _int),
    "prefill_chunk": ("prefill_chunk", _int),
    "prompt_cache": ("prompt_cache", _bool),
    "cache_ram": ("cache_ram_mib", _int),
    "cache_disk": ("cache_disk_mib", _int),
    "spec": ("spec", _spec),
    "spec_draft_max": ("spec_draft_max", _int),
    "cache_type_k": ("cache_type_k", _str),
    "cache_type_v": ("cache_type_v", _str),
    "n_gpu_layers": ("n_gpu_layers", _int),
    "flash_attn": ("flash_attn", _flash_attn),
    "mlock": ("mlock", _bool),
    "mmap": ("mmap", _bool),
}
#: The keys that are not the engine's settings.
OWN_KEYS = (
    "source",
    "keep_alive",
    "load",
    "aliases",
    "projector",
    "chat_template_file",
    "cache_dir",
)


def _where(file: Path, name: str | None, key: str | None = None) -> str:
    where = f"models file {file}"
    if name is not None:
        where += f": model {name!r}"
    if key is not None:
        where += f": key {key!r}"
    return where


def _source(text: str, folder: Path) -> tuple[dict[str, Any], Path | None]:
    """A ``source``'s engine fields and its projector: a repo ``owner/repo[:QUANT]`` (when
    no file of that name exists), a GGUF file, or a folder holding one model."""
    path = Path(text).expanduser()
    if not path.is_absolute():
        path = folder / path
    found = HF_REPO.match(text)
    if found is not None and not path.exists() and not text.lower().endswith(".gguf"):
        fields: dict[str, Any] = {"hf_repo": found["repo"], "model": None}
        if found["quant"]:
            fields["quant"] = found["quant"]
        return fields, None
    if path.is_dir():
        model, projector = folder_model(path)
        return {"model": model}, projector
    if not path.is_file():
        raise CatalogError(f"no such file: {path}")
    return {"model": path}, None


def _model_entry(
    file: Path,
    name: str,
    table: Mapping[str, Any],
    base: EngineConfig,
) -> CatalogModel:
    where = _where(file, name)
    if "source" not in table:
        raise CatalogError(f"{where}: no 'source' (a GGUF path or owner/repo:QUANT)")
    fields: dict[str, Any] = {"model_name": name}
    own: dict[str, Any] = {}
    for key, value in table.items():
        try:
            if key in ENGINE_KEYS:
                field, check = ENGINE_KEYS[key]
                fields[field] = check(value)
            elif key == "keep_alive":
                try:
                    own[key] = keep_alive_seconds(value)
                except ValueError as exc:
                    raise TypeError(str(exc).removeprefix("must be ")) from None
            elif key == "load":
                own[key] = _bool(value)
            elif key == "aliases":
                if not isinstance(value, list) or not all(isinstance(a, str) and a for a in value):
                    raise TypeError("a list of names")
                own[key] = tuple(value)
            elif key in ("source", "projector", "chat_template_file", "cache_dir"):
                own[key] = _str(value)
            else:
                known = ", ".join([*ENGINE_KEYS, *OWN_KEYS])
                raise CatalogError(f"{_where(file, name, key)}: unknown key (known: {known})")
        except TypeError as exc:
            raise CatalogError(f"{_where(file, name, key)}: must be {exc}, not {value!r}") from None
    try:
        source, projector = _source(own["source"], file.parent)
    except CatalogError as exc:
        raise CatalogError(f"{_where(file, name, 'source')}: {exc}") from None
    fields.update(source)
    if "projector" in own:
        projector = _existing(file, name, "projector", own["projector"])
    if "cache_dir" in own:  # made when the model loads: it need not exist yet
        cache_dir = Path(own["cache_dir"]).expanduser()
        fields["cache_dir"] = cache_dir if cache_dir.is_absolute() else file.parent / cache_dir
    if "chat_template_file" in own:
        template = _existing(file, name, "chat_template_file", own["chat_template_file"])
        try:
            fields["chat_template"] = template.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CatalogError(f"{_where(file, name, 'chat_template_file')}: {exc}") from None
    try:
        config = attrs.evolve(base, **fields)
    except ValueError as exc:
        raise CatalogError(f"{where}: {_keyed(str(exc))}") from None
    return CatalogModel(
        name=name,
        config=config,
        origin="models-file",
        keep_alive=own.get("keep_alive"),
        load=own.get("load", False),
        aliases=own.get("aliases", ()),
        projector=projector,
    )


def _keyed(message: str) -> str:
    """An ``EngineConfig`` error with its fields named by the file's keys."""
    for key, (field, _) in ENGINE_KEYS.items():
        if key != field:
            message = re.sub(rf"\b{field}\b", key, message)
    return message


def _existing(file: Path, name: str, key: str, text: str) -> Path:
    path = Path(text).expanduser()
    if not path.is_absolute():
        path = file.parent / path
    if not path.is_file():
        raise CatalogError(f"{_where(file, name, key)}: no such file: {path}")
    return path


def parse_models_file(
    data: Mapping[str, Any], file: Path, base: EngineConfig
) -> list[CatalogModel]:
    """The models of a models file's parsed TOML ``data`` (``file`` names it in errors and
    anchors relative paths), each from ``base`` with the file's ``[defaults]`` and its own
    settings.

    Error handling: :class:`CatalogError` naming the model and the key."""
    unknown = sorted(set(data) - {"models", "defaults"})
    if unknown:
        raise CatalogError(f"{_where(file, None)}: unknown table {unknown[0]!r} (models, defaults)")
    defaults = data.get("defaults", {})
    if not isinstance(defaults, dict):
        raise CatalogError(f"{_where(file, None)}: 'defaults' must be a table")
    if "source" in defaults or "aliases" in defaults:
        raise CatalogError(f"{_where(file, None)}: [defaults] cannot give 'source' or 'aliases'")
    models = data.get("models", {})
    if not isinstance(models, dict) or not models:
        raise CatalogError(f"{_where(file, None)}: no [models.NAME] table")
    entries: list[CatalogModel] = []
    for name, table in models.items():
        if not isinstance(table, dict):
            raise CatalogError(f"{_where(file, name)}: must be a table of settings")
        entries.append(_model_entry(file, name, {**defaults, **table}, base))
    return entries


def read_models_file(file: Path, base: EngineConfig) -> list[CatalogModel]:
    """:func:`parse_models_file` of the file at ``file``.

    Error handling: :class:`CatalogError` when it cannot be read or is not TOML."""
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogError(f"cannot read the models file {file}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"{_where(file, None)}: not TOML: {exc}") from None
    return parse_models_file(data, file, base)


# -- all together ----------------------------------------------------------------------------


def build_catalog(
    pinned: Sequence[EngineConfig],
    *,
    base: EngineConfig,
    models_file: Path | None = None,
    models_dir: Path | None = None,
    hf_cache: Path | None = None,
) -> Catalog:
    """The catalog of ``pinned`` (the ``--model`` configs, loaded at start and pinned) and
    of the models file, folder and cache given, each model of those from ``base`` (the
    command's engine flags) and its own settings.

    Error handling: :class:`CatalogError` as the parts raise it, and when two models are
    served under one name or an alias names another model."""
    from ..engine import model_name_of

    explicit = [
        CatalogModel(
            name=model_name_of(config),
            config=config,
            origin="model-flag",
            keep_alive=FOREVER,
            load=True,
        )
        for config in pinned
    ]
    if models_file is not None:
        explicit += read_models_file(models_file, base)
    names: dict[str, CatalogModel] = {}
    for model in explicit:
        for name in (model.name, *model.aliases):
            other = names.get(name)
            if other is not None:
                raise CatalogError(
                    f"two models served as {name!r}: one from {other.origin}, one from "
                    f"{model.origin}"
                )
            names[name] = model
    found: list[CatalogModel] = []
    if models_dir is not None:
        found += scan_models_dir(models_dir, base)
    if hf_cache is not None:
        found += scan_hf_cache(hf_cache, base)
    catalog = list(explicit)
    for model in found:
        if model.name in names:
            logger.info("%s %s: named already, left out", model.origin, model.name)
            continue
        names[model.name] = model
        catalog.append(model)
    return Catalog(tuple(catalog))
