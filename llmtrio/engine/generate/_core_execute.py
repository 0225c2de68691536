"""One step's batch carried out (:class:`Execution`, a part of :class:`EngineCore`): the
parts packed into one ``llama_decode`` (media chunks decoded on their own), each sampled
and its drafts verified, and a failed batch of several sequences retried one by one."""

from __future__ import annotations

import time
from collections.abc import Callable

from .._cores import ThreadChooser
from .._errors import DecodeError
from .._stats import EngineStats
from ..llama import Batch, LlamaModel, RawLogprob, verify
from ._jobs import Job, Part

__all__ = ["Execution"]


class Execution:
    """The decode part of :class:`~._core.EngineCore` (which sets the attributes declared
    here)."""

    _model: LlamaModel
    _stats: EngineStats
    _batch: Batch
    _threads: ThreadChooser
    _threads_now: int
    _choose_threads: bool
    _sample_s: float

    def _decode(
        self, parts: list[Part]
    ) -> tuple[
        float,
        list[tuple[Job, list[int], list[RawLogprob] | None]],
        list[tuple[Job, Exception]],
    ]:
        """Decode ``parts`` in one batch and sample each part that ends with an output
        (verifying its drafts).

        When llama_decode fails for a batch of several sequences, each sequence's part of
        this step is rolled back and retried alone, so only the sequences that fail alone are
        failed. A sequence whose memory cannot be rolled back (recurrent state) is failed.
        """
        failed: list[tuple[Job, Exception]] = []
        if any(part.job.request.media for part in parts):
            parts, failed = self._decode_media(parts)
            if not parts:
                return 0.0, [], failed
        batch = self._batch
        batch.clear()
        for part in parts:
            job = part.job
            if part.start is None:
                if part.draft:
                    part.index = batch.add(
                        [job.last_token, *part.draft],
                        job.position(job.pos),
                        job.seq,
                        output_last=True,
                        output_all=True,
                    ) - len(part.draft)
                else:
                    part.index = batch.add_one(job.last_token, job.position(job.pos), job.seq)
            else:
                last = part.start + part.count == len(job.prompt)
                chunk = job.prompt[part.start : part.start + part.count]
                part.index = batch.add(chunk, job.position(part.start), job.seq, output_last=last)
                part.outputs = last
        threads = self._threads.choose(batch.n) if self._choose_threads else self._threads.most
        if threads != self._threads_now:
            self._model.set_threads(threads)
            self._threads_now = threads
        t0 = time.perf_counter()
        rc = self._model.decode(batch)
        decode_s = time.perf_counter() - t0
        if rc == 0:
            self._threads.observe(threads, batch.n, decode_s)
            if threads < self._threads.most:
                self._stats.fewer_threads_steps += 1
            sampled = []
            for part in parts:
                if part.start is None:
                    try:
                        sampled.append(self._verify(part))
                    except DecodeError as exc:  # this sequence's memory only
                        failed.append((part.job, exc))
                    continue
                part.job.pos = part.start + part.count
                if part.outputs and part.job.sampler is not None:
                    sampled.append(self._sample_one(part.job, part.index))
            return decode_s, sampled, failed
        retry: list[Part] = []
        for part in parts:
            start = part.job.pos if part.start is None else part.start
            if len(parts) > 1 and self._model.forget(part.job.seq, part.job.position(start)):
                retry.append(part)
            else:
                failed.append((part.job, DecodeError(_decode_error(rc))))
        sampled = []
        for part in retry:
            spent, ok, bad = self._decode([part])
            decode_s += spent
            sampled += ok
            failed += bad
        return decode_s, sampled, failed

    def _decode_media(self, parts: list[Part]) -> tuple[list[Part], list[tuple[Job, Exception]]]:
        """Decode the media chunks among ``parts`` (each alone: its embeddings, encoded as
        the request was prepared, in a ``llama_decode`` of their own; a non-causal image
        whole, with causal attention off; a causal chunk, audio above all, in the prompt
        chunks the scheduler gave it), on this thread between two steps. Returns the other
        parts, and the jobs whose media failed."""
        model, stats = self._model, self._stats
        rest: list[Part] = []
        failed: list[tuple[Job, Exception]] = []
        for part in parts:
            job = part.job
            found = job.media_at(part.start)
            if found is None:
                rest.append(part)
                continue
            begin, chunk = found
            projector = model.projector
            assert part.start is not None and projector is not None
            t0 = time.perf_counter()
            embd = chunk.embd  # encoded as the request was prepared
            if embd is None:
                embd = projector.encode(chunk, model.n_embd)
            t1 = time.perf_counter()
            stats.image_decode_waits_s += t1 - t0
            if embd is None:
                failed.append((job, DecodeError("the projector could not encode a media chunk")))
                continue
            first, count = part.start - begin, part.count
            pos0 = job.position(begin)
            positions = projector.decoder_positions(chunk, pos0)
            if positions is not None and count < chunk.n_tokens:
                positions = positions.reshape(4, -1)[:, first : first + count].flatten()
            rc = model.decode_embeddings(
                embd[first * model.n_embd : (first + count) * model.n_embd],
                pos0 + first,
                job.seq,
                causal=not chunk.non_causal,
                positions=positions,
            )
            stats.decode_s += time.perf_counter() - t1
            if rc != 0:
                failed.append((job, DecodeError(_decode_error(rc))))
                continue
            job.pos = part.start + count
            part.outputs = False
        return rest, failed

    def _sample_one(self, job: Job, index: int) -> tuple[Job, list[int], list[RawLogprob] | None]:
        assert job.sampler is not None
        token = _pick(job, index)
        raw = job.sampler.last_logprob if job.request.request.logprobs is not None else None
        return job, [token], ([raw] if raw is not None else None)

    def _verify(self, part: Part) -> tuple[Job, list[int], list[RawLogprob] | None]:
        """Sample a decoding part's positions (its drafts verified), cut the rejected drafts
        from memory, and move the sequence on by what was accepted."""
        job, draft = part.job, part.draft
        sampler = job.sampler
        assert sampler is not None
        want_logprobs = job.request.request.logprobs is not None
        logprobs: list[RawLogprob] = []

        def sample(index: int) -> int:
            token = _pick(job, index)
            if want_logprobs and sampler.last_logprob is not None:
                logprobs.append(sampler.last_logprob)
            return token

        t0 = time.perf_counter()
        tokens = verify(sample, part.index, draft, self._ends(job))
        spent = time.perf_counter() - t0
        self._sample_s += spent
        ms = spent * 1000 / len(tokens)
        job.sample_ms = ms if not job.sample_ms else job.sample_ms + (ms - job.sample_ms) / 4
        accepted = len(tokens) - 1  # the draft tokens that are now in memory for good
        cut = job.position(job.pos + 1 + accepted)
        if accepted < len(draft) and not self._model.forget(job.seq, cut):
            # Not expected (drafts never exceed what the memory can roll back): the
            # sequence's memory is wrong now, so it fails (and its memory is cleared).
            raise DecodeError("rejected draft tokens could not be removed from memory")
        job.fed.append(job.last_token)
        job.fed += draft[:accepted]
        job.pos += 1 + accepted
        if draft:
            job.drafted += len(draft)
            job.accepted += accepted
            job.acceptance.verified(part.match, len(draft), accepted)
            stats = self._stats
            stats.spec_steps += 1
            stats.spec_draft_tokens += len(draft)
            stats.spec_accepted_tokens += accepted
        return job, tokens, (logprobs if want_logprobs else None)

    def _ends(self, job: Job) -> Callable[[int], bool]:
        eog = self._model.eog
        ignore_eos = job.request.request.ignore_eos
        return lambda token: token < 0 or (token in eog and not ignore_eos)


def _pick(job: Job, index: int) -> int:
    """The token at batch position ``index`` of ``job``: sampled, or the marker its
    reasoning budget forces there (which its sampler takes as if picked)."""
    sampler, think = job.sampler, job.think
    assert sampler is not None
    if think is None:
        return sampler.sample(index)
    forced = think.forced()
    token = sampler.sample(index) if forced is None else sampler.force(index, forced)
    think.feed(token, forced=forced is not None)
    return token


def _decode_error(rc: int) -> str:
    reasons = {
        1: "no room left in the context memory for this sequence",
        2: "the decode was aborted",
        -1: "llama.cpp rejected the batch as invalid",
    }
    return f"llama_decode failed ({rc}): {reasons.get(rc, 'fatal error in the compute graph')}"
