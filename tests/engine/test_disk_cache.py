"""The prompt cache on disk (``EngineConfig.cache_dir``), on both test models: gemma-3
(attention, a full-size window cache) and the hybrid qwen35 (recurrent state, restored only
whole, snapshotted at message boundaries).

- A prefix restored from a file continues with exactly the logits the slot that wrote it
  got continuing at once (llama.cpp's state bytes, written and read back unchanged).
- Closing the engine (a model unloaded, a server drained) writes what memory holds that is
  worth keeping and no file serves yet, and nothing else; a prefix restored and not grown is
  not written again.
- A snapshot host memory does not keep (``cache_ram_mib`` 0) goes to disk and comes back on a
  miss in memory, in the same process.
- An image's prefix comes back from disk without the image being encoded again.
- Another model's file in the folder is refused, logged and removed.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt
import pytest

from llmtrio.engine import (
    MEDIA_MARKER,
    ChatMessage,
    Engine,
    EngineConfig,
    EngineStats,
    GenerateRequest,
    Image,
    StopReason,
)
from llmtrio.engine.generate._core import EngineCore
from llmtrio.engine.generate._disk_tier import DiskTier, snapshot_key
from llmtrio.engine.generate._drafting import cut_anywhere
from llmtrio.engine.generate._engine import context_params
from llmtrio.engine.generate._step import CoreRequest, Offered, StepOutput
from llmtrio.engine.llama import LlamaModel
from llmtrio.engine.snapshots import SnapshotKey, SnapshotStore

from .._helpers import collect, engine_config, eventually
from .._projector import GEMMA3_IMAGE_TOKENS, write_gemma3_projector

TEXT = " ".join(f"Paragraph {i} tells of a river, a hill and a town." for i in range(24))
SYSTEM = " ".join(
    f"Rule {i}: answer in one short sentence, politely, about topic number {i}." for i in range(14)
)


@pytest.fixture(params=["gemma", "qwen35"])
def model_path(request: pytest.FixtureRequest) -> Path:
    path: Path = request.getfixturevalue(f"{request.param}_path")
    return path


def config(path: Path, cache_dir: Path, **changes: Any) -> EngineConfig:
    """One slot of 1024 tokens on one thread, without drafts (they change batch shapes);
    greedy requests (``GenerateRequest``'s default sampling)."""
    base: dict[str, Any] = {"max_inflight": 1, "ctx_size": 1024, "threads": 1, "spec": None}
    return engine_config(path, cache_dir=cache_dir, **(base | changes))


def greedy(tokens: list[int], max_tokens: int, **kwargs: Any) -> GenerateRequest:
    return GenerateRequest(tokens=tokens, max_tokens=max_tokens, ignore_eos=True, **kwargs)


def files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.snap"))


def test_a_prefix_restored_from_disk_continues_bit_for_bit(
    model_path: Path, tmp_path: Path
) -> None:
    """Driven on the core (no Trio), with token ids, as ``test_prompt_reuse``'s bit-exact
    test: A generates ``m + 1`` tokens after P. B repeats P ingested whole (A's batches: A's
    bits) and stops after ``m``: its slot holds P and B's first ``m - 1`` tokens, written to
    disk as the core closes. A new model and core restore the file for C, which asks for P
    and A's first ``m`` tokens, and ingest A's ``m``-th token alone, as A's last decode step
    did: C's first token and logprobs are A's last, bit for bit."""
    m = 4
    cfg = config(model_path, tmp_path, threads=2)
    n_batch, _ = context_params(cfg)

    def open_core() -> tuple[LlamaModel, EngineCore, SnapshotStore]:
        model = LlamaModel(model_path, slots=1, ctx_size=1024, threads=2, n_batch=n_batch)
        store = SnapshotStore(
            tmp_path, snapshot_key(cfg, model, model_path), 2**30, cut_anywhere=cut_anywhere(model)
        )
        store.scan()
        return model, EngineCore(model, cfg, EngineStats(), disk=WriteNow(store)), store  # type: ignore[arg-type]

    model, core, store = open_core()
    try:
        prompt = model.tokenize(TEXT[:600], add_special=True)
        a = run_core(core, prompt, m + 1, reuse=False)
        b = run_core(core, prompt, m, reuse=False)
        assert (b.tokens, b.logprobs) == (a.tokens[:m], a.logprobs[:m])
        core.flush()
    finally:
        model.close()
    continued = np.asarray([*prompt, *a.tokens[:m]], dtype=np.int32)
    model, core, store = open_core()
    try:
        found = store.best(continued, len(continued) - 1)
        assert found is not None and found.keep == len(prompt) + m - 1
        loaded = store.read(found)
        assert loaded is not None
        offered = Offered(loaded.tokens, loaded.data, loaded.seconds)
        c = run_core(core, continued.tolist(), 1, offered=offered)
    finally:
        model.close()
    assert c.cached == len(prompt) + m - 1
    assert c.tokens == a.tokens[m:]
    assert c.logprobs == a.logprobs[m:]


@attrs.frozen
class WriteNow:
    """The disk tier's decode-thread side, writing at once (no writer task without Trio)."""

    store: SnapshotStore

    def covers(self, tokens: npt.NDArray[np.int32]) -> bool:
        return self.store.covers(tokens)

    def spill(self, tokens: npt.NDArray[np.int32], data: Any, *, closing: bool = False) -> None:
        self.store.write(tokens, data)


_keys = iter(range(1000))


def run_core(
    core: EngineCore,
    tokens: list[int],
    max_tokens: int,
    *,
    reuse: bool = True,
    offered: Offered | None = None,
) -> StepOutput:
    """One request to its end: every token it generated, with logprobs, in one output whose
    ``cached`` says how much of its prompt was reused."""
    request = GenerateRequest(
        tokens=tokens, max_tokens=max_tokens, ignore_eos=True, logprobs=5, cache_prompt=reuse
    )
    key = next(_keys)
    prompt = np.asarray(tokens, np.int32)
    core.add(CoreRequest(key, prompt, request, max_tokens, offered=offered))
    outputs: list[StepOutput] = []
    while not (outputs and outputs[-1].released):
        outputs += [o for o in core.step() if o.key == key]
    assert outputs[-1].error is None and outputs[-1].stop is StopReason.MAX_TOKENS
    return StepOutput(
        key,
        [t for o in outputs for t in o.tokens],
        logprobs=[lp for o in outputs for lp in o.logprobs or []],
        cached=outputs[-1].cached,
    )


async def test_closing_writes_what_memory_holds_and_no_more(
    model_path: Path, tmp_path: Path
) -> None:
    """Two slots: one holds a long prompt (worth keeping), the other a short one (not):
    closing writes the long one only. Opening again and closing with nothing done writes
    nothing; a slot that ends holding what the file holds writes nothing either; growing it
    writes the longer prefix (on gemma the longer file replaces the shorter)."""
    cfg = config(model_path, tmp_path, max_inflight=2)
    async with Engine.open(cfg) as engine:
        long_prompt = engine.tokenize(TEXT)[:200]
        more = engine.tokenize(SYSTEM)[:100]
        await collect(engine, greedy(long_prompt, 1))
        await collect(engine, greedy(more[:20], 4))  # 20 tokens: not kept
    written = files(tmp_path)
    assert len(written) == 1
    stamp = written[0].stat().st_mtime_ns
    async with Engine.open(cfg) as engine:
        pass
    assert files(tmp_path) == written and written[0].stat().st_mtime_ns == stamp
    async with Engine.open(cfg) as engine:
        # the same request again, one token generated (never in memory): the slot ends
        # holding what the file holds. On gemma its prefix is restored from the file; a
        # recurrent state cannot be cut back to give the last prompt token its logits, so
        # on qwen35 the prompt is computed again, to the same tokens
        await collect(engine, greedy(long_prompt, 1))
        assert engine.stats.disk_hits == (1 if "gemma" in model_path.name else 0)
    assert files(tmp_path) == written
    async with Engine.open(cfg) as engine:
        await collect(engine, greedy([*long_prompt, *more], 4))
        assert engine.stats.disk_hits == 1
        writes = engine.stats.disk_writes
    assert writes == 0  # counted while open: nothing written before the close
    after = files(tmp_path)
    if "gemma" in model_path.name:
        assert len(after) == 1 and after != written  # the longer replaced the shorter
    else:
        assert len(after) == 2  # a recurrent state after each


async def test_a_snapshot_memory_does_not_keep_comes_back_from_disk(
    model_path: Path, tmp_path: Path
) -> None:
    """With no host memory for snapshots, a slot's memory that another prompt cuts goes to
    disk, and the prompt that needs it again restores it from there, in the same engine."""
    cfg = config(model_path, tmp_path, cache_ram_mib=0)
    async with Engine.open(cfg) as engine:
        first = engine.tokenize(TEXT)[:200]
        await collect(engine, greedy(first, 1))  # the slot holds ``first``: no answer token
        await collect(engine, greedy(engine.tokenize(SYSTEM)[:200], 2))  # takes the one slot
        await _written(engine, 1)
        _, done = await collect(engine, greedy([*first, 7], 2))
        assert done.cached_tokens >= len(first)
        assert engine.stats.disk_hits == 1


async def _written(engine: Engine, count: int) -> None:
    await eventually(lambda: engine.stats.disk_writes >= count)


async def test_an_image_prefix_is_restored_from_disk_without_encoding_it(
    gemma_path: Path, tmp_path: Path
) -> None:
    projector = write_gemma3_projector(tmp_path / "mmproj.gguf")
    cfg = config(gemma_path, tmp_path / "cache", mmproj=projector)
    rng = __import__("numpy").random.default_rng(5)
    pixels = rng.integers(0, 256, (40, 48, 3), dtype="uint8").tobytes()
    image = Image.of_rgb(48, 40, pixels)
    first = GenerateRequest(
        messages=[ChatMessage("user", MEDIA_MARKER + "Describe it.", media=(image,))],
        max_tokens=4,
        ignore_eos=True,
    )
    async with Engine.open(cfg) as engine:
        answer, done = await collect(engine, first)
        assert engine.stats.image_encodes == 1
    follow = GenerateRequest(
        messages=[
            *first.messages,  # type: ignore[misc]
            ChatMessage("assistant", answer),
            ChatMessage("user", "And the colours?"),
        ],
        max_tokens=4,
        ignore_eos=True,
    )
    async with Engine.open(cfg) as engine:
        _, again = await collect(engine, follow)
        assert again.cached_tokens > GEMMA3_IMAGE_TOKENS
        assert again.cached_tokens >= done.prompt_tokens - 2
        assert engine.stats.disk_hits == 1
        assert engine.stats.image_encodes == 0


async def test_another_models_file_is_refused(
    gemma_path: Path, qwen35_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """gemma's file copied into qwen35's folder (a rename, a wrong copy): the qwen35 engine
    refuses it as it opens (logged, removed), and computes the prompt."""
    async with Engine.open(config(gemma_path, tmp_path)) as engine:
        prompt = engine.tokenize(TEXT)[:200]
        await collect(engine, greedy(prompt, 2))
    (gemma_file,) = files(tmp_path)
    async with Engine.open(config(qwen35_path, tmp_path)) as engine:
        folder = engine._disk.store.folder if engine._disk else None
    assert folder is not None and folder != gemma_file.parent
    shutil.copy(gemma_file, folder)
    caplog.set_level(logging.WARNING, logger="llmtrio.engine")
    async with Engine.open(config(qwen35_path, tmp_path)) as engine:
        _, done = await collect(engine, greedy(engine.tokenize(TEXT)[:201], 2))
        assert done.cached_tokens == 0 and engine.stats.disk_refused == 1
    assert "another model's snapshot" in caplog.text
    assert not (folder / gemma_file.name).exists() and gemma_file.exists()


async def test_a_writer_behind_drops_what_memory_evicts_not_what_closing_hands_over(
    tmp_path: Path,
) -> None:
    """While the writer is more than ``max_pending`` bytes behind, a snapshot memory evicts
    is dropped (counted), never queued without bound; what the engine hands over as it closes
    is written whatever the backlog."""
    key = SnapshotKey.of("c" * 64, "build", {})
    store = SnapshotStore(tmp_path, key, 2**20, cut_anywhere=False)
    store.scan()
    stats = EngineStats()
    tier = DiskTier(store, stats, lambda deliver, value: deliver(value), max_pending=1000)
    ids = [np.arange(start, start + 100, dtype=np.int32) for start in (0, 200, 400)]
    tier.spill(ids[0], bytes(800))  # queued: the writer has not run yet
    tier.spill(ids[1], bytes(800))  # 1600 bytes behind: dropped
    tier.spill(ids[2], bytes(800), closing=True)  # written anyway
    tier.close()
    await tier.write_until_closed()
    assert (stats.disk_dropped, stats.disk_writes, stats.disk_entries) == (1, 2, 2)
    assert store.covers(ids[0]) and not store.covers(ids[1]) and store.covers(ids[2])
