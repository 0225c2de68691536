"""The command's value parsers: each turns one flag's text into its value, or refuses it
with a message argparse prints beside the flag (``argparse.ArgumentTypeError``)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import attrs

__all__ = ["ModelSpec", "mib", "seconds_or_none", "template_file", "threads_value"]


def mib(text: str) -> int:
    """A size in MiB: a whole number, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of MiB: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def seconds_or_none(text: str) -> float | None:
    """Seconds, where 0 means none (no limit)."""
    try:
        return float(text) or None
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None


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


def mmproj_value(text: str) -> tuple[str | None, Path]:
    """One ``--mmproj`` value: ``PATH`` (the model, when one is served) or ``NAME=PATH`` (the
    model served as NAME); the file must exist."""
    name, sep, path = text.partition("=")
    if not sep or "/" in name or not name:
        name, path = "", text
    if not Path(path).is_file():
        raise argparse.ArgumentTypeError(f"no such projector file: {path!r}")
    return (name or None, Path(path))


def template_file(path: str) -> str:
    """The text of a chat template file."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {exc}") from None


_HF_REPO = re.compile(r"^(?P<repo>[\w.-]+/[\w.-]+)(?::(?P<quant>[\w.-]+))?$")


@attrs.frozen
class ModelSpec:
    """One ``--model`` value: ``PATH`` (served under the file's stem), ``NAME=PATH`` (under
    NAME), or a Hugging Face repo ``owner/repo`` or ``owner/repo:QUANT`` (under
    ``owner/repo:QUANT``, the form llama.cpp's ``-hf`` and Ollama take). A value that is an
    existing file, or ends in ``.gguf``, is a path; else one shaped ``owner/repo[:QUANT]`` is
    a repo. (The name served is the engine's rule, ``llmtrio.engine.model_name_of``.)"""

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
