"""The catalog: every model a worker may serve, loaded or not, and each one's settings.

Models come from four places, read once at start:

- ``--model`` (each one loaded at start and pinned: never unloaded by a client or the
  budget);
- ``--models-file FILE``, a TOML file of one ``[models.NAME]`` table per model (llama-swap's
  and llama.cpp's router presets are the anchors), an optional ``[defaults]`` table applying
  to every model of the file::

      [defaults]
      ctx_size = 4096

      [models."qwen3.5"]
      source = "unsloth/Qwen3.5-0.8B-GGUF:Q4_K_M"  # or a path, relative to this file
      keep_alive = "10m"                           # seconds or a duration; -1: for ever
      load = true                                  # loaded at start
      cache_type_k = "q8_0"
      aliases = ["default"]

- ``--models-dir DIR``: each ``*.gguf`` in it (a split model by its first part, every part
  present), served under its stem, and each subfolder holding one model (its split parts
  and an ``mmproj`` projector beside it), served under the folder's name;
- ``--hf-cache-models``: the Hugging Face cache (what ``llmtrio pull`` fetched), each GGUF
  of a repo's current snapshot served as ``owner/repo:QUANT``.

A name given twice by ``--model`` and the models file, or an alias naming another model, is
refused; a folder's or the cache's model that an explicit one already names is left out.

Pure but for reading the file and listing folders; nothing is loaded here. Error handling:
:class:`CatalogError` (a ``ValueError``) naming the file, the model and the key.
"""

from __future__ import annotations

import logging
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import attrs

from ..api import FOREVER, keep_alive_seconds

if TYPE_CHECKING:
    from ..engine import EngineConfig

__all__ = [
    "Catalog",
    "CatalogError",
    "CatalogModel",
    "Origin",
    "build_catalog",
    "parse_models_file",
    "read_models_file",
    "scan_hf_cache",
    "scan_models_dir",
]

logger = logging.getLogger("llmtrio.catalog")

Origin = Literal["model-flag", "models-file", "models-dir", "hf-cache"]

_SPLIT = re.compile(r"^(?P<prefix>.*)-(?P<part>\d{5})-of-(?P<total>\d{5})\.gguf$", re.IGNORECASE)
_HF_REPO = re.compile(r"^(?P<repo>[\w.-]+/[\w.-]+)(?::(?P<quant>[\w.-]+))?$")
_QUANT = re.compile(r"^(I?Q\d\w*|B?F16|F32|TQ\d\w*|MXFP4\w*)$", re.IGNORECASE)


class CatalogError(ValueError):
    """A models file, folder or setting the command refuses to start with."""


@attrs.frozen
class CatalogModel:
    """One model of the catalog: its ``config`` (``model_name`` is ``name``), where it was
    listed, its ``keep_alive`` in seconds (``None``: the worker's ``--keep-alive``;
    :data:`~llmtrio.api.FOREVER`: pinned), whether it is loaded at start, the other
    names it answers to, and its projector (an ``mmproj`` file beside it, for image input)."""

    name: str
    config: EngineConfig
    origin: Origin
    keep_alive: float | None = None
    load: bool = False
    aliases: tuple[str, ...] = ()
    projector: Path | None = None

    @property
    def pinned(self) -> bool:
        """Never unloaded by a client's ``keep_alive`` or by the budget."""
        return self.keep_alive == FOREVER


@attrs.frozen
class Catalog:
    """The models a worker may serve, in the order listed (explicit ones first)."""

    models: tuple[CatalogModel, ...] = ()

    def find(self, name: str) -> CatalogModel | None:
        """The model served as ``name`` (its name or an alias); ``None`` when none is. A name
        is only ever looked up, never read as a path."""
        for model in self.models:
            if name == model.name or name in model.aliases:
                return model
        return None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(model.name for model in self.models)

    def __len__(self) -> int:
        return len(self.models)


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
OWN_KEYS = ("source", "keep_alive", "load", "aliases", "projector", "chat_template_file")


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
    found = _HF_REPO.match(text)
    if found is not None and not path.exists() and not text.lower().endswith(".gguf"):
        fields: dict[str, Any] = {"hf_repo": found["repo"], "model": None}
        if found["quant"]:
            fields["quant"] = found["quant"]
        return fields, None
    if path.is_dir():
        model, projector = _folder_model(path)
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
            elif key in ("source", "projector", "chat_template_file"):
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


# -- folders and the Hugging Face cache ------------------------------------------------------


