"""A worker's Prometheus metrics: the engine's figures, read at scrape time, and one
observation per finished request.

Names follow the servers people already scrape: llama.cpp's ``llamacpp:*`` where the meaning
is the same, vLLM's ``vllm:*`` for the per-request histograms and for the three gauges
Kubernetes' Gateway API Inference Extension reads from a model server
(``vllm:num_requests_waiting``, ``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc``).

Every family of an engine's figures carries a ``model_name`` label, as vLLM's do
(``vllm:num_requests_running{model_name="..."}``), so a process serving several models
(``llmtrio serve --model A --model B``) exports each one's figures side by side in one
registry.

Nothing here runs in the decode loop: the engine keeps plain counters
(:class:`~llmtrio.engine.EngineStats`) and :class:`EngineCollector` turns them into samples
when a scrape asks; the histograms are observed once per generation, on the Trio side, from
its ``Done`` event. Work that is not a generation (an embeddings request, a reranking
request, ``/tokenize``, ``/detokenize``, a token count) ends with an ``Answer`` of its kind
instead, counted in a counter of its kind's own (:data:`ANSWER_COUNTERS`) and never observed
as a generation.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final, NamedTuple

import attrs
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..engine import Done, EmbeddingEngine, Engine, EngineStats
from ._encoding import Answer

__all__ = ["ANSWER_COUNTERS", "AnswerCounter", "EngineCollector", "WorkerMetrics"]


@attrs.frozen
class AnswerCounter:
    """How one kind of ``Answer`` is counted: its requests in the counter ``requests``, its
    inputs in ``inputs`` when it has one, and its prompt tokens among the prompt tokens
    processed when the engine ``ingests`` them (an embeddings request's; a count ingests
    nothing)."""

    requests: str
    documentation: str
    inputs: tuple[str, str] | None = None
    ingests: bool = False


#: Each kind of answer (``Answer.kind``), counted in a counter of its own.
ANSWER_COUNTERS: Final = {
    "embeddings": AnswerCounter(
        "llmtrio_embedding_requests",
        "Embedding requests answered.",
        ("llmtrio_embedding_inputs", "Inputs (texts or token arrays) embedded."),
        ingests=True,
    ),
    "rerank": AnswerCounter(
        "llmtrio_rerank_requests",
        "Reranking and score requests answered.",
        ("llmtrio_rerank_documents", "Documents (query-document pairs) scored."),
        ingests=True,
    ),
    "tokenize": AnswerCounter("llmtrio_tokenize_requests", "Tokenize requests answered."),
    "detokenize": AnswerCounter("llmtrio_detokenize_requests", "Detokenize requests answered."),
    "count_tokens": AnswerCounter(
        "llmtrio_token_count_requests",
        "Prompt token counts answered (count_tokens, input_tokens).",
    ),
}

# vLLM's buckets (vllm/v1/metrics/loggers.py), so dashboards built for it read ours as well.
_TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_TPOT_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


def _token_buckets(limit: int) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``limit`` (vLLM's ``build_1_2_5_buckets``)."""
    buckets: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > limit:
                return (*buckets, float("inf"))
            buckets.append(float(value))
        exponent += 1


class _Figure(NamedTuple):
    """One engine's value of one family."""

    kind: type[CounterMetricFamily] | type[GaugeMetricFamily]
    name: str
    documentation: str
    value: float


