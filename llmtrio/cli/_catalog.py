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

This module holds the catalog's values and reads folders and the cache;
``llmtrio.cli._catalog_build`` reads the models file and puts the four together.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import attrs

from ..api import FOREVER

if TYPE_CHECKING:
    from ..engine import EngineConfig

__all__ = [
    "HF_REPO",
    "Catalog",
    "CatalogError",
    "CatalogModel",
    "Origin",
    "folder_model",
    "scan_hf_cache",
    "scan_models_dir",
]

logger = logging.getLogger("llmtrio.catalog")

Origin = Literal["model-flag", "models-file", "models-dir", "hf-cache"]

_SPLIT = re.compile(r"^(?P<prefix>.*)-(?P<part>\d{5})-of-(?P<total>\d{5})\.gguf$", re.IGNORECASE)
HF_REPO = re.compile(r"^(?P<repo>[\w.-]+/[\w.-]+)(?::(?P<quant>[\w.-]+))?$")
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


def folder_model(folder: Path) -> tuple[Path, Path | None]:
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
            path, projector = folder_model(child)
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
