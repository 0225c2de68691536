"""The ingress's Prometheus metrics: requests by outcome, counted once per request as it
ends, and the ring's live state (parked and served streams, attached workers, each worker's
heartbeat age), read at scrape time.

Each ingress has its own :class:`~prometheus_client.CollectorRegistry` (never the global
default), so several stacks can run in one process. ``llmtrio serve`` with its local worker
registers the worker's engine figures in the same registry (``llmtrio.server``).
"""

from __future__ import annotations

from collections.abc import Iterable

import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import generate_latest as _generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .._routes import RING_PATHS
from ..ring import Ring

__all__ = ["CONTENT_TYPE", "IngressMetrics", "RingCollector"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
#: Paths counted under their own name; any other is counted as ``other`` (bounded labels).
_KNOWN_PATHS = frozenset({*RING_PATHS, "/", "/health", "/v1/models", "/metrics"})
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

    def request_ended(
        self,
        path: str,
        status: int | None,
        *,
        error_code: str | None,
        finish_reason: str | None,
        ttfb: float | None,
        total: float,
    ) -> None:
        """Count one request; ``status`` ``None`` when the client left before any answer."""
        if path in RING_PATHS:
            self._in_progress.dec()
        if status is None:
            self._gone.inc()
            return
        label = path if path in _KNOWN_PATHS else "other"
        self._requests.labels(label, str(status), f"{status // 100}xx").inc()
        if error_code is not None:
            self._errors.labels(error_code).inc()
        if finish_reason is not None:
            self._finished.labels(finish_reason).inc()
        if path in RING_PATHS:
            if ttfb is not None:
                self._ttfb.observe(ttfb)
            self._duration.observe(total)

    def client_left(self) -> None:
        """A client left mid-response (counted besides its status)."""
        self._gone.inc()

    def render(self) -> bytes:
        """The registry in Prometheus's text format (:data:`CONTENT_TYPE`)."""
        return _generate_latest(self.registry)