class EngineCollector(Collector):
    """The engines' live figures at scrape time, one sample per engine in each family
    (labelled ``model_name``): llama.cpp's counters and gauges and, unless ``picker_gauges``
    is false, the Inference Extension's three gauges (false where an ingress in the same
    registry exports them for its whole ring, these engines included)."""

    def __init__(
        self,
        engines: Engine | EmbeddingEngine | Sequence[Engine | EmbeddingEngine],
        *,
        picker_gauges: bool = True,
    ) -> None:
        self._engines = list(engines) if isinstance(engines, Sequence) else [engines]
        self._picker_gauges = picker_gauges

    def collect(self) -> Iterable[Metric]:
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for engine in self._engines:
            for figure in self._figures(engine):
                family = families.get(figure.name)
                if family is None:
                    family = figure.kind(figure.name, figure.documentation, labels=["model_name"])
                    families[figure.name] = family
                family.add_metric([engine.model_name], figure.value)
        return families.values()

    def _figures(self, engine: Engine | EmbeddingEngine) -> Iterable[_Figure]:
        stats = engine.stats
        capacity = engine.capacity()
        config = engine.config
        running = min(stats.running, capacity.inflight)
        deferred = capacity.inflight - running
        yield _Figure(
            CounterMetricFamily,
            "llamacpp:prompt_tokens",
            "Number of prompt tokens processed.",
            stats.prompt_tokens_ingested,
        )
        yield _Figure(
            CounterMetricFamily,
            "llamacpp:tokens_predicted",
            "Number of generation tokens processed.",
            stats.tokens_predicted,
        )
        yield _Figure(
            CounterMetricFamily,
            "llamacpp:n_decode",
            "Total number of llama_decode() calls.",
            stats.steps,
        )
        yield _Figure(
            GaugeMetricFamily,
            "llamacpp:n_busy_slots_per_decode",
            "Average number of busy slots per llama_decode() call.",
            stats.busy_slots / stats.steps if stats.steps else 0.0,
        )
        yield _Figure(
            GaugeMetricFamily,
            "llamacpp:requests_processing",
            "Number of requests processing.",
            running,
        )
        yield _Figure(
            GaugeMetricFamily,
            "llamacpp:requests_deferred",
            "Number of requests deferred.",
            deferred,
        )
        if self._picker_gauges:
            yield _Figure(
                GaugeMetricFamily,
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                running,
            )
            yield _Figure(
                GaugeMetricFamily,
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
                deferred,
            )
            cells = config.max_inflight * config.ctx_size
            yield _Figure(
                GaugeMetricFamily,
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
                min(1.0, stats.kv_tokens / cells) if cells else 0.0,
            )
        # Prompt reuse, in tokens as vLLM counts its prefix cache, and in requests and bytes.
        yield _Figure(
            CounterMetricFamily,
            "vllm:prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache.",
            stats.prompt_tokens_ingested + stats.prompt_cache_reused_tokens,
        )
        yield _Figure(
            CounterMetricFamily,
            "vllm:prefix_cache_hits",
            "Prompt tokens found in the prefix cache (not ingested again).",
            stats.prompt_cache_reused_tokens,
        )
        yield _Figure(
            CounterMetricFamily,
            "llmtrio_prompt_cache_hits",
            "Requests that started with part of their prompt already in memory.",
            stats.prompt_cache_hits,
        )
        yield _Figure(
            GaugeMetricFamily,
            "llmtrio_prompt_cache_bytes",
            "Host memory held by prompt-state snapshots.",
            stats.prompt_cache_bytes,
        )
        if config.cache_dir is not None and isinstance(engine, Engine):
            yield from _disk_figures(stats)
        # Speculative decoding, in vLLM's names (one "draft" is one sequence-step's drafts).
        yield _Figure(
            CounterMetricFamily,
            "vllm:spec_decode_num_drafts",
            "Number of spec decoding drafts (sequence-steps that carried draft tokens).",
            stats.spec_steps,
        )
        yield _Figure(
            CounterMetricFamily,
            "vllm:spec_decode_num_draft_tokens",
            "Number of draft tokens verified.",
            stats.spec_draft_tokens,
        )
        yield _Figure(
            CounterMetricFamily,
            "vllm:spec_decode_num_accepted_tokens",
            "Number of draft tokens accepted (emitted without a step of their own).",
            stats.spec_accepted_tokens,
        )
        yield _Figure(
            CounterMetricFamily,
            "llmtrio_spec_held_steps",
            "Steps run without drafts, held by the draft gate (drafting was not paying, or the "
            "plain rate was being measured).",
            stats.spec_held_steps,
        )
        # The shared KV pool (--kv-unified): sequences swapped out to make room.
        yield _Figure(
            CounterMetricFamily,
            "vllm:num_preemptions",
            "Cumulative number of preemptions (sequences swapped out of a full pool).",
            stats.preemptions,
        )


def _disk_figures(stats: EngineStats) -> Iterable[_Figure]:
    """The prompt cache on disk (``--cache-dir``): hits, misses, bytes, restore time."""
    yield _Figure(
        CounterMetricFamily,
        "llmtrio_prompt_cache_disk_hits",
        "Requests that restored part of their prompt from a snapshot file on disk.",
        stats.disk_hits,
    )
    yield _Figure(
        CounterMetricFamily,
        "llmtrio_prompt_cache_disk_misses",
        "Prompts looked up on disk for more than memory held that no file served.",
        stats.disk_misses,
    )
    yield _Figure(
        CounterMetricFamily,
        "llmtrio_prompt_cache_disk_restored_tokens",
        "Prompt tokens restored from snapshot files (not ingested).",
        stats.disk_restored_tokens,
    )
    yield _Figure(
        CounterMetricFamily,
        "llmtrio_prompt_cache_disk_restore_seconds",
        "Seconds spent reading, checking and restoring snapshot files.",
        stats.disk_restore_s,
    )
    yield _Figure(
        GaugeMetricFamily,
        "llmtrio_prompt_cache_disk_bytes",
        "Bytes of the snapshot files kept on disk.",
        stats.disk_bytes,
    )
    yield _Figure(
        GaugeMetricFamily,
        "llmtrio_prompt_cache_disk_files",
        "Snapshot files kept on disk.",
        stats.disk_entries,
    )
    yield _Figure(
        CounterMetricFamily,
        "llmtrio_prompt_cache_disk_written_bytes",
        "Bytes of snapshot files written.",
        stats.disk_written_bytes,
    )
    yield _Figure(
        CounterMetricFamily,
        "llmtrio_prompt_cache_disk_dropped",
        "Snapshots evicted from memory and not written: the writer was too far behind.",
        stats.disk_dropped,
    )
    yield _Figure(
        CounterMetricFamily,
        "llmtrio_prompt_cache_disk_refused",
        "Snapshot files refused and removed (truncated, corrupt, another model's or build's).",
        stats.disk_refused,
    )


