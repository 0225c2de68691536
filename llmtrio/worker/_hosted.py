"""The catalog models a worker loads on demand, as its host sees them: the host's budget
(:class:`HostConfig`), each model's engine config, kind and estimated cost
(:class:`HostedModel`), and the failure of a load (:class:`ModelLoadFailed`). Values only;
the host that loads them is ``_host.ModelHost``."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from pathlib import Path

import attrs

from ..api import CHAT_MODEL, ApiError, keep_alive_seconds, model_load_failed
from ..engine import EngineConfig, EngineError
from ..engine.models import check_gguf, model_kind
from ._load_policy import ModelCost, estimate_cost

__all__ = ["HostConfig", "HostedModel", "ModelLoadFailed"]

logger = logging.getLogger("llmtrio.worker")


def _keep_alive(value: object) -> float:
    try:
        return keep_alive_seconds(value)
    except ValueError as exc:
        raise ValueError(f"keep_alive {exc}") from None


@attrs.frozen
class HostConfig:
    """The budget of a worker's models on demand: ``max_loaded_models`` and
    ``memory_budget_mib`` (0: no bound; pinned models count), ``keep_alive`` (seconds an
    idle model stays loaded unless a request or its catalog entry says otherwise) and
    ``load_timeout`` (seconds a load may take before it fails)."""

    max_loaded_models: int = 0
    memory_budget_mib: int = 0
    keep_alive: float = attrs.field(default=300.0, converter=_keep_alive)
    load_timeout: float = 600.0

    def __attrs_post_init__(self) -> None:
        if self.max_loaded_models < 0:
            raise ValueError("max_loaded_models must be 0 (no bound) or more")
        if self.memory_budget_mib < 0:
            raise ValueError("memory_budget_mib must be 0 (no bound) or more")
        if not self.load_timeout > 0:
            raise ValueError("load_timeout must be more than 0")


@attrs.frozen
class HostedModel:
    """A catalog model as the host loads it: its engine config, kind, estimated cost, own
    keep-alive (``None``: the host's) and whether it is pinned."""

    name: str
    config: EngineConfig
    kind: str
    cost: ModelCost
    keep_alive: float | None = None
    pinned: bool = False
    aliases: tuple[str, ...] = ()

    @property
    def context_length(self) -> int:
        """The most tokens one request may use once it is loaded, as its config says (a
        chat model's; 0, not stated, for an embedding model, whose own limit its file sets)."""
        return self.config.request_ctx if self.kind == CHAT_MODEL else 0

    @property
    def names(self) -> tuple[str, ...]:
        """What its link lists: its name, then its aliases (each routed to it)."""
        return (self.name, *self.aliases)

    @classmethod
    def of(
        cls,
        name: str,
        config: EngineConfig,
        keep_alive: float | None = None,
        aliases: Sequence[str] = (),
    ) -> HostedModel:
        """``config``'s model with its kind and cost from its GGUF header (a repo's model
        not on disk yet: a chat model of unknown weights, counted as 0 until loaded).

        A file that is not a usable GGUF file is listed all the same (as a chat model of no
        known cost): its load fails, naming why."""
        pinned = keep_alive == math.inf
        if config.model is None:
            return cls(name, config, "chat", ModelCost(0), keep_alive, pinned, tuple(aliases))
        try:
            weights = sum(p.stat().st_size for p in _parts(config.model))
            info = check_gguf(config.model)
        except (EngineError, OSError) as exc:
            # Listed all the same: its load fails with this reason, other models go on.
            logger.warning("catalog model %s: %s", name, str(exc).splitlines()[0])
            return cls(name, config, "chat", ModelCost(0), keep_alive, pinned, tuple(aliases))
        kind = model_kind(info)
        drafts = config.spec_draft_max if config.spec is not None else 0
        embeddings = kind in ("embedding", "rerank")  # a pooled context, no KV cache to keep
        cost = estimate_cost(
            info.metadata,
            weights,
            slots=config.max_inflight,
            ctx_size=config.ctx_size,
            n_batch=max(config.prefill_chunk + config.max_inflight * (1 + drafts), 64),
            cache_type_k=config.cache_type_k,
            cache_type_v=config.cache_type_v,
            cache_ram_mib=config.cache_ram_mib if config.prompt_cache else 0,
            rs_snapshots=min(drafts, 8),
            embeddings=embeddings,
        )
        return cls(name, config, kind, cost, keep_alive, pinned, tuple(aliases))


def _parts(path: Path) -> list[Path]:
    """A model's files: every part of a split model, else the file."""
    found = re.match(r"^(.*)-00001-of-(\d{5})\.gguf$", path.name, re.IGNORECASE)
    if found is None:
        return [path]
    total = int(found[2])
    return [path.with_name(f"{found[1]}-{i:05d}-of-{found[2]}.gguf") for i in range(1, total + 1)]


class ModelLoadFailed(Exception):
    """A model could not be loaded (or is within its back-off after a failure)."""

    def __init__(self, model: str, reason: str, retry_after: float | None = None) -> None:
        super().__init__(f"{model}: {reason}")
        self.model = model
        self.reason = reason
        self.retry_after = retry_after

    def error(self) -> ApiError:
        retry = None if self.retry_after is None else max(1, math.ceil(self.retry_after))
        return model_load_failed(self.model, self.reason, retry)
