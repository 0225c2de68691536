"""A worker's Prometheus metrics: the engine's figures, read at scrape time, and one
observation per finished request.

Names follow the servers people already scrape: llama.cpp's ``llamacpp:*`` where the meaning
is the same, vLLM's ``vllm:*`` for the per-request histograms and for the three gauges
Kubernetes' Gateway API Inference Extension reads from a model server
(``vllm:num_requests_waiting``, ``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc``).

Nothing here runs in the decode loop: the engine keeps plain counters
(:class:`~llmtrio.engine.EngineStats`) and :class:`EngineCollector` turns them into samples
when a scrape asks; the histograms are observed once per request, on the Trio side, from its
``Done`` event.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..engine import Done, EmbeddingEngine, Engine
from ._embeddings import EmbeddingsDone

__all__ = ["EngineCollector", "WorkerMetrics"]

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


class EngineCollector(Collector):
    """The engine's live figures at scrape time: llama.cpp's counters and gauges and, unless
    ``picker_gauges`` is false, the Inference Extension's three gauges (false where an
    ingress in the same registry exports them for its whole ring, this engine included)."""

    def __init__(self, engine: Engine | EmbeddingEngine, *, picker_gauges: bool = True) -> None:
        self._engine = engine
        self._picker_gauges = picker_gauges

    def collect(self) -> Iterable[Metric]:
        stats = self._engine.stats
        capacity = self._engine.capacity()
        config = self._engine.config
        running = min(stats.running, capacity.inflight)
        deferred = capacity.inflight - running
        yield CounterMetricFamily(
            "llamacpp:prompt_tokens",
            "Number of prompt tokens processed.",
            stats.prompt_tokens_ingested,
        )
        yield CounterMetricFamily(
            "llamacpp:tokens_predicted",
            "Number of generation tokens processed.",
            stats.tokens_predicted,
        )
        yield CounterMetricFamily(
            "llamacpp:n_decode", "Total number of llama_decode() calls.", stats.steps
        )
        yield GaugeMetricFamily(
            "llamacpp:n_busy_slots_per_decode",
            "Average number of busy slots per llama_decode() call.",
            stats.busy_slots / stats.steps if stats.steps else 0.0,
        )
        yield GaugeMetricFamily(
            "llamacpp:requests_processing", "Number of requests processing.", running
        )
        yield GaugeMetricFamily(
            "llamacpp:requests_deferred", "Number of requests deferred.", deferred
        )
        if self._picker_gauges:
            yield GaugeMetricFamily(
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                running,
            )
            yield GaugeMetricFamily(
                "vllm:num_requests_waiting", "Number of requests waiting to be processed.", deferred
            )
            cells = config.max_inflight * config.ctx_size
            yield GaugeMetricFamily(
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
                min(1.0, stats.kv_tokens / cells) if cells else 0.0,
            )
        # Prompt reuse, in tokens as vLLM counts its prefix cache, and in requests and bytes.
        yield CounterMetricFamily(
            "vllm:prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache.",
            stats.prompt_tokens_ingested + stats.prompt_cache_reused_tokens,
        )
        yield CounterMetricFamily(
            "vllm:prefix_cache_hits",
            "Prompt tokens found in the prefix cache (not ingested again).",
            stats.prompt_cache_reused_tokens,
        )
        yield CounterMetricFamily(
            "llmtrio_prompt_cache_hits",
            "Requests that started with part of their prompt already in memory.",
            stats.prompt_cache_hits,
        )
        yield GaugeMetricFamily(
            "llmtrio_prompt_cache_bytes",
            "Host memory held by prompt-state snapshots.",
            stats.prompt_cache_bytes,
        )
        # Speculative decoding, in vLLM's names (one "draft" is one sequence-step's drafts).
        yield CounterMetricFamily(
            "vllm:spec_decode_num_drafts",
            "Number of spec decoding drafts (sequence-steps that carried draft tokens).",
            stats.spec_steps,
        )
        yield CounterMetricFamily(
            "vllm:spec_decode_num_draft_tokens",
            "Number of draft tokens verified.",
            stats.spec_draft_tokens,
        )
        yield CounterMetricFamily(
            "vllm:spec_decode_num_accepted_tokens",
            "Number of draft tokens accepted (emitted without a step of their own).",
            stats.spec_accepted_tokens,
        )
        # The shared KV pool (--kv-unified): sequences swapped out to make room.
        yield CounterMetricFamily(
            "vllm:num_preemptions",
            "Cumulative number of preemptions (sequences swapped out of a full pool).",
            stats.preemptions,
        )


class WorkerMetrics:
    """A worker's metrics in ``registry``: the engine's live figures (``picker_gauges``: see
    :class:`EngineCollector`), and the per-request histograms observed by :meth:`finished`."""

    def __init__(
        self,
        registry: CollectorRegistry,
        engine: Engine | EmbeddingEngine,
        *,
        picker_gauges: bool = True,
    ) -> None:
        registry.register(EngineCollector(engine, picker_gauges=picker_gauges))
        tokens = _token_buckets(engine.config.ctx_size)
        self._ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds (queue and prefill).",
            buckets=_TTFT_BUCKETS,
            registry=registry,
        )
        self._tpot = Histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of each request's mean time per output token after the first.",
            buckets=_TPOT_BUCKETS,
            registry=registry,
        )
        self._e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds (in the engine).",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self._queue = Histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent waiting for a slot in seconds.",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self._prompt = Histogram(
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed.",
            buckets=tokens,
            registry=registry,
        )
        self._generation = Histogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            buckets=tokens,
            registry=registry,
        )
        self._success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            ["finished_reason"],
            registry=registry,
        )
        self._prompt_total = Counter(
            "vllm:prompt_tokens",
            "Number of prefill tokens processed (embedding inputs included).",
            registry=registry,
        )
        self._embedding_requests = Counter(
            "llmtrio_embedding_requests",
            "Embedding requests answered.",
            registry=registry,
        )
        self._embedding_inputs = Counter(
            "llmtrio_embedding_inputs",
            "Inputs (texts or token arrays) embedded.",
            registry=registry,
        )

    def finished(self, done: Done) -> None:
        """One request ended with ``done`` (cancelled ones are not observed). An embeddings
        request counts its request, inputs, prompt tokens and latency (it has no first
        token and no output tokens)."""
        self._prompt_total.inc(done.prompt_tokens)
        if isinstance(done, EmbeddingsDone):
            self._embedding_requests.inc()
            self._embedding_inputs.inc(len(done.vectors))
            self._e2e.observe(done.timings.prefill_s)
            self._prompt.observe(done.prompt_tokens)
            self._success.labels(done.stop.finish_reason).inc()
            return
        timings = done.timings
        self._ttft.observe(timings.queue_s + timings.prefill_s)
        if done.completion_tokens > 1:
            self._tpot.observe(timings.decode_s / (done.completion_tokens - 1))
        self._e2e.observe(timings.queue_s + timings.prefill_s + timings.decode_s)
        self._queue.observe(timings.queue_s)
        self._prompt.observe(done.prompt_tokens)
        self._generation.observe(done.completion_tokens)
        self._success.labels(done.stop.finish_reason).inc()
