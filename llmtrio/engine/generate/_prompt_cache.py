"""The prompt-reuse policy: which prompt prefix lives where, what a new sequence reuses, what
is snapshotted and what is evicted. Pure: fed with token ids and byte counts, no llama.cpp.

Two places hold a prefix's memory:

- a *slot* (a llama.cpp sequence id): the cells of the tokens it last held stay there after
  its generation ends ("resident"), until the slot is given to a prompt they do not prefix;
- a *snapshot* in host memory (``llama_state_seq_get_data``): the whole state of a sequence
  after a given prefix, restorable into any slot, kept under a byte budget, least recently
  used evicted first.

What can be reused depends on the memory (``cut_anywhere``):

- attention only (the sliding-window cache made full-size): cells can be cut at any
  position (``llama_memory_seq_rm``), so any common prefix of a resident sequence or a
  snapshot is reused, and a prompt that shares only a part keeps only that part;
- recurrent or hybrid memory: the recurrent state exists only at the end of what was
  ingested, and cannot be cut back. A prefix is reusable only where a state was taken at
  exactly its end: a resident sequence the prompt extends whole, or a snapshot. Snapshots are
  therefore taken *while ingesting*, at the ``hints`` the engine passes (message boundaries of
  a chat prompt: where the last message's text starts, so a shared system prompt is taken,
  and where it ends, so the next turn of the conversation finds it).

Every reuse leaves at least one prompt token to ingest: its logits give the first token.
A slot's resident tokens that a new prompt cuts or drops are first saved as a snapshot
(unless one already covers them), so that other prompts sharing them can still restore them.

The decode thread carries the decisions out (:class:`Assignment`) and reports back what
happened (:meth:`PromptCache.stored`, :meth:`PromptCache.released`).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from ..snapshots import Tokens, as_tokens, common_prefix, covers, reusable, worth

__all__ = ["OFFERED", "Assignment", "PromptCache", "common_prefix"]

#: The entry id of a snapshot offered with the prompt (read from disk by the frontend).
OFFERED = -1

_EMPTY: Tokens = np.zeros(0, dtype=np.int32)


@attrs.frozen(eq=False)
class Assignment:
    """How a new sequence starts, in the order the decode thread carries it out:

    1. ``save``: snapshot ``seq``'s memory first, which holds these tokens (the prompt cuts
       or drops them); report it with :meth:`PromptCache.stored`.
    2. ``restore``: restore that snapshot (an entry id, or :data:`OFFERED`: the one offered
       with the prompt) into ``seq``.
    3. cut ``seq``'s memory back to its first ``keep`` tokens (all of it when 0).
    4. ingest the prompt from ``keep`` on, taking a snapshot (and reporting it) after each
       position in ``snapshot_at`` (prompt lengths, in ascending order).
    """

    seq: int
    keep: int
    restore: int | None = None
    save: Tokens | None = None
    snapshot_at: tuple[int, ...] = ()


@attrs.define(eq=False)
class _Entry:
    id: int
    tokens: Tokens
    nbytes: int
    used: int


@attrs.define(eq=False)
class _Slot:
    tokens: Tokens = _EMPTY
    busy: bool = False
    used: int = 0


@attrs.define
class PromptCache:
    """The policy over ``slots`` sequence ids and ``budget_bytes`` of host snapshots.

    ``budget_bytes == 0`` keeps no snapshots (slots still reuse what they hold) unless
    ``spills``: snapshots then go on to disk when host memory cannot keep them, so they are
    still taken (where a prompt cuts a slot's memory, and at the hints);
    ``enabled=False`` reuses nothing (every prompt is ingested from scratch, each slot's
    memory cleared).

    ``min_restore`` is the fewest tokens worth restoring a snapshot for (a copy of the whole
    state), and ``min_snapshot`` the fewest worth keeping one of; a prefix that holds an image
    (its placeholder ids are negative) is worth both whatever its length: its tokens are few,
    but each image costs an encode and a decode of its own.
    """

    slots: int
    cut_anywhere: bool
    budget_bytes: int
    enabled: bool = True
    min_restore: int = 32
    min_snapshot: int = 64
    spills: bool = False
    _slots: list[_Slot] = attrs.field(init=False)
    _entries: dict[int, _Entry] = attrs.field(init=False, factory=dict)
    _clock: int = attrs.field(init=False, default=0)
    _next_id: int = attrs.field(init=False, default=0)
    #: The snapshot the last assignment restores: never evicted to make room for its save.
    _pinned: int | None = attrs.field(init=False, default=None)
    #: Counters: sequences that reused anything, tokens reused, snapshots taken and evicted.
    hits: int = attrs.field(init=False, default=0)
    reused_tokens: int = attrs.field(init=False, default=0)
    snapshots: int = attrs.field(init=False, default=0)
    evictions: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        self._slots = [_Slot() for _ in range(self.slots)]

    # -- what the engine asks --------------------------------------------------------------

    @property
    def bytes_used(self) -> int:
        return sum(e.nbytes for e in self._entries.values())

    @property
    def entries(self) -> int:
        return len(self._entries)

    def held(self) -> tuple[Tokens, ...]:
        """The tokens every slot's memory and every snapshot holds (immutable arrays)."""
        return (*(slot.tokens for slot in self._slots), *(e.tokens for e in self._entries.values()))

    def resident(self, seq: int) -> Tokens:
        return self._slots[seq].tokens

    def free_slots(self) -> list[int]:
        return [seq for seq, slot in enumerate(self._slots) if not slot.busy]

    def idle_cells(self) -> int:
        """Cells the idle slots' memory holds (what a shared pool can take back)."""
        return sum(len(slot.tokens) for slot in self._slots if not slot.busy)

    def evictable(self) -> list[int]:
        """Idle slots holding memory, least recently used first."""
        idle = [s for s, slot in enumerate(self._slots) if not slot.busy and len(slot.tokens)]
        return sorted(idle, key=lambda s: self._slots[s].used)

    def evict(self, seq: int) -> Tokens | None:
        """Idle ``seq`` gives its memory up (a shared pool needs the cells): the tokens to
        snapshot first, when worth it (report it with :meth:`stored`); the slot then holds
        nothing."""
        slot = self._slots[seq]
        held, slot.tokens = slot.tokens, _EMPTY
        return held if self._worth_saving(held) else None

    def assign(
        self,
        prompt: Sequence[int] | Tokens,
        *,
        hints: Sequence[int] = (),
        reuse: bool = True,
        offered: Tokens | None = None,
    ) -> Assignment:
        """Pick a free slot for ``prompt`` and say what of it is reused (nothing when not
        ``reuse``: the request asked to be ingested whole); the slot is then busy until
        :meth:`released`. ``offered`` are the tokens of a snapshot that comes with the prompt
        (read from disk): restored (:data:`OFFERED`) where it serves more than memory does.

        Error handling: ``LookupError`` when no slot is free (the scheduler admits no more
        sequences than there are slots).
        """
        tokens = as_tokens(prompt)
        free = self.free_slots()
        if not free:
            raise LookupError("no free slot")
        self._clock += 1
        self._pinned = None
        if not self.enabled:
            seq = free[0]
            self._occupy(seq, _EMPTY)
            return Assignment(seq, 0)
        # At least one token is ingested, for its logits; none reused when not ``reuse``.
        limit = len(tokens) - 1 if reuse else 0
        seq, keep, restore = self._best(tokens, limit, free, offered)
        slot = self._slots[seq]
        save = None
        if (restore is not None or keep < len(slot.tokens)) and self._worth_saving(slot.tokens):
            save = slot.tokens
        if restore is not None and restore != OFFERED:
            self._entries[restore].used = self._clock
            self._pinned = restore
        if keep:
            self.hits += 1
            self.reused_tokens += keep
        self._occupy(seq, tokens[:keep])
        return Assignment(seq, keep, restore, save, self._snapshot_points(tokens, keep, hints))

    def stored(self, tokens: Sequence[int] | Tokens, nbytes: int) -> tuple[int | None, list[int]]:
        """Record a snapshot of the state after ``tokens``, ``nbytes`` long.

        Returns its entry id (``None`` when it is not kept: larger than the whole budget, or
        the same tokens are already kept) and the entry ids to evict now (least recently used
        first), after which the snapshots in use fit the budget again.
        """
        tokens = as_tokens(tokens).copy()
        self._clock += 1
        if nbytes > self.budget_bytes or self._covered(tokens):
            return None, []
        entry = _Entry(self._next_id, tokens, nbytes, self._clock)
        self._next_id += 1
        self._entries[entry.id] = entry
        self.snapshots += 1
        evicted: list[int] = []
        used = self.bytes_used
        for old in sorted(self._entries.values(), key=lambda e: e.used):
            if used <= self.budget_bytes:
                break
            if old.id in (entry.id, self._pinned):
                continue
            del self._entries[old.id]
            used -= old.nbytes
            evicted.append(old.id)
        self.evictions += len(evicted)
        if used > self.budget_bytes:  # only with the pinned one: the new one goes
            del self._entries[entry.id]
            self.snapshots -= 1
            return None, evicted
        return entry.id, evicted

    def restore_failed(self, seq: int) -> None:
        """The restore an assignment asked for did not happen: ``seq`` holds nothing."""
        self._slots[seq].tokens = _EMPTY

    def released(self, seq: int, tokens: Sequence[int] | Tokens) -> None:
        """``seq``'s sequence ended; its memory now holds exactly ``tokens`` (empty when it
        was cleared)."""
        slot = self._slots[seq]
        slot.busy = False
        slot.tokens = as_tokens(tokens).copy() if self.enabled else _EMPTY
        self._clock += 1
        slot.used = self._clock

    # -- the policy --------------------------------------------------------------------

    def _best(
        self, tokens: Tokens, limit: int, free: list[int], offered: Tokens | None
    ) -> tuple[int, int, int | None]:
        """The slot, the tokens reused and the snapshot to restore (if any)."""
        best_seq, best_keep = -1, 0
        for seq in free:
            keep = self._reusable(self._slots[seq].tokens, tokens, limit)
            if keep > best_keep:
                best_seq, best_keep = seq, keep
        best_entry: int | None = None
        for entry in self._entries.values():
            keep = self._reusable(entry.tokens, tokens, limit)
            if keep > best_keep and worth(tokens, keep, self.min_restore):
                best_entry, best_keep = entry.id, keep
        if offered is not None:
            keep = self._reusable(offered, tokens, limit)
            if keep > best_keep and worth(tokens, keep, self.min_restore):
                best_entry, best_keep = OFFERED, keep
        if best_entry is None and best_seq >= 0:
            return best_seq, best_keep, None
        # A snapshot to restore, or nothing to reuse: take the free slot whose memory is
        # worth least (empty first, then the least recently used), lowest id on a tie.
        seq = min(free, key=lambda s: (len(self._slots[s].tokens) > 0, self._slots[s].used, s))
        return seq, (best_keep if best_entry is not None else 0), best_entry

    def _reusable(self, held: Tokens, tokens: Tokens, limit: int) -> int:
        """How many tokens of ``tokens`` memory holding ``held`` serves."""
        return reusable(held, tokens, limit, cut_anywhere=self.cut_anywhere)

    def _snapshot_points(self, tokens: Tokens, keep: int, hints: Sequence[int]) -> tuple[int, ...]:
        if self.cut_anywhere or not self._keeps:
            return ()  # the slot's cells serve any prefix; they are saved when cut
        points = sorted(
            {h for h in hints if keep < h < len(tokens) and worth(tokens, h, self.min_snapshot)}
        )
        return tuple(p for p in points if not self._covered(tokens[:p]))

    def worth_keeping(self, tokens: Tokens) -> bool:
        """Whether a snapshot after ``tokens`` is worth keeping and none in host memory
        serves it already."""
        return self._worth_saving(tokens)

    def _worth_saving(self, held: Tokens) -> bool:
        return self._keeps and worth(held, len(held), self.min_snapshot) and not self._covered(held)

    @property
    def _keeps(self) -> bool:
        """Whether snapshots are kept anywhere (host memory, or on disk)."""
        return self.budget_bytes > 0 or self.spills

    def covered(self, tokens: Sequence[int] | Tokens) -> bool:
        """Whether a snapshot in host memory already serves every prefix ``tokens`` could."""
        return self._covered(as_tokens(tokens))

    def _covered(self, tokens: Tokens) -> bool:
        """Whether a snapshot already serves every prefix ``tokens`` could serve."""
        return any(
            covers(entry.tokens, tokens, cut_anywhere=self.cut_anywhere)
            for entry in self._entries.values()
        )

    def _occupy(self, seq: int, tokens: Tokens) -> None:
        slot = self._slots[seq]
        slot.busy = True
        slot.tokens = tokens
