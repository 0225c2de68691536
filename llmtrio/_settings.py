"""The command's settings: each option's default read from its config class, and the config
values built from the parsed options.

A setting is a field of a config class (``EngineConfig``, ``ServeConfig``, ``RingConfig``,
...), its default written there alone; an option of the same ``dest`` sets it. A default is a
:class:`Default`, looked up only to be shown (the engine's classes load llama.cpp, which
``llmtrio serve --no-local-worker`` must not), and an option left out is not passed, so the
class's own default applies. The classes' errors name fields; :func:`build` names the flags.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

if TYPE_CHECKING:
    from ._fields import RequestLimits
    from .engine import EngineConfig, Sampling
    from .ring import ControlConfig, DialConfig
    from .web import ServeConfig

__all__ = [
    "Default",
    "build",
    "control_config",
    "default_of",
    "dial_config",
    "engine_config",
    "flag_message",
    "flags_of",
    "given",
    "mib",
    "request_limits",
    "sampling",
    "seconds_or_none",
    "serve_config",
    "thread_counts",
    "threads_value",
]

T = TypeVar("T")


#: attrs' ``Factory`` class (its stubs type ``attrs.Factory`` as a function).
_FACTORY: type[Any] = type(attrs.Factory(list))


def default_of(owner: Any, name: str) -> Any:
    """The default of ``owner``'s ``name``: an attrs class's field (a factory is called now)
    or a function's keyword parameter."""
    if not attrs.has(owner):
        return inspect.signature(owner).parameters[name].default
    default = attrs.fields_dict(owner)[name].default
    return default.factory() if isinstance(default, _FACTORY) else default


@attrs.frozen
class Default:
    """A flag's default: the default of ``name`` in ``owner`` (``"module:Class"``), the one
    place it is written. A flag left out keeps this as its value, so the class's own default
    applies (see :func:`build`); it is looked up only to be shown (``%(default)s`` in a
    help text), because the engine's classes load llama.cpp, which
    ``llmtrio serve --no-local-worker`` must not."""

    owner: str
    name: str

    def value(self) -> Any:
        module, _, qualname = self.owner.partition(":")
        return default_of(getattr(importlib.import_module(module), qualname), self.name)

    def __str__(self) -> str:
        return str(self.value())


def given(value: Any) -> Any:
    """A flag's value as given, or its class's default when it was left out."""
    return value.value() if isinstance(value, Default) else value


