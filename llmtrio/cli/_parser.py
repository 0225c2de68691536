"""The command's parser, built from a table of flags (``llmtrio.cli._flags``): for each flag,
the setting it gives and its help.

A setting is a field of a config class (``EngineConfig``, ``ServeConfig``, ``RingConfig``,
...), its default written there alone. A row naming ``Class.field`` gives that field: the
option's ``dest`` is the field, and its default a :class:`Default`, looked up only to be shown
(the engine's classes load llama.cpp, which ``llmtrio serve --no-local-worker`` must not); an
option left out keeps its :class:`Default`, so the class's own default applies
(``llmtrio.cli._configs.build``). A row naming a bare ``name`` is a value the command reads
itself (or a field whose class default is ``None`` as well), its default argparse's
(``None``, or the row's ``default=``).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

__all__ = [
    "Command",
    "Default",
    "Flag",
    "OneOf",
    "Section",
    "default_of",
    "flag",
    "flags_of",
    "parser",
    "section",
]


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
    applies; it is looked up only to be shown (``%(default)s`` in a help text), because the
    engine's classes load llama.cpp, which ``llmtrio serve --no-local-worker`` must not."""

    owner: str
    name: str

    def value(self) -> Any:
        module, _, qualname = self.owner.partition(":")
        return default_of(getattr(importlib.import_module(module), qualname), self.name)

    def __str__(self) -> str:
        return str(self.value())


#: Where each class a row names lives (imported only to show a default).
HOMES = {
    "EngineConfig": "llmtrio.engine",
    "Sampling": "llmtrio.engine",
    "RequestLimits": "llmtrio.api",
    "ServeConfig": "llmtrio.web",
    "RingConfig": "llmtrio.ring",
    "ControlConfig": "llmtrio.ring",
    "DialConfig": "llmtrio.ring",
    "run_worker": "llmtrio.cli._worker",
    "HostConfig": "llmtrio.worker",
}


@attrs.frozen
class Flag:
    """One row: the option's names (or a positional's), the setting it gives (``Class.field``
    or a bare ``name``, see the module's docstring), its help, and argparse's other options
    (``type``, ``action``, ``metavar``, ...)."""

    names: tuple[str, ...]
    setting: str
    help: str | None
    options: Mapping[str, Any]

    def add_to(self, group: Any) -> None:
        """Add this option to ``group`` (a parser, an argument group or an exclusive one)."""
        owner, _, dest = self.setting.rpartition(".")
        options = dict(self.options)
        if owner:
            options["default"] = Default(f"{HOMES[owner]}:{owner}", dest)
        if self.names[0].startswith("-"):
            options["dest"] = dest
        group.add_argument(*self.names, help=self.help, **options)


def flag(names: str, setting: str, help: str | None = None, **options: Any) -> Flag:
    """A row: ``names`` space-separated (``"-v --verbose"``)."""
    return Flag(tuple(names.split()), setting, help, options)


@attrs.frozen
class OneOf:
    """Rows of which a command line may give one (argparse's mutually exclusive group)."""

    flags: tuple[Flag, ...]


@attrs.frozen
class Section:
    """Rows shown together under ``title``; without a title, the command's own options."""

    title: str | None
    rows: tuple[Flag | OneOf, ...]

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        group: Any = parser if self.title is None else parser.add_argument_group(self.title)
        for row in self.rows:
            if isinstance(row, OneOf):
                exclusive = group.add_mutually_exclusive_group()
                for each in row.flags:
                    each.add_to(exclusive)
            else:
                row.add_to(group)


@attrs.frozen
class Command:
    """A subcommand: its name, the one-line help ``llmtrio --help`` lists, its sections."""

    name: str
    help: str
    sections: tuple[Section, ...]


def section(title: str | None, *rows: Flag | OneOf) -> Section:
    return Section(title, rows)


def flags_of(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each option's ``dest`` and its flag, as ``parser`` has them: a config class's field and
    the option of the same ``dest`` are one setting."""
    return {
        action.dest: max(action.option_strings, key=len)
        for action in parser._actions
        if action.option_strings
    }


def parser(
    description: str | None, options: Sequence[Flag], commands: Sequence[Command]
) -> argparse.ArgumentParser:
    """The ``llmtrio`` parser: ``options`` before the command, then a subcommand per
    command, each knowing its flags (``flags``, for messages that name them)."""
    top = argparse.ArgumentParser(prog="llmtrio", description=description)
    for option in options:
        option.add_to(top)
    sub = top.add_subparsers(dest="command", required=True)
    for command in commands:
        each = sub.add_parser(command.name, help=command.help)
        for part in command.sections:
            part.add_to(each)
        each.set_defaults(flags=flags_of(each))
    return top