def _split_parts(name: str) -> tuple[str, ...]:
    match = _SPLIT.match(name)
    if match is None:
        return (name,)
    prefix, total = match["prefix"], match["total"]
    return tuple(f"{prefix}-{i:05d}-of-{total}.gguf" for i in range(1, int(total) + 1))


def _models_in(names: Sequence[str]) -> tuple[list[str], list[str]]:
    """The models among file ``names`` (a split model by its first part, every part
    present; an incomplete one logged and left out) and the projectors."""
    present = set(names)
    models, projectors = [], []
    for name in sorted(names):
        if not name.lower().endswith(".gguf"):
            continue
        if "mmproj" in name.lower():
            projectors.append(name)
            continue
        parts = _split_parts(name)
        if parts[0] != name:
            continue
        missing = [p for p in parts if p not in present]
        if missing:
            logger.warning(
                "left out %s: %d of its %d parts are missing", name, len(missing), len(parts)
            )
            continue
        models.append(name)
    return models, projectors


def _stem(file: str) -> str:
    match = _SPLIT.match(file)
    return match["prefix"] if match else Path(file).stem


def _folder_model(folder: Path) -> tuple[Path, Path | None]:
    """The one model a folder holds and its projector.

    Error handling: :class:`CatalogError` when it holds none or several."""
    names = [p.name for p in folder.iterdir() if p.is_file()]
    models, projectors = _models_in(names)
    if len(models) != 1:
        held = ", ".join(models) or "no complete GGUF model"
        raise CatalogError(f"the folder {folder} must hold one model, not: {held}")
    return folder / models[0], folder / projectors[0] if projectors else None


def scan_models_dir(folder: Path, base: EngineConfig) -> list[CatalogModel]:
    """The models of ``--models-dir``: each GGUF in it under its stem, each subfolder that
    holds one model under the folder's name (a subfolder holding none or several is logged
    and left out).

    Error handling: :class:`CatalogError` when ``folder`` is not a readable folder."""
    try:
        children = sorted(folder.iterdir())
    except OSError as exc:
        raise CatalogError(f"--models-dir {folder}: {exc.strerror or exc}") from None
    files = [p.name for p in children if p.is_file()]
    models, _ = _models_in(files)
    entries = [
        CatalogModel(
            name=_stem(file),
            config=attrs.evolve(base, model=folder / file, model_name=_stem(file)),
            origin="models-dir",
        )
        for file in models
    ]
    for child in children:
        if not child.is_dir():
            continue
        try:
            path, projector = _folder_model(child)
        except (CatalogError, OSError) as exc:
            logger.warning("--models-dir: left out %s: %s", child, exc)
            continue
        entries.append(
            CatalogModel(
                name=child.name,
                config=attrs.evolve(base, model=path, model_name=child.name),
                origin="models-dir",
                projector=projector,
            )
        )
    return entries


def _quant_of(stem: str) -> str:
    """The quantization a GGUF file's stem names (its last part shaped like one), else the
    stem itself."""
    for part in reversed(re.split(r"[-.]", stem)):
        if _QUANT.match(part):
            return part.upper()
    return stem


def scan_hf_cache(cache_dir: Path, base: EngineConfig) -> list[CatalogModel]:
    """The GGUF models of the Hugging Face cache at ``cache_dir``: of each repo the snapshot
    ``refs/main`` names (else the newest), each model as ``owner/repo:QUANT``; nothing when
    there is no cache."""
    entries: list[CatalogModel] = []
    try:
        repos = sorted(p for p in cache_dir.iterdir() if p.name.startswith("models--"))
    except OSError:
        return []
    for storage in repos:
        repo = "/".join(storage.name.removeprefix("models--").split("--", 1))
        snapshot = _current_snapshot(storage)
        if snapshot is None:
            continue
        names = [p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*.gguf")]
        models, projectors = _models_in(names)
        for file in models:
            name = f"{repo}:{_quant_of(_stem(Path(file).name))}"
            if any(entry.name == name for entry in entries):
                continue
            entries.append(
                CatalogModel(
                    name=name,
                    config=attrs.evolve(base, model=snapshot / file, model_name=name),
                    origin="hf-cache",
                    projector=snapshot / projectors[0] if len(projectors) == 1 else None,
                )
            )
    return entries


def _current_snapshot(storage: Path) -> Path | None:
    snapshots = storage / "snapshots"
    try:
        main = (storage / "refs" / "main").read_text().strip()
    except OSError:
        main = ""
    if main and (snapshots / main).is_dir():
        return snapshots / main
    try:
        found = [p for p in snapshots.iterdir() if p.is_dir()]
    except OSError:
        return None
    return max(found, key=lambda p: p.stat().st_mtime, default=None)


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
