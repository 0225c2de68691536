"""The prompt cache's snapshot files, without a model: the format, the store's refusals
(a truncated, corrupt, foreign or other build's file is logged, removed and never restored),
and the disk budget under churn (a hypothesis state machine, as ``test_budget.py`` drives
the memory budget), on real files in a temporary folder."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    rule,
)

from llmtrio.engine.snapshots import SnapshotKey, SnapshotStore, Tokens, as_tokens

KEY = SnapshotKey.of("a" * 64, "llama-cpp-python 0.3.36", {"type_k": "f16", "type_v": "f16"})


def store(
    root: Path, key: SnapshotKey = KEY, *, budget: int = 1 << 20, cut: bool = True
) -> SnapshotStore:
    opened = SnapshotStore(root, key, budget, cut_anywhere=cut, min_restore=4)
    opened.scan()
    return opened


def payload(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def tokens(n: int, start: int = 0) -> Tokens:
    return as_tokens(range(start, start + n))


def only_file(folder: Path) -> Path:
    (path,) = folder.glob("*.snap")
    return path


def test_a_snapshot_is_written_once_and_read_back(tmp_path: Path) -> None:
    files = store(tmp_path)
    assert files.write(tokens(40), payload(1000)) > 1000
    assert files.write(tokens(40), payload(1000)) == 0  # already there
    assert files.write(tokens(30), payload(900)) == 0  # a prefix of it: served already
    found = files.best(as_tokens([*range(35), 99]), limit=35)
    assert found is not None and found.keep == 35
    loaded = files.read(found)
    assert loaded is not None
    assert loaded.tokens.tolist() == list(range(40))
    assert bytes(loaded.data) == payload(1000)
    # a new process sees it
    again = store(tmp_path)
    assert again.entries == 1 and again.best(tokens(41), limit=40) is not None


def test_on_attention_memory_a_longer_file_replaces_its_prefixes(tmp_path: Path) -> None:
    files = store(tmp_path)
    files.write(tokens(40), payload(100))
    files.write(tokens(60), payload(150))
    assert files.entries == 1 and len(list(tmp_path.rglob("*.snap"))) == 1
    # recurrent memory: each state is its own
    other = store(tmp_path / "r", cut=False)
    other.write(tokens(40), payload(100))
    other.write(tokens(60), payload(150))
    assert other.entries == 2
    found = other.best(as_tokens([*range(50), 7]), limit=50)
    assert found is not None and found.keep == 40


def _refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, spoil: str
) -> tuple[SnapshotStore, Path]:
    writer = store(tmp_path)
    writer.write(tokens(40), payload(1000))
    path = only_file(writer.folder)
    data = bytearray(path.read_bytes())
    if spoil == "truncated":
        path.write_bytes(data[:-1])
    elif spoil == "longer":
        path.write_bytes(bytes(data) + b"\0")
    elif spoil == "payload":
        data[-10] ^= 0xFF
        path.write_bytes(bytes(data))
    elif spoil == "header":
        data[30] ^= 0x01
        path.write_bytes(bytes(data))
    elif spoil == "tokens":
        data[len(data) - 1000 - 5] ^= 0x01
        path.write_bytes(bytes(data))
    elif spoil == "not a snapshot":
        path.write_bytes(b"GGUF" + bytes(100))
    elif spoil == "empty":
        path.write_bytes(b"")
    caplog.set_level(logging.WARNING, logger="llmtrio.engine")
    return writer, path


@pytest.mark.parametrize(
    "spoil", ["truncated", "longer", "payload", "header", "tokens", "not a snapshot", "empty"]
)
def test_a_spoiled_file_is_refused_when_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, spoil: str
) -> None:
    """Spoiled after the store indexed it: refused when read, logged and removed."""
    files, path = _refused(tmp_path, caplog, spoil)
    found = files.best(tokens(41), limit=40)
    assert found is not None
    assert files.read(found) is None
    assert not path.exists() and files.entries == 0 and files.stats.refused == 1
    assert "refused and removed" in caplog.text


@pytest.mark.parametrize(
    "spoil", ["truncated", "longer", "header", "tokens", "not a snapshot", "empty"]
)
def test_a_spoiled_file_is_refused_when_scanned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, spoil: str
) -> None:
    """Found spoiled by a scan (a restart): refused then (its payload's checksum is checked
    when it is read: that spoil is the test above's)."""
    _, path = _refused(tmp_path, caplog, spoil)
    files = store(tmp_path)
    assert files.entries == 0 and not path.exists() and files.stats.refused == 1
    assert "refused and removed" in caplog.text


@pytest.mark.parametrize(
    ("other", "why"),
    [
        (SnapshotKey.of("b" * 64, KEY.build, dict(KEY.settings)), "another model's snapshot"),
        (
            SnapshotKey.of(KEY.model, "llama-cpp-python 0.3.37", dict(KEY.settings)),
            "another llama.cpp build",
        ),
        (
            SnapshotKey.of(KEY.model, KEY.build, {"type_k": "q8_0", "type_v": "f16"}),
            "other context settings (type_k)",
        ),
    ],
    ids=["another model", "another build", "other settings"],
)
def test_a_foreign_file_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, other: SnapshotKey, why: str
) -> None:
    """Another model's file copied into this model's folder, another llama.cpp build's, one
    written with another KV cache type: refused by the scan, logged, removed, never read."""
    foreign = store(tmp_path / "elsewhere", other)
    foreign.write(tokens(40), payload(1000))
    ours = store(tmp_path)
    shutil.copy(only_file(foreign.folder), ours.folder)
    caplog.set_level(logging.WARNING, logger="llmtrio.engine")
    ours.scan()
    assert ours.entries == 0 and not list(ours.folder.glob("*.snap"))
    assert ours.best(tokens(41), limit=40) is None
    assert why in caplog.text