class WorkerMetrics:
    """A worker process's metrics in ``registry``, for each of its ``engines`` (one model
    each) and each of its ``models`` served on demand (by name; no engine at start): the
    engines' live figures (``picker_gauges``: see :class:`EngineCollector`), the
    per-generation histograms and counters observed by :meth:`generated`, and the counters
    of the other answers (:meth:`answered`), every family labelled ``model_name``."""

    def __init__(
        self,
        registry: CollectorRegistry,
        engines: Engine | EmbeddingEngine | Sequence[Engine | EmbeddingEngine],
        *,
        models: Sequence[str] = (),
        picker_gauges: bool = True,
    ) -> None:
        engines = list(engines) if isinstance(engines, Sequence) else [engines]
        registry.register(EngineCollector(engines, picker_gauges=picker_gauges))
        # No engine at start (every model on demand): the default context's buckets.
        tokens = _token_buckets(max((engine.config.ctx_size for engine in engines), default=4096))
        model = ["model_name"]

        def histogram(name: str, documentation: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(name, documentation, model, buckets=buckets, registry=registry)

        def counter(name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
            return Counter(name, documentation, [*model, *labels], registry=registry)

        self._ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds (queue and prefill).",
            _TTFT_BUCKETS,
        )
        self._tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of each request's mean time per output token after the first.",
            _TPOT_BUCKETS,
        )
        self._e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds (in the engine).",
            _LATENCY_BUCKETS,
        )
        self._queue = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent waiting for a slot in seconds.",
            _LATENCY_BUCKETS,
        )
        self._prompt = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens
        )
        self._generation = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tokens
        )
        self._success = counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            ["finished_reason"],
        )
        self._prompt_total = counter(
            "vllm:prompt_tokens",
            "Number of prefill tokens processed (embedding inputs included).",
        )
        self._answers = {
            kind: (
                counter(counting.requests, counting.documentation),
                None if counting.inputs is None else counter(*counting.inputs),
            )
            for kind, counting in ANSWER_COUNTERS.items()
        }
        # Every model's series from the start (0 until its first request), as vLLM's.
        labelled: list[Histogram | Counter] = [
            self._ttft,
            self._tpot,
            self._e2e,
            self._queue,
            self._prompt,
            self._generation,
            self._prompt_total,
        ]
        labelled += [each for pair in self._answers.values() for each in pair if each]
        for name in [engine.model_name for engine in engines] + list(models):
            for family in labelled:
                family.labels(name)

    def generated(self, done: Done, model_name: str) -> None:
        """One generation of ``model_name`` ended with ``done`` (cancelled ones are not
        observed): its latencies, lengths and finish reason."""
        self._success.labels(model_name, done.stop.finish_reason).inc()
        self._prompt_total.labels(model_name).inc(done.prompt_tokens)
        self._prompt.labels(model_name).observe(done.prompt_tokens)
        timings = done.timings
        self._ttft.labels(model_name).observe(timings.queue_s + timings.prefill_s)
        if done.completion_tokens > 1:
            self._tpot.labels(model_name).observe(timings.decode_s / (done.completion_tokens - 1))
        self._e2e.labels(model_name).observe(timings.queue_s + timings.prefill_s + timings.decode_s)
        self._queue.labels(model_name).observe(timings.queue_s)
        self._generation.labels(model_name).observe(done.completion_tokens)

    def answered(self, answer: Answer, model_name: str) -> None:
        """One request of ``model_name`` that is not a generation ended with ``answer``: its
        kind's counters move (:data:`ANSWER_COUNTERS`); no generation is observed."""
        requests, inputs = self._answers[answer.kind]
        requests.labels(model_name).inc()
        if inputs is not None:
            inputs.labels(model_name).inc(answer.inputs)
        if ANSWER_COUNTERS[answer.kind].ingests:
            self._prompt_total.labels(model_name).inc(answer.prompt_tokens)
