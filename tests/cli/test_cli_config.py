"""The command's settings are its config classes': each default written once, in the class
(the parser reads it from there), and each error naming a field in the class and its flag at
the command line."""

from __future__ import annotations

import argparse
import importlib
import inspect
import ssl
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from llmtrio.api import RequestLimits
from llmtrio.cli import _configs as configs
from llmtrio.cli import _main as cli
from llmtrio.cli import _parser, run_worker
from llmtrio.cli import _serve as server
from llmtrio.cli._flags import COMMANDS, OPTIONS
from llmtrio.engine import EngineConfig, InvalidRequestError, Sampling
from llmtrio.ring import ControlConfig, DialConfig, RingConfig
from llmtrio.web import ServeConfig

NEEDED = {
    "generate": ["--prompt=hi"],
    "serve": [],
    "worker": ["--ingress-url=wss://i:1", "--tls-cert=c.pem", "--ca=ca.pem"],
}
#: The config classes (and functions) each command builds from its flags.
BUILDS: dict[str, tuple[Any, ...]] = {
    "generate": (EngineConfig, Sampling),
    "serve": (EngineConfig, ServeConfig, RingConfig, RequestLimits, ControlConfig),
    "worker": (EngineConfig, RequestLimits, DialConfig, run_worker),
}
#: ControlConfig's host and port come from --control-host and --control-port.
# Flags whose values are not the field's: --threads takes [NAME=]N per model
# (llmtrio.cli._threads.thread_counts, tested in test_model_resolution.py).
OTHER_FLAG = {(ControlConfig, "host"), (ControlConfig, "port"), (EngineConfig, "threads")}