def test_a_file_larger_than_the_budget_is_not_written(tmp_path: Path) -> None:
    files = store(tmp_path, budget=500)
    assert files.write(tokens(10), payload(1000)) == 0
    assert files.entries == 0 and not list(files.folder.iterdir())


def test_a_second_process_sharing_the_folder_is_seen(tmp_path: Path) -> None:
    first, second = store(tmp_path), store(tmp_path)
    first.write(tokens(40), payload(100))
    assert second.best(tokens(41), limit=40) is None
    assert second.changed()
    second.scan()
    assert not second.changed()
    found = second.best(tokens(41), limit=40)
    assert found is not None and second.read(found) is not None


# -- the disk budget under churn -----------------------------------------------------------

BUDGET = 6000


class DiskBudget(RuleBasedStateMachine):
    """Two stores sharing one folder (two processes) write, read, lose and spoil files; the
    files on disk never exceed the budget once a store has written or scanned, what is read
    back is what was written, and the index names exactly the files there after a scan."""

    written = Bundle("written")

    @initialize()
    def open_folder(self) -> None:
        import tempfile

        self.root = Path(tempfile.mkdtemp())
        self.stores = [store(self.root, budget=BUDGET, cut=False) for _ in range(2)]
        self.contents: dict[str, tuple[list[int], bytes]] = {}

    def teardown(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def _files(self) -> dict[str, int]:
        return {p.name: p.stat().st_size for p in self.stores[0].folder.glob("*.snap")}

    @rule(
        target=written,
        which=st.integers(0, 1),
        n=st.integers(1, 30),
        start=st.integers(0, 3),
        size=st.integers(1, 2500),
        seed=st.integers(0, 3),
    )
    def write(self, which: int, n: int, start: int, size: int, seed: int) -> str:
        files = self.stores[which]
        ids = tokens(n, 100 * start)
        name = files.name_of(ids)
        data = payload(size, seed)
        if files.write(ids, data):
            self.contents[name] = (ids.tolist(), data)
        assert sum(self._files().values()) <= BUDGET + self._others_unseen(files)
        return name

    def _others_unseen(self, files: SnapshotStore) -> int:
        """Bytes of files the store has not scanned yet (written by the other)."""
        known = set(files.names())
        return sum(size for name, size in self._files().items() if name not in known)

    @rule(which=st.integers(0, 1), n=st.integers(1, 40), start=st.integers(0, 3))
    def read(self, which: int, n: int, start: int) -> None:
        files = self.stores[which]
        found = files.best(tokens(n, 100 * start), limit=n)
        if found is None:
            return
        loaded = files.read(found)
        if loaded is not None:
            ids, data = self.contents[found.entry.name]
            assert loaded.tokens.tolist() == ids and bytes(loaded.data) == data

    @rule(name=consumes(written), at=st.integers(0, 10_000))
    def spoil(self, name: str, at: int) -> None:
        path = self.stores[0].folder / name
        if path.exists():
            data = bytearray(path.read_bytes())
            data[at % len(data)] ^= 0x40
            path.write_bytes(bytes(data))

    @rule(name=consumes(written))
    def lose(self, name: str) -> None:
        (self.stores[0].folder / name).unlink(missing_ok=True)

    @rule(which=st.integers(0, 1))
    def scan(self, which: int) -> None:
        files = self.stores[which]
        files.scan()
        on_disk = self._files()
        assert set(files.names()) == set(on_disk)
        assert sum(on_disk.values()) <= BUDGET
        assert files.bytes_used == sum(on_disk.values())

    @invariant()
    def indexed_files_exist_or_are_refused_on_read(self) -> None:
        for files in self.stores:
            assert files.bytes_used <= BUDGET


DiskBudget.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_the_disk_budget_holds_under_churn = DiskBudget.TestCase


def test_a_file_longer_than_a_slot_is_passed_over_and_kept(tmp_path: Path) -> None:
    """Written by a process with longer slots: this one cannot restore it whole, so it looks
    past it, and keeps it for a process that can."""
    files = store(tmp_path)
    files.write(tokens(60), payload(100))
    assert files.best(tokens(61), limit=60, room=59) is None
    assert files.best(tokens(61), limit=60, room=60) is not None
    assert files.entries == 1
