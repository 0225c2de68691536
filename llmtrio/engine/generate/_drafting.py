"""Speculative decoding's part of a decode step: which decoding sequences carry drafts and
how many (the draft budget), carried out for the core (``_core.py``) from the pure policy in the
``spec`` package: each sequence's drafter proposes, :func:`plan_drafts` prices the plans with
the step costs measured so far (:class:`StepCosts`) and the micro-batches llama.cpp would
split the batch into (:func:`micro_batch_sizes`), and the plan with the most tokens per ms of
decoding is kept. No llama.cpp calls: the model is read for its memory's layout only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from .._config import EngineConfig
from ..llama import LlamaModel
from ..spec_decode import Acceptance, Candidate, DraftGate, StepCosts, micro_batch_sizes, repacked
from ._jobs import Job, Part
from ._step import CoreRequest

__all__ = ["SHADOW", "DraftBudget", "cut_anywhere", "judge_shadow", "spec_draft_limit"]

#: A draft the budget did not verify is kept while it is this long (its first tokens), and
#: checked against what the sequence emits next: all of it right puts the sequence on a run
#: (a copy back on track after a change; without it, a sequence whose drafts had failed
#: waited for its rates to drift back before it drafted again).
SHADOW = 4


class DraftBudget:
    """The draft budget of one core: its measured step costs and its plan.

    ``draft_max`` is the most draft tokens one sequence may carry (0: speculation is off,
    or the memory cannot take drafts back); ``capacity`` the batch's tokens. ``gate``
    decides whether a step gets the drafts ``plan`` chose, from what steps with and without
    drafts realized (:class:`DraftGate`; None: every plan is carried out as chosen, as tests
    that force drafts want).
    """

    def __init__(
        self,
        model: LlamaModel,
        config: EngineConfig,
        capacity: int,
        plan: Callable[..., list[int]],
        gate: DraftGate | None = None,
    ) -> None:
        #: Draft tokens one sequence may carry: the configured most, and for recurrent
        #: memory what it can roll back.
        self.draft_max = spec_draft_limit(model, config)
        #: A remainder past whole blocks is priced as a one-token step until measured, on
        #: weights the CPU kernels repack (StepCosts.remainder_prior).
        prior = 1.0 if repacked(model.meta("general.file_type")) else 0.0
        self.costs = StepCosts(remainder_prior=prior)
        #: What every sequence's drafts earned, bucket by bucket: a new sequence's
        #: acceptance starts from it (its ``shared``); it follows the last few hundred
        #: verified tokens of them all, and drifts back to the prior slowly. Requests held
        #: to a grammar from their first token (a JSON schema: structure the model writes,
        #: its drafts mostly wrong) share their own (``constrained``), so a batch of them
        #: does not stop free text's drafts.
        self.acceptance = Acceptance(memory=0.99, relax=0.01)
        self.constrained = Acceptance(memory=0.99, relax=0.01)
        self._plan = plan
        self.gate = gate
        #: Whether the last step was open to drafts (the gate did not hold it).
        self.opened = False
        self._capacity = capacity
        self._split = not model.kv_unified
        self._request_ctx = config.request_ctx
        self._target_ms = config.target_step_ms

    def shared(self, request: CoreRequest) -> Acceptance:
        """The rates a request's sequence starts from and feeds: its kind's."""
        grammar = request.grammar
        return (
            self.constrained if grammar is not None and grammar.trigger is None else self.acceptance
        )

    def micro_batches(self, tokens: Sequence[tuple[int, int]]) -> list[int]:
        """The tokens of each micro-batch llama.cpp runs a batch of ``(seq, tokens)`` in
        (per-slot memory splits one with unequal tokens per sequence; one pool does not)."""
        return micro_batch_sizes(tokens, split=self._split, n_ubatch=self._capacity)

    def draft(self, parts: list[Part], prefill: list[Part], now: float | None = None) -> None:
        """Give each decoding part the draft tokens the budget allows the step begun at
        ``now`` (``time.perf_counter()`` seconds; by default, now): none where the gate holds
        the step (it then runs as without speculation: nothing proposed or priced, the
        sequences' acceptance untouched)."""
        gate = self.gate
        self.opened = (
            gate is None
            or not parts
            or gate.open(len(parts), time.perf_counter() if now is None else now)
        )
        if not self.opened:
            return
        prefill_tokens = sum(part.count for part in prefill)
        offers: list[tuple[Part, list[int], int]] = []
        room = self._capacity - len(parts) - prefill_tokens
        for part in parts:
            job = part.job
            limit = min(
                self.draft_max,
                job.request.max_tokens - job.generated - 1,
                self._request_ctx - job.pos - 2,
                max(0, room),
            )
            if job.drafter is None or limit <= 0:
                continue
            draft, match = job.drafter.propose(limit)
            if draft and job.sampler is not None and not job.drafts_fit:
                # Held to a grammar: not past the first token it refuses (a string's
                # newline, its length limit, a key other than the one the schema wants).
                draft = draft[: job.sampler.allowed(draft)]
            if draft and job.think is not None:
                # Not past the reasoning budget: the marker it forces is the last token.
                draft = job.think.cut(draft)
            if draft:
                offers.append((part, draft, match))
        # The batch's sequences in id order and their tokens without drafts; which offer
        # each one's drafts come from (the micro-batches a plan runs in depend on both).
        offered = {id(part): i for i, (part, _, _) in enumerate(offers)}
        layout = sorted(
            [(part.job.seq, 1, offered.get(id(part), -1)) for part in parts]
            + [(part.job.seq, part.count, -1) for part in prefill]
        )

        # Per slot, with no prompt chunk in the step, each run of consecutive ids is one
        # micro-batch without drafts, and stays one only if its sequences carry equal
        # tokens (else llama.cpp splits it): the plans that do not are known to add
        # micro-batches without counting them (most of the hundred plans priced a step).
        runs = _runs([seq for seq, _, _ in layout]) if self._split and not prefill else []

        def batches(counts: Sequence[int]) -> list[int] | None:
            for run in runs:
                first = layout[run[0]][2]
                want = counts[first] if first >= 0 else 0
                for j in run[1:]:
                    i = layout[j][2]
                    if (counts[i] if i >= 0 else 0) != want:
                        return None
            return self.micro_batches(
                [(seq, n + (counts[i] if i >= 0 else 0)) for seq, n, i in layout]
            )

        counts = self._plan(
            [
                Candidate(len(d), part.job.acceptance.rate(m), part.job.sample_ms)
                for part, d, m in offers
            ],
            self.costs,
            outputs=len(parts),
            prefill=prefill_tokens,
            target_ms=self._target_ms,
            batches=batches,
            sampling_ms=sum(part.job.sample_ms for part in parts),
        )
        total = 0
        for (part, draft, match), count in zip(offers, counts, strict=True):
            count = min(count, room - total)
            job = part.job
            if count > 0:
                part.draft, part.match = draft[:count], match
                total += count
                job.shadow = []
            elif not job.shadow and len(draft) >= SHADOW:
                job.shadow = draft[:SHADOW]
        idle = [part for part in parts if not part.draft]
        for part in idle:
            part.job.acceptance.idle()
        # The core's rates drift back once a step, however many sequences idled.
        for shared in (self.acceptance, self.constrained):
            if any(part.job.acceptance.shared is shared for part in idle):
                shared.idle()


def _runs(ids: Sequence[int]) -> list[list[int]]:
    """The runs of consecutive ``ids`` (ascending), as lists of their indices."""
    runs: list[list[int]] = []
    for j, seq in enumerate(ids):
        if runs and ids[runs[-1][-1]] == seq - 1:
            runs[-1].append(j)
        else:
            runs.append([j])
    return runs


def judge_shadow(job: Job, tokens: Sequence[int]) -> None:
    """Check the sequence's shadow draft (see :data:`SHADOW`) against the tokens it emitted:
    the first wrong one ends it; all of it right puts the sequence on a run."""
    for token in tokens:
        if token != job.shadow.pop(0):
            job.shadow = []
        elif not job.shadow:
            job.acceptance.back_on_track()
        if not job.shadow:
            return


def cut_anywhere(model: LlamaModel) -> bool:
    """Whether a sequence's memory can be cut back to any position: attention only, with a
    full-size sliding-window cache."""
    recurrent = model.is_recurrent or model.is_hybrid
    return not recurrent and (model.n_swa == 0 or model.swa_full)


def spec_draft_limit(model: LlamaModel, config: EngineConfig) -> int:
    """The most draft tokens a sequence may carry: 0 when speculation is off, or when the
    memory cannot take rejected drafts back (recurrent state without snapshots)."""
    if config.spec is None:
        return 0
    if cut_anywhere(model):
        return config.spec_draft_max
    return min(config.spec_draft_max, model.n_rs_seq)