def commands() -> dict[str, argparse.ArgumentParser]:
    (sub,) = (a for a in cli._parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def fields(owner: Any) -> set[str]:
    if attrs.has(owner):
        return set(attrs.fields_dict(owner))
    return set(inspect.signature(owner).parameters)


def parse(command: str, *flags: str) -> argparse.Namespace:
    return cli._parser().parse_args([command, *flags, *NEEDED[command]])


@pytest.mark.parametrize("command", sorted(BUILDS))
def test_every_flag_of_a_config_field_has_the_classes_default(command: str) -> None:
    """A flag whose ``dest`` is a field of a class its command builds defaults to that
    field's default, read from the class: a literal copy in the parser is refused (it would
    drift when the class changes)."""
    checked = 0
    for action in commands()[command]._actions:
        for owner in BUILDS[command]:
            if action.dest not in fields(owner) or (owner, action.dest) in OTHER_FLAG:
                continue
            expected = _parser.default_of(owner, action.dest)
            default = action.default
            if isinstance(default, list):  # append: none given, the class gets what is given
                assert default == [] and expected == (), action.dest
            elif default is None:  # an option with no default: the class's is None too
                assert expected is None, action.dest
            else:
                assert isinstance(default, _parser.Default), (action.dest, default)
                assert default.value() == expected, action.dest
            checked += 1
    assert checked >= {"generate": 18, "serve": 33, "worker": 21}[command]


def test_every_row_naming_a_class_names_one_of_its_fields() -> None:
    """A row ``Class.field`` of the flag table gives that field: the class (where
    ``_parser.HOMES`` says it lives) has it, and the option's ``dest`` is its name, with the
    field's default."""
    rows = {id(row): row for row in OPTIONS}
    for command in COMMANDS:
        for part in command.sections:
            for row in part.rows:
                for each in row.flags if isinstance(row, _parser.OneOf) else (row,):
                    rows[id(each)] = each
    named = [row for row in rows.values() if "." in row.setting]
    assert len(named) == 65
    for row in named:
        owner, _, name = row.setting.partition(".")
        assert name in fields(getattr(importlib.import_module(_parser.HOMES[owner]), owner)), row
    shown = 0
    for parser in commands().values():
        for action in parser._actions:
            if isinstance(action.default, _parser.Default):
                assert action.default.name == action.dest
                shown += 1
    assert shown == 31 + 26 + 57 + 46  # generate, embed, serve, worker (engine rows in each)


@pytest.mark.parametrize("command", sorted(NEEDED))
def test_a_command_given_no_settings_builds_the_classes_defaults(command: str) -> None:
    args = parse(command)
    assert configs.engine_config(args) == EngineConfig()
    if command == "generate":
        assert configs.sampling(args) == Sampling()
    else:
        assert configs.request_limits(args) == RequestLimits()
    if command == "serve":
        assert configs.serve_config(args) == ServeConfig()
        assert configs.control_config(args, "h") is None
    if command == "worker":
        assert configs.dial_config(args) == DialConfig()


def test_help_shows_the_classes_defaults() -> None:
    text = " ".join(commands()["serve"].format_help().split())
    ring, serve = RingConfig(), ServeConfig()
    assert f"before 503 (default {ring.max_streams})" in text
    assert f"before 503 (default {ring.park_timeout})" in text
    assert f"on shutdown (default {serve.graceful_timeout})" in text
    assert f"(default {EngineConfig().max_inflight})" in text
    assert f"(default {EngineConfig().hf_repo})" in text


def test_given_flags_reach_the_configs() -> None:
    args = parse(
        "serve", "--ring-streams=3", "--park-timeout=2.5", "--request-timeout=0",
        "--no-prompt-cache", "--no-fallback", "--cache-ram=0", "--max-tokens-limit=9",
        "--allowed-origins=https://a.example,https://b.example", "--threads=3",
    )  # fmt: skip
    serve = configs.serve_config(args)
    assert serve.ring == RingConfig(max_streams=3, park_timeout=2.5)
    assert serve.request_timeout is None
    assert serve.allowed_origins == ("https://a.example", "https://b.example")
    engine = configs.engine_config(args)
    assert (engine.prompt_cache, engine.allow_fallback, engine.cache_ram_mib) == (False, False, 0)
    assert engine.threads == 3
    assert configs.request_limits(args).max_tokens == 9


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_default_max_tokens_is_a_limit_of_serve_and_worker(command: str) -> None:
    args = parse(command, "--default-max-tokens=7", "--max-tokens-limit=9")
    assert configs.request_limits(args) == RequestLimits(max_tokens=9, default_max_tokens=7)


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_allowed_media_domains_reach_serve_and_worker(command: str) -> None:
    args = parse(
        command, "--allowed-media-domains", "Images.Example", "*.cdn.example,10.0.0.7",
        "--media-fetch-timeout=2.5", "--max-media-fetch-bytes=1000",
    )  # fmt: skip
    assert configs.request_limits(args) == RequestLimits(
        allowed_media_domains=("images.example", "*.cdn.example", "10.0.0.7"),
        media_fetch_timeout=2.5,
        max_media_fetch_bytes=1000,
    )


REFUSALS: list[tuple[Callable[[], object], str, list[str], str]] = [
    # (the class refusing, its message, the command line, the command's message)
    (
        lambda: ServeConfig(tls_cert=Path("c.pem")),
        "give both tls_cert and tls_key, or neither",
        ["serve", "--tls-cert=c.pem"],
        "llmtrio serve: give both --tls-cert and --tls-key, or neither",
    ),
    (
        lambda: ServeConfig(host="0.0.0.0"),
        "without tls_cert/tls_key llmtrio serves on loopback only",
        ["serve", "--host=0.0.0.0"],
        "without --tls-cert/--tls-key llmtrio serves on loopback only",
    ),
    (
        lambda: RingConfig(park_timeout=0),
        "park_timeout must be more than 0",
        ["serve", "--park-timeout=0"],
        "llmtrio serve: --park-timeout must be more than 0",
    ),
    (
        lambda: RingConfig(max_streams=0),
        "max_streams must be at least 1",
        ["serve", "--ring-streams=0"],
        "llmtrio serve: --ring-streams must be at least 1",
    ),
    (
        lambda: ServeConfig(idle_timeout=0),
        "idle_timeout must be more than 0",
        ["serve", "--idle-timeout=0"],
        "llmtrio serve: --idle-timeout must be more than 0",
    ),
    (
        lambda: RequestLimits(max_tokens=0),
        "max_tokens must be at least 1",
        ["serve", "--max-tokens-limit=0"],
        "llmtrio serve: --max-tokens-limit must be at least 1, not 0",
    ),
    (
        lambda: RequestLimits(max_tokens=8, default_max_tokens=9),
        "default_max_tokens (9) must not exceed max_tokens (8)",
        ["serve", "--max-tokens-limit=8", "--default-max-tokens=9"],
        "llmtrio serve: --default-max-tokens (9) must not exceed --max-tokens-limit (8)",
    ),
    (
        lambda: RequestLimits(max_stop=0),
        "max_stop must be at least 1",
        ["worker", "--max-stop=0", *NEEDED["worker"]],
        "llmtrio worker: --max-stop must be at least 1, not 0",
    ),
    (
        lambda: DialConfig(ingress_timeout=0),
        "ingress_timeout must be more than 0",
        ["worker", "--ingress-timeout=0", *NEEDED["worker"]],
        "llmtrio worker: --ingress-timeout must be more than 0",
    ),
    (
        lambda: EngineConfig(ctx_size=8),
        "ctx_size must be at least 16",
        ["serve", "--ctx-size=8"],
        "llmtrio serve: --ctx-size must be at least 16",
    ),
    (
        lambda: EngineConfig(prefill_chunk=0),
        "prefill_chunk must be at least 1",
        ["generate", "--prompt=hi", "--prefill-chunk=0"],
        "llmtrio generate: --prefill-chunk must be at least 1",
    ),
    (
        lambda: Sampling(top_p=0),
        "top_p must be in (0, 1]",
        ["generate", "--prompt=hi", "--top-p=0"],
        "llmtrio generate: --top-p must be in (0, 1]",
    ),
]


def build_all(args: argparse.Namespace) -> None:
    """Every config the command builds, as it builds them."""
    configs.engine_config(args)
    if args.command == "generate":
        configs.sampling(args)
        return
    configs.request_limits(args)
    if args.command == "serve":
        configs.serve_config(args)
    else:
        configs.dial_config(args)


@pytest.mark.parametrize(("refuse", "field_message", "argv", "flag_message"), REFUSALS)
def test_a_class_names_the_field_and_the_command_the_flag(
    refuse: Callable[[], object], field_message: str, argv: list[str], flag_message: str
) -> None:
    with pytest.raises((ValueError, InvalidRequestError)) as refused:
        refuse()
    assert field_message in str(refused.value)
    assert "--" not in str(refused.value)
    with pytest.raises(SystemExit) as exited:
        build_all(cli._parser().parse_args(argv))
    assert flag_message in str(exited.value.code)


def test_the_command_prints_the_flag_and_exits_without_a_traceback() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "llmtrio", "serve", "--no-local-worker", "--park-timeout=-1"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert "llmtrio serve: --park-timeout must be more than 0, not -1.0" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_message_names_a_flag_only_for_a_whole_field_name() -> None:
    flags = {"max_tokens": "--max-tokens-limit", "max_stop": "--max-stop"}
    message = "max_tokens must be at least 1; max_tokens_x and max_stop_chars stay"
    assert configs.flag_message(message, ["max_tokens", "max_stop", "other"], flags) == (
        "--max-tokens-limit must be at least 1; max_tokens_x and max_stop_chars stay"
    )


def test_a_chat_template_file_replaces_the_models_template(tmp_path: Path) -> None:
    template = tmp_path / "qwen.jinja"
    template.write_text("{{ messages[0].content }}<function=", encoding="utf-8")
    config = configs.engine_config(parse("serve", f"--chat-template-file={template}"))
    assert config.chat_template == template.read_text(encoding="utf-8")
    assert configs.engine_config(parse("serve")).chat_template is None
    with pytest.raises(SystemExit):
        parse("serve", f"--chat-template-file={tmp_path / 'missing.jinja'}")


def test_serve_runs_the_ingress_alone_or_with_a_local_worker_as_the_composition_root_says() -> None:
    """``server.serving`` makes ``llmtrio serve``'s choice: the engines' configs are asked
    for only where a local worker runs, and an ingress with neither a local worker nor a
    control listener is refused before anything runs; the command prints the refusal."""
    asked: list[str] = []

    def engines() -> list[EngineConfig]:
        asked.append("engines")
        return [EngineConfig()]

    control = ControlConfig(ssl.create_default_context(ssl.Purpose.CLIENT_AUTH))
    alone = server.serving(ServeConfig(), control, None, local_worker=False, engine_configs=engines)
    assert asked == []
    local = server.serving(ServeConfig(), None, None, local_worker=True, engine_configs=engines)
    assert asked == ["engines"]
    assert alone.func is not local.func  # type: ignore[attr-defined]
    assert local.func is server.serve_until_signalled  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="no local worker needs a control listener"):
        server.serving(ServeConfig(), None, None, local_worker=False, engine_configs=engines)
    assert asked == ["engines"]
    with pytest.raises(SystemExit) as exited:
        cli._serve(parse("serve", "--no-local-worker"))
    assert exited.value.code == (
        "llmtrio serve: an ingress with no local worker needs a control listener "
        "(or nothing serves)"
    )


def test_mmproj_per_model(tmp_path: Path) -> None:
    projector = tmp_path / "mmproj-F16.gguf"
    projector.write_bytes(b"gguf")
    one = configs.engine_configs(parse("serve", "--model", "a.gguf", "--mmproj", str(projector)))
    assert [c.mmproj for c in one] == [projector]
    args = parse("serve", "--model", "a=a.gguf", "--model", "b=b.gguf", f"--mmproj=b={projector}")
    assert [c.mmproj for c in configs.engine_configs(args)] == [None, projector]
    with pytest.raises(SystemExit, match="NAME=PATH for each"):
        configs.engine_configs(
            parse("serve", "--model", "a=a.gguf", "--model", "b=b.gguf", "--mmproj", str(projector))
        )
    with pytest.raises(SystemExit):  # no such file
        parse("serve", "--mmproj", str(tmp_path / "missing.gguf"))
    off = configs.engine_configs(parse("serve", "--model", "a.gguf", "--no-mmproj"))
    assert off[0].vision is False
