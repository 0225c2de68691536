"""The ingress's Prometheus metrics: requests by outcome, counted once per request as it
ends, and the ring's live state (parked and served streams, attached workers, each worker's
heartbeat age), read at scrape time.

The Gateway API Inference Extension's endpoint picker scores the pods it sends requests to,
which are the ingresses, by the gauges a vLLM server exports; each ingress exports them for its
own ring: ``vllm:num_requests_waiting`` (requests parked), ``vllm:num_requests_running``
(requests a worker holds), ``vllm:kv_cache_usage_perc`` (over the attached workers: the KV cells
their running sequences hold over all their cells, as their heartbeats last said, so two
workers of 8 slots each count as one engine of 16) and ``vllm:cache_config_info`` (its
``block_size`` and ``num_gpu_blocks`` size the picker's prefix-cache scorer).

Each ingress has its own :class:`~prometheus_client.CollectorRegistry` (never the global
default), so several stacks can run in one process. ``llmtrio serve`` with its local worker
registers the worker's engine figures in the same registry (``llmtrio.cli.serve``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import generate_latest as _generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..api import PROBE_PATHS, RING_PATHS, ROUTES
from ..ring import Outcome, Ring, RingStats
from ._access import CLIENT_CLOSED, Exchange

__all__ = ["CONTENT_TYPE", "KV_BLOCK_TOKENS", "IngressMetrics", "RingCollector"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
#: The block the picker's prefix-cache scorer hashes prompts by, in tokens (vLLM's default).
#: llama.cpp has no paged blocks: a worker reuses any cached prefix, token by token, so every
#: whole block the picker matches is reusable; ``num_gpu_blocks`` is the cells over this.
KV_BLOCK_TOKENS = 16
#: Paths counted under their own name; any other is counted as ``other`` (bounded labels).
_KNOWN_PATHS = frozenset({*(route.path for route in ROUTES), *PROBE_PATHS, "/", "/metrics"})
_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
    600.0,
)  # fmt: skip


class RingCollector(Collector):
    """The ring's live state at scrape time."""

    def __init__(self, ring: Ring) -> None:
        self._ring = ring

    def collect(self) -> Iterable[Metric]:
        stats = self._ring.stats()
        yield GaugeMetricFamily(
            "llmtrio_ring_parked_streams", "Requests parked, waiting for a worker.", stats.parked
        )
        yield GaugeMetricFamily(
            "llmtrio_ring_serving_streams", "Requests a worker holds.", stats.serving
        )
        yield GaugeMetricFamily(
            "llmtrio_ring_max_streams",
            "Requests the ring holds at most (parked and served) before 503.",
            stats.max_streams,
        )
        yield GaugeMetricFamily(
            "llmtrio_workers_attached", "Workers attached to the ring.", len(stats.workers)
        )
        try:
            now: float | None = trio.current_time()
        except RuntimeError:  # scraped from outside the ring's Trio run
            now = None
        age = GaugeMetricFamily(
            "llmtrio_worker_heartbeat_age_seconds",
            "Seconds since each worker's last capacity heartbeat.",
            labels=["worker"],
        )
        inflight = GaugeMetricFamily(
            "llmtrio_worker_inflight",
            "Requests each worker reported in flight (its last heartbeat).",
            labels=["worker"],
        )
        held = GaugeMetricFamily(
            "llmtrio_worker_held_streams", "Streams each worker holds.", labels=["worker"]
        )
        for worker in stats.workers:
            held.add_metric([worker.worker_id], len(worker.held))
            if worker.capacity is not None:
                inflight.add_metric([worker.worker_id], worker.capacity.inflight)
            if worker.last_heartbeat is not None and now is not None:
                age.add_metric([worker.worker_id], max(0.0, now - worker.last_heartbeat))
        yield age
        yield inflight
        yield held
        yield from _picker_gauges(stats)


