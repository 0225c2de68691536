"""Which files of a Hugging Face repo (or of its cached snapshot) to load: the GGUF for a quant
or a named file, every part of a split model, and the vision projector beside the weights.
Pure: a file listing in, names out."""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["NoMatchingFile", "choose_gguf", "choose_mmproj", "unsplit_stem"]

_SPLIT = re.compile(r"^(?P<prefix>.*)-(?P<part>\d{5})-of-(?P<total>\d{5})\.gguf$", re.IGNORECASE)


class NoMatchingFile(Exception):
    """A repo's file list has no usable file; the message completes "the repo ..."."""


def _gguf_listing(files: Iterable[str]) -> str:
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf"))
    if not ggufs:
        return "no GGUF files at all"
    shown = ", ".join(ggufs[:12])
    more = f", and {len(ggufs) - 12} more" if len(ggufs) > 12 else ""
    return f"GGUF files: {shown}{more}"


def _split_set_names(name: str) -> tuple[str, ...]:
    """The names of all parts of the split model ``name`` belongs to, first first."""
    match = _SPLIT.match(name)
    if match is None or not 1 <= int(match["part"]) <= int(match["total"]):
        return (name,)
    prefix, total = match["prefix"], match["total"]
    return tuple(f"{prefix}-{i:05d}-of-{total}.gguf" for i in range(1, int(total) + 1))


def _split_set(name: str, present: set[str]) -> tuple[str, ...]:
    """All parts of the split model ``name`` belongs to, first first; raises if any is absent."""
    parts = _split_set_names(name)
    missing = [p for p in parts if p not in present]
    if missing:
        raise NoMatchingFile(
            f"has only part of the split model {parts[0]}: {len(missing)} of its {len(parts)} "
            f"parts are missing ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})"
        )
    return parts


def choose_gguf(files: Iterable[str], *, hf_file: str | None, quant: str) -> tuple[str, ...]:
    """Pick the GGUF file to load from a repo's file list (paths relative to the repo root).

    ``hf_file``, when given, must be in the list. Otherwise the candidates are the ``.gguf``
    files whose path carries ``quant`` as a whole word, case-insensitively (``Q4_K`` does not
    pick ``Q4_K_M``; ``F16`` does not pick ``BF16``), ``mmproj`` projector files excluded. A
    single file is preferred to a split model, the shortest name first (``X-Q4_K_M.gguf``
    before ``X-UD-Q4_K_M.gguf``). Returns the file, or all parts of a split model (first part
    first).

    Error handling: raises :class:`NoMatchingFile` saying what is absent.
    """
    present = set(files)
    if hf_file is not None:
        wanted = hf_file.strip("/")
        if wanted not in present:
            raise NoMatchingFile(f"has no file {wanted} ({_gguf_listing(present)})")
        return _split_set(wanted, present)
    word = re.compile(rf"(?<![a-z0-9_]){re.escape(quant)}(?![a-z0-9_])", re.IGNORECASE)
    candidates = sorted(
        (
            f
            for f in present
            if f.lower().endswith(".gguf") and "mmproj" not in f.lower() and word.search(f)
        ),
        key=lambda f: (len(f), f),
    )
    if not candidates:
        raise NoMatchingFile(f"has no GGUF file for quant {quant} ({_gguf_listing(present)})")
    singles = [f for f in candidates if _split_set_names(f) == (f,)]
    if singles:
        return (singles[0],)
    # Only split models: take the set whose first part sorts first, whole or not.
    firsts = {_split_set_names(f)[0] for f in candidates}
    return _split_set(min(firsts, key=lambda f: (len(f), f)), present)


def choose_mmproj(files: Iterable[str]) -> str | None:
    """The vision projector to load beside a repo's weights: of its ``mmproj*.gguf`` files,
    the most precise one that runs well on a CPU (F16, then BF16, then F32, then any other),
    the shortest name first; ``None`` when the repo has none."""

    def rank(name: str) -> tuple[int, int, str]:
        lowered = name.lower()
        order = 1 if "bf16" in lowered else 0 if "f16" in lowered else 2 if "f32" in lowered else 3
        return order, len(name), name

    found = [
        f
        for f in files
        if f.lower().endswith(".gguf") and f.lower().rsplit("/", 1)[-1].startswith("mmproj")
    ]
    return min(found, key=rank) if found else None


def unsplit_stem(stem: str) -> str:
    """A split model's part's stem without its part (``model-00001-of-00003`` is ``model``)."""
    match = _SPLIT.match(stem + ".gguf")
    return match["prefix"] if match else stem
