"""From the parsed flags to the config values: each class built from the flags named as its
fields (a flag left out leaves the class's default, see ``llmtrio.cli._parser``). The classes'
errors name fields; :func:`build` names the flags.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from ._parser import Default
from ._threads import thread_counts
from ._values import ModelSpec

if TYPE_CHECKING:
    from ..api import RequestLimits
    from ..engine import EngineConfig, Sampling
    from ..ring import ControlConfig, DialConfig
    from ..web import ServeConfig
    from ._catalog import Catalog, CatalogModel

__all__ = [
    "build",
    "catalog",
    "control_config",
    "dial_config",
    "engine_config",
    "engine_configs",
    "flag_message",
    "given",
    "host_config",
    "on_demand",
    "request_limits",
    "sampling",
    "serve_config",
    "startup_configs",
]

T = TypeVar("T")


def given(value: Any) -> Any:
    """A flag's value as given, or its class's default when it was left out."""
    return value.value() if isinstance(value, Default) else value


def flag_message(message: str, fields: Sequence[str], flags: dict[str, str]) -> str:
    """``message`` (a config class's error, which names its fields) with each of ``fields``
    that is an option of this command named by its flag instead."""
    names = [name for name in fields if name in flags]
    if not names:
        return message
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    return pattern.sub(lambda found: flags[found[1]], message)


def build(
    cls: type[T],
    args: argparse.Namespace,
    errors: tuple[type[Exception], ...] = (ValueError,),
    **values: Any,
) -> T:
    """``cls`` from ``values`` and every flag in ``args`` named as one of its fields that was
    given (a flag left out leaves the class's default). A refusal exits with the command's
    name and the message, its fields named by their flags.
    """
    fields = [field.name for field in attrs.fields(cls) if field.init]  # type: ignore[arg-type]
    for name in fields:
        value = getattr(args, name, None)
        if name not in values and hasattr(args, name) and not isinstance(value, Default):
            values[name] = value
    try:
        return cls(**values)
    except errors as exc:
        message = flag_message(str(exc), fields, args.flags)
        raise SystemExit(f"llmtrio {args.command}: {message}") from None


def engine_configs(args: argparse.Namespace) -> list[EngineConfig]:
    """One engine config per ``--model`` (the flags shared by all; ``--threads`` per model,
    see :func:`llmtrio.cli._threads.thread_counts`); the default model's alone without
    ``--model``. ``--model-name`` names a single model. A refusal exits naming the flag."""
    from ..engine import EngineConfig, model_name_of, usable_cores

    values = [ModelSpec.parse(text) for text in (args.model or [])]
    command = f"llmtrio {args.command}"
    if len(values) > 1 and args.model_name:
        raise SystemExit(f"{command}: --model-name names one model; use --model NAME=PATH")
    if not values:
        configs = [build(EngineConfig, args, model=None, threads=1)]
    else:
        configs = []
        for spec in values:
            fields: dict[str, Any] = {"model": spec.path, "threads": 1}
            if spec.name or len(values) > 1:
                fields["model_name"] = spec.name
            if spec.hf_repo is not None:
                fields["hf_repo"] = spec.hf_repo
                fields["model"] = None
                if spec.quant is not None:
                    fields["quant"] = spec.quant
            configs.append(build(EngineConfig, args, **fields))
    names = [model_name_of(config) for config in configs]
    doubled = {name for name in names if names.count(name) > 1}
    if doubled:
        raise SystemExit(f"{command}: two models served under one name: {sorted(doubled)}")
    try:
        threads = thread_counts(names, getattr(args, "threads", None) or [], usable_cores())
        projectors = _projectors(names, getattr(args, "projectors", None) or [])
    except ValueError as exc:
        raise SystemExit(f"{command}: {exc}") from None
    return [
        attrs.evolve(c, threads=n, mmproj=p)
        for c, n, p in zip(configs, threads, projectors, strict=True)
    ]


def _projectors(names: Sequence[str], given: Sequence[tuple[str | None, Any]]) -> list[Any]:
    """Each model's ``--mmproj`` (``None``: none given): ``NAME=PATH``, or a plain ``PATH``
    when one model is served.

    Error handling: ``ValueError`` for a NAME not served, or a plain PATH with several."""
    named = {name: path for name, path in given if name is not None}
    unknown = sorted(set(named) - set(names))
    if unknown:
        raise ValueError(f"--mmproj names {', '.join(map(repr, unknown))}, which is not served")
    plain = [path for name, path in given if name is None]
    if plain and len(names) > 1:
        raise ValueError("--mmproj PATH with several models: give NAME=PATH for each")
    return [named.get(name, plain[-1] if plain else None) for name in names]


def _has_catalog(args: argparse.Namespace) -> bool:
    return bool(
        getattr(args, "models_file", None)
        or getattr(args, "models_dir", None)
        or getattr(args, "hf_cache_models", False)
    )


def catalog(args: argparse.Namespace) -> Catalog:
    """Every model the command may serve (``llmtrio.cli._catalog``): each ``--model`` (pinned;
    the default model when neither ``--model`` nor a catalog flag is given), then the
    models file's, the folder's and the Hugging Face cache's, each with the command's engine
    flags under its own settings. A refusal exits naming the model and the key."""
    from ..engine import EngineConfig, usable_cores
    from ..engine.models import HubSettings
    from ._catalog import CatalogError
    from ._catalog_build import build_catalog

    pinned = engine_configs(args) if args.model or not _has_catalog(args) else []
    shared = [n for name, n in (getattr(args, "threads", None) or []) if name is None]
    threads = shared[-1] if shared else usable_cores()
    base = build(EngineConfig, args, model=None, threads=threads)
    hub = HubSettings.from_environ(os.environ).cache_dir if args.hf_cache_models else None
    try:
        built = build_catalog(
            pinned,
            base=base,
            models_file=args.models_file,
            models_dir=args.models_dir,
            hf_cache=hub,
            adapters=getattr(args, "adapters", None) or (),
        )
    except CatalogError as exc:
        raise SystemExit(f"llmtrio {args.command}: {exc}") from None
    if not built.models:
        raise SystemExit(
            f"llmtrio {args.command}: no model to serve: the catalog (--models-file, "
            "--models-dir, --hf-cache-models) is empty; give --model or a model there"
        )
    return built


def startup_configs(args: argparse.Namespace) -> list[EngineConfig]:
    """The configs of the models loaded at start and pinned: each ``--model`` (the default
    model's when no catalog is given)."""
    return [model.config for model in catalog(args).models if model.origin == "model-flag"]


def on_demand(args: argparse.Namespace) -> list[CatalogModel]:
    """The catalog's models loaded on demand (all but ``--model``'s)."""
    return [model for model in catalog(args).models if model.origin != "model-flag"]


def host_config(args: argparse.Namespace) -> Any:
    """The budget of the models on demand (``llmtrio.worker.HostConfig``)."""
    from ..worker import HostConfig

    return build(HostConfig, args)


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The engine config of a command that runs one model (``generate``)."""
    configs = engine_configs(args)
    if len(configs) > 1:
        raise SystemExit(f"llmtrio {args.command}: give one --model")
    return configs[0]


def request_limits(args: argparse.Namespace) -> RequestLimits:
    from ..api import RequestLimits  # not from .worker, which loads the engine

    return build(RequestLimits, args)


def _api_keys(args: argparse.Namespace) -> list[str]:
    from ..web import read_key_file

    keys = list(args.api_key)
    for path in args.api_key_file:
        try:
            keys += read_key_file(path)
        except OSError as exc:
            raise ValueError(f"cannot read --api-key-file {path}: {exc}") from None
    if args.api_key_file and not keys:
        raise ValueError("--api-key-file holds no key")
    return keys


def control_config(args: argparse.Namespace, host: str) -> ControlConfig | None:
    """The control listener's config (``None`` without ``--control-port``); ``host`` when
    ``--control-host`` is not given."""
    from ..ring import ControlConfig, server_ssl_context

    files = (args.control_cert, args.control_key, args.control_ca)
    if args.control_port is None:
        if any(files):
            raise ValueError("--control-cert/--control-key/--control-ca need --control-port")
        return None
    if not all(files):
        raise ValueError("--control-port needs --control-cert, --control-key and --control-ca")
    try:
        context = server_ssl_context(args.control_cert, args.control_key, args.control_ca)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot load the control certificates: {exc}") from None
    return build(
        ControlConfig,
        args,
        ssl_context=context,
        host=args.control_host or host,
        port=args.control_port,
    )


def dial_config(args: argparse.Namespace) -> DialConfig:
    from ..ring import DialConfig

    return build(DialConfig, args)


def serve_config(args: argparse.Namespace) -> ServeConfig:
    from ..ring import RingConfig
    from ..web import ServeConfig

    origins = [
        origin.strip()
        for value in args.allowed_origins
        for origin in value.split(",")
        if origin.strip()
    ]
    return build(
        ServeConfig,
        args,
        ring=build(RingConfig, args),
        allowed_origins=origins,
        api_keys=_api_keys(args),
    )


def sampling(args: argparse.Namespace) -> Sampling:
    from ..engine import InvalidRequestError, Sampling

    return build(Sampling, args, (InvalidRequestError,))