def flags_of(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each option's ``dest`` and its flag, as ``parser`` has them: a config class's field and
    the option of the same ``dest`` are one setting."""
    return {
        action.dest: max(action.option_strings, key=len)
        for action in parser._actions
        if action.option_strings
    }


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


def mib(text: str) -> int:
    """A size in MiB: a whole number, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of MiB: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


_HF_REPO = re.compile(r"^(?P<repo>[\w.-]+/[\w.-]+)(?::(?P<quant>[\w.-]+))?$")


@attrs.frozen
class ModelSpec:
    """One ``--model`` value: ``PATH`` (served under the file's stem), ``NAME=PATH`` (under
    NAME), or a Hugging Face repo ``owner/repo`` or ``owner/repo:QUANT`` (under
    ``owner/repo:QUANT``, the form llama.cpp's ``-hf`` and Ollama take). A value that is an
    existing file, or ends in ``.gguf``, is a path; else one shaped ``owner/repo[:QUANT]`` is
    a repo."""

    name: str | None
    path: Path | None = None
    hf_repo: str | None = None
    quant: str | None = None

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        name, sep, rest = text.partition("=")
        if not sep:
            name, rest = "", text
        elif not name or not rest:
            raise ValueError(f"--model {text!r}: give NAME=PATH with both parts")
        source = Path(rest).expanduser()
        found = _HF_REPO.match(rest)
        if source.is_file() or rest.endswith(".gguf") or found is None:
            return cls(name or None, path=source)
        return cls(name or None, hf_repo=found["repo"], quant=found["quant"])


def split_threads(cores: int, engines: int) -> int:
    """The default llama.cpp threads of each of ``engines`` engines in one process: the cores
    shared evenly (rounded down, at least 1), so that together they never run more compute
    threads than the machine has cores."""
    return max(1, cores // max(1, engines))


def threads_value(text: str) -> tuple[str | None, int]:
    """One ``--threads`` value: ``N`` (every model) or ``NAME=N`` (the model served as NAME)."""
    name, sep, count = text.rpartition("=")
    try:
        threads = int(count)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not N or NAME=N: {text!r}") from None
    if sep and not name:
        raise argparse.ArgumentTypeError(f"NAME=N names no model: {text!r}")
    if threads < 1:
        raise argparse.ArgumentTypeError(f"threads must be at least 1: {text!r}")
    return (name or None, threads)


def thread_counts(
    names: Sequence[str], given: Sequence[tuple[str | None, int]], cores: int
) -> list[int]:
    """Each model's llama.cpp threads, in ``names``' order: its own ``NAME=N``; else a plain
    ``N`` (the last one given); else an even share of the cores that the named counts leave
    (rounded down, at least 1), so that by default the engines together never run more
    compute threads than the machine has cores.

    Error handling: ``ValueError`` naming a ``NAME=N`` whose NAME is not served."""
    named = {name: threads for name, threads in given if name is not None}
    unknown = sorted(set(named) - set(names))
    if unknown:
        raise ValueError(
            f"--threads names {', '.join(map(repr, unknown))}, which is not served "
            f"(served: {', '.join(map(repr, names))})"
        )
    plain = [threads for name, threads in given if name is None]
    if plain:
        share = plain[-1]
    else:
        rest = sum(1 for name in names if name not in named)
        share = split_threads(cores - sum(named.get(name, 0) for name in names), rest)
    return [named.get(name, share) for name in names]


def engine_configs(args: argparse.Namespace) -> list[EngineConfig]:
    """One engine config per ``--model`` (the flags shared by all; ``--threads`` per model,
    see :func:`thread_counts`); the default model's alone without ``--model``.
    ``--model-name`` names a single model. A refusal exits naming the flag."""
    from .engine import EngineConfig

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
    names = [
        c.model_name or (c.model.stem if c.model else f"{c.hf_repo}:{c.quant}") for c in configs
    ]
    doubled = {name for name in names if names.count(name) > 1}
    if doubled:
        raise SystemExit(f"{command}: two models served under one name: {sorted(doubled)}")
    try:
        threads = thread_counts(names, getattr(args, "threads", None) or [], os.cpu_count() or 1)
    except ValueError as exc:
        raise SystemExit(f"{command}: {exc}") from None
    return [attrs.evolve(c, threads=n) for c, n in zip(configs, threads, strict=True)]


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The engine config of a command that runs one model (``generate``)."""
    configs = engine_configs(args)
    if len(configs) > 1:
        raise SystemExit(f"llmtrio {args.command}: give one --model")
    return configs[0]


def request_limits(args: argparse.Namespace) -> RequestLimits:
    from ._fields import RequestLimits  # not from .worker, which loads the engine

    return build(RequestLimits, args)


def _api_keys(args: argparse.Namespace) -> list[str]:
    from .web import read_key_file

    keys = list(args.api_key)
    for path in args.api_key_file:
        try:
            keys += read_key_file(path)
        except OSError as exc:
            raise ValueError(f"cannot read --api-key-file {path}: {exc}") from None
    if args.api_key_file and not keys:
        raise ValueError("--api-key-file holds no key")
    return keys


def seconds_or_none(text: str) -> float | None:
    """Seconds, where 0 means none (no limit)."""
    try:
        return float(text) or None
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None


def control_config(args: argparse.Namespace, host: str) -> ControlConfig | None:
    """The control listener's config (``None`` without ``--control-port``); ``host`` when
    ``--control-host`` is not given."""
    from .ring import ControlConfig, server_ssl_context

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
    from .ring import DialConfig

    return build(DialConfig, args)


def serve_config(args: argparse.Namespace) -> ServeConfig:
    from .ring import RingConfig
    from .web import ServeConfig

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
    from .engine import InvalidRequestError, Sampling

    return build(Sampling, args, (InvalidRequestError,))