def _picker_gauges(stats: RingStats) -> Iterator[Metric]:
    """The Inference Extension's gauges, for this ring (see the module's docstring)."""
    yield GaugeMetricFamily(
        "vllm:num_requests_waiting",
        "Requests parked on this ingress, waiting for a worker.",
        stats.parked,
    )
    yield GaugeMetricFamily(
        "vllm:num_requests_running",
        "Requests of this ingress that a worker holds.",
        stats.assigned + stats.responding,
    )
    # Workers that do not report their KV cache (older ones) are left out of both sums.
    beats = [w.capacity for w in stats.workers if w.capacity is not None and w.capacity.kv_total]
    used = sum(beat.kv_used for beat in beats)
    cells = sum(beat.kv_total for beat in beats)
    yield GaugeMetricFamily(
        "vllm:kv_cache_usage_perc",
        "KV-cache usage over the attached workers (cells in use over cells). 1 means 100 "
        "percent usage.",
        min(1.0, used / cells) if cells else 0.0,
    )
    info = GaugeMetricFamily(
        "vllm:cache_config_info",
        "Information of the KV cache of the attached workers (block_size in tokens).",
        labels=["block_size", "num_gpu_blocks"],
    )
    info.add_metric([str(KV_BLOCK_TOKENS), str(cells // KV_BLOCK_TOKENS)], 1)
    yield info


class IngressMetrics:
    """An ingress's metrics in their own ``registry``: what :meth:`request_ended` counts, and
    the ring's state through :class:`RingCollector`."""

    def __init__(self, ring: Ring, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.registry.register(RingCollector(ring))
        self._requests = Counter(
            "llmtrio_http_requests",
            "HTTP requests answered, by path, status and status class (2xx, 4xx, 5xx).",
            ["path", "status", "status_class"],
            registry=self.registry,
        )
        self._errors = Counter(
            "llmtrio_request_errors",
            "Error responses (and errors ending a started stream), by OpenAI error code.",
            ["code"],
            registry=self.registry,
        )
        self._finished = Counter(
            "llmtrio_request_finish",
            "Completions that ended with a finish reason, by finish reason.",
            ["finish_reason"],
            registry=self.registry,
        )
        self._gone = Counter(
            "llmtrio_client_disconnects",
            "Requests whose client left before the response ended.",
            registry=self.registry,
        )
        self._in_progress = Gauge(
            "llmtrio_requests_in_progress",
            "Completion requests at the ingress, from their arrival until they are counted.",
            registry=self.registry,
        )
        self._ttfb = Histogram(
            "llmtrio_time_to_first_byte_seconds",
            "Seconds from a completion request's arrival to its response head (at the ingress).",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._duration = Histogram(
            "llmtrio_request_duration_seconds",
            "Seconds from a completion request's arrival to its last byte (at the ingress).",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )

    def request_started(self, path: str) -> None:
        """A request arrived; :meth:`request_ended` counts it when it ends."""
        if path in RING_PATHS:
            self._in_progress.inc()

    def request_ended(self, exchange: Exchange, ended: float) -> None:
        """Count one request as it ended: its status (none when the client left before any
        answer), and from its outcome its error code and finish reason; a client that left
        (``client_closed``) is counted as a disconnect, not as an error response."""
        path, status = exchange.path, exchange.observer.status
        outcome = exchange.outcome or Outcome()
        if path in RING_PATHS:
            self._in_progress.dec()
        if outcome.error_code == CLIENT_CLOSED:
            self._gone.inc()
        if status is None:
            return
        label = path if path in _KNOWN_PATHS else "other"
        self._requests.labels(label, str(status), f"{status // 100}xx").inc()
        if outcome.error_code is not None and outcome.error_code != CLIENT_CLOSED:
            self._errors.labels(outcome.error_code).inc()
        if outcome.finish_reason is not None:
            self._finished.labels(outcome.finish_reason).inc()
        if path in RING_PATHS:
            ttfb = exchange.ttfb()
            if ttfb is not None:
                self._ttfb.observe(ttfb)
            self._duration.observe(ended - exchange.started)

    def render(self) -> bytes:
        """The registry in Prometheus's text format (:data:`CONTENT_TYPE`)."""
        return _generate_latest(self.registry)
