"""The snapshot files of one model: its folder under the cache directory, read and written
(the I/O shell of ``_index.DiskIndex`` and ``_format``).

The folder is ``<cache dir>/<the model file's identity, 16 hex digits>``; a file is named
after a digest of its key and tokens (``<32 hex digits>.snap``), so the same prefix written
twice, by this process or another sharing the folder, is one file. A file is written whole
under a temporary name (``.<name>.<pid>.tmp``) and renamed into place, so a reader never sees
half of one; a crash leaves at worst a temporary file, removed by a later scan once it is an
hour old.

Anything found in the folder that is not a snapshot this model may restore (a truncated or
corrupt file, another model's, another llama.cpp build's, one written with other context
settings) is logged, removed and never restored, whether it is found by a scan or when read.

Thread safety: every method may be called from any thread (the frontend's, the writer's,
the decode thread's); the index is guarded by a lock, files are read and written outside it.
Other processes sharing the folder are seen by :meth:`scan`, which :meth:`changed` says is
due (the folder's modification time moved).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
import time
from pathlib import Path
from typing import BinaryIO, Final

import attrs
import xxhash

from ._format import (
    PREAMBLE_BYTES,
    Header,
    SnapshotFormatError,
    SnapshotKey,
    checksum,
    encode_header,
    header_size,
    parse_header,
    parse_tokens,
)
from ._index import DiskIndex, Found
from ._prefix import Tokens

__all__ = ["SUFFIX", "Loaded", "SnapshotStore", "StoreStats"]

logger = logging.getLogger("llmtrio.engine")

SUFFIX: Final = ".snap"
#: A temporary file older than this is a crashed writer's, and removed.
_STALE_TMP_S: Final = 3600.0

Buffer = ctypes.Array[ctypes.c_uint8]


@attrs.frozen(eq=False)
class Loaded:
    """A snapshot read from disk: the tokens its state follows, the state (as
    ``llama_state_seq_set_data`` takes it) and the seconds the read took."""

    tokens: Tokens
    data: Buffer
    seconds: float


@attrs.define
class StoreStats:
    """What the store did since it opened: files written (and their bytes), files removed
    to keep the budget, files refused (corrupt, truncated, foreign), reads and read bytes."""

    written: int = 0
    written_bytes: int = 0
    evicted: int = 0
    refused: int = 0
    reads: int = 0
    read_bytes: int = 0


class SnapshotStore:
    """The snapshot files of one model, under ``budget_bytes`` (see the module)."""

    def __init__(
        self,
        root: Path,
        key: SnapshotKey,
        budget_bytes: int,
        *,
        cut_anywhere: bool,
        min_restore: int = 32,
    ) -> None:
        self.key = key
        self.folder = Path(root) / key.model[:16]
        self.stats = StoreStats()
        self._index = DiskIndex(budget_bytes, cut_anywhere, min_restore)
        self._lock = threading.Lock()
        self._scanned_at: int | None = None  # the folder's mtime (ns) at the last scan

    # -- queries -------------------------------------------------------------------------

    @property
    def budget_bytes(self) -> int:
        return self._index.budget_bytes

    @property
    def cut_anywhere(self) -> bool:
        """The model's memory (see ``_prefix``)."""
        return self._index.cut_anywhere

    @property
    def bytes_used(self) -> int:
        with self._lock:
            return self._index.bytes_used

    @property
    def entries(self) -> int:
        with self._lock:
            return len(self._index)

    def names(self) -> list[str]:
        with self._lock:
            return self._index.names()

    def best(
        self, tokens: Tokens, limit: int, *, longer_than: int = 0, room: int | None = None
    ) -> Found | None:
        """The file serving most of ``tokens`` (see ``DiskIndex.best``); no I/O."""
        with self._lock:
            return self._index.best(tokens, limit, longer_than=longer_than, room=room)

    def covers(self, tokens: Tokens) -> bool:
        """Whether a file already serves every prefix a file of ``tokens`` would; no I/O."""
        with self._lock:
            return self._index.covers(tokens)

    def changed(self) -> bool:
        """Whether the folder changed since the last scan (one ``stat``): another process
        wrote or removed a file."""
        try:
            return self.folder.stat().st_mtime_ns != self._scanned_at
        except OSError:
            return False

    def name_of(self, tokens: Tokens) -> str:
        digest = xxhash.xxh3_128()
        digest.update(repr(self.key).encode())
        digest.update(tokens.astype("<i4").tobytes())
        return digest.hexdigest() + SUFFIX

    # -- I/O -----------------------------------------------------------------------------

    def scan(self) -> None:
        """Make the folder (when missing) and index its files: a file not indexed yet is
        read (its header and tokens) and kept, or refused; an indexed file that is gone is
        forgotten; files beyond the budget are removed, least recently used first.

        Error handling: ``OSError`` when the folder cannot be made or listed."""
        self.folder.mkdir(parents=True, exist_ok=True)
        mtime = self.folder.stat().st_mtime_ns
        found: dict[str, os.stat_result] = {}
        now = time.time()
        for path in self.folder.iterdir():
            with contextlib.suppress(OSError):
                info = path.stat()
                if path.name.startswith(".") and path.name.endswith(".tmp"):
                    if now - info.st_mtime > _STALE_TMP_S:
                        path.unlink()
                    continue
                found[path.name] = info
        with self._lock:
            for name, size in self._index.sizes().items():
                if name not in found or found[name].st_size != size:  # gone, or rewritten
                    self._index.remove(name)
            known = set(self._index.names())
        new = sorted((info.st_mtime, name) for name, info in found.items() if name not in known)
        for used, name in new:
            tokens = self._read_tokens(self.folder / name)
            if tokens is not None:
                self._keep(name, tokens, found[name].st_size, used)
        self._scanned_at = mtime

    def read(self, found: Found) -> Loaded | None:
        """Read the file ``found`` names whole, checked (its header, key, length and both
        checksums); ``None`` when it is gone or refused (a refused file is logged and
        removed, and never restored)."""
        name = found.entry.name
        path = self.folder / name
        started = time.perf_counter()
        try:
            with path.open("rb", buffering=0) as f:
                size = os.fstat(f.fileno()).st_size
                header, tokens = self._head(f, size)
                data = (ctypes.c_uint8 * header.payload_bytes)()
                if f.readinto(memoryview(data).cast("B")) != header.payload_bytes:
                    raise SnapshotFormatError("the file is truncated inside its state")
        except FileNotFoundError:
            with self._lock:
                self._index.remove(name)
            return None
        except (OSError, SnapshotFormatError) as exc:
            self._refuse(path, str(exc))
            return None
        if checksum(memoryview(data).cast("B")) != header.payload_check:
            self._refuse(path, "its state's checksum does not match (a corrupt file)")
            return None
        now = time.time()
        with contextlib.suppress(OSError):
            os.utime(path, (now, now))  # recently used, for every process sharing the folder
        with self._lock:
            self._index.touch(name, now)
            self.stats.reads += 1
            self.stats.read_bytes += size
        return Loaded(tokens, data, time.perf_counter() - started)

    def write(self, tokens: Tokens, data: Buffer | bytes) -> int:
        """Write a snapshot of the state ``data`` after ``tokens``, unless a file already
        serves every prefix it would or it cannot fit the budget; then remove the least
        recently used files beyond the budget. Returns the bytes written (0: none).

        Error handling: an ``OSError`` is logged and nothing is kept (0)."""
        payload = memoryview(data).cast("B")
        if self.covers(tokens):
            return 0
        head = encode_header(self.key, tokens, payload)
        nbytes = len(head) + len(payload)
        with self._lock:
            if not self._index.fits(nbytes):
                return 0
        name = self.name_of(tokens)
        path = self.folder / name
        tmp = self.folder / f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with tmp.open("wb") as f:
                f.write(head)
                f.write(payload)
            os.replace(tmp, path)
        except OSError as exc:
            logger.warning("prompt cache: cannot write %s: %s", path, exc)
            with contextlib.suppress(OSError):
                tmp.unlink()
            return 0
        self._keep(name, tokens, nbytes, time.time())
        with self._lock:
            self.stats.written += 1
            self.stats.written_bytes += nbytes
        return nbytes

    # -- internals -----------------------------------------------------------------------

    def _head(self, f: BinaryIO, size: int) -> tuple[Header, Tokens]:
        """Read a file's header and tokens from ``f`` (at its start), checked against this
        store's key.

        Error handling: :class:`SnapshotFormatError` saying why it may not be restored."""
        head = f.read(PREAMBLE_BYTES)
        head += f.read(header_size(head) - len(head))
        header = parse_header(head, size)
        why = self.key.mismatch(header.key)
        if why is not None:
            raise SnapshotFormatError(why)
        return header, parse_tokens(header, f.read(4 * header.n_tokens))

    def _read_tokens(self, path: Path) -> Tokens | None:
        """The tokens of the file at ``path``, its header checked; ``None`` when it is gone
        or refused (logged and removed)."""
        try:
            with path.open("rb", buffering=0) as f:
                _, tokens = self._head(f, os.fstat(f.fileno()).st_size)
            return tokens
        except FileNotFoundError:
            return None
        except (OSError, SnapshotFormatError) as exc:
            self._refuse(path, str(exc))
            return None

    def _keep(self, name: str, tokens: Tokens, nbytes: int, used: float) -> None:
        with self._lock:
            gone = self._index.add(name, tokens, nbytes, used)
            self.stats.evicted += len([old for old in gone if old != name])
        for old in gone:
            with contextlib.suppress(OSError):
                (self.folder / old).unlink()

    def _refuse(self, path: Path, why: str) -> None:
        logger.warning("prompt cache: %s refused and removed: %s", path, why)
        with self._lock:
            self._index.remove(path.name)
            self.stats.refused += 1
        with contextlib.suppress(OSError):
            path.unlink()
