"""Which catalog models are loaded: the memory budget, keep-alive and eviction, pure.

:class:`LoadPolicy` is a state machine fed with what happened (a model wanted, a load done
or failed, a request begun or ended, an unload done, the time) and asked what to do next
(:meth:`LoadPolicy.step`: models to load, models to unload, wants to refuse). The worker
does the I/O; nothing here awaits or loads.

Each model is ``loading``, ``loaded`` or ``unloading``, or absent (unloaded). Its estimated
cost (:func:`estimate_cost`) is reserved from the moment its load starts until its unload
is done, so what is reserved never exceeds ``memory_bytes``, nor the models reserved
``max_models``. Wants are served first come, first served: the oldest want that does not
fit makes the least recently used idle models (no request in flight, not pinned) unload
until it fits, and those after it wait (no want overtakes, so none starves). A model with a
request in flight is never unloaded, nor one just loaded before it served a request (for
``GRACE_S``: the requests it was loaded for are on their way to it); while only such
models stand in the way, the want waits. A want that could never fit (the budget less
the pinned models is too small) is refused at once, naming the figures.

Keep-alive: an idle model unloads when the ``keep_alive`` of its last request (else the
model's own, else the default) has run out; 0 unloads it as its last request ends. A
pinned model (``--model``, ``keep_alive = -1`` in the models file) ignores a client's
``keep_alive`` and is never evicted.

A failed load is remembered: wants for the model are refused with its reason until a
back-off (1 s, doubling to 5 minutes) has passed, so a broken file is not reloaded in a loop.
A loaded model whose engine dies (:meth:`LoadPolicy.failed`) starts unloading at once, even
with requests in flight (they fail and end; its unload waits for them), and is backed off as
a failed load is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import attrs

__all__ = [
    "MIB",
    "Actions",
    "LoadPolicy",
    "ModelCost",
    "ModelState",
    "Refusal",
    "estimate_cost",
]

MIB = 1 << 20
ModelState = Literal["loading", "loaded", "unloading"]
#: How long a model just loaded, that has served no request yet, is safe from eviction (so
#: that the requests it was loaded for reach it before another want takes its room).
GRACE_S = 10.0
#: The first back-off after a failed load, and the longest.
BACKOFF_S = (1.0, 300.0)

#: Bytes per K or V element by cache type (ggml's q8_0 is 34 bytes per 32, q4_0 18).
_CACHE_BYTES = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


@attrs.frozen
class ModelCost:
    """A model's estimated memory, in bytes, by part (``ps`` shows them)."""

    weights: int
    kv_cache: int = 0
    recurrent: int = 0
    prompt_cache: int = 0
    buffers: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.recurrent + self.prompt_cache + self.buffers


def _int(metadata: Mapping[str, Any], key: str, default: int = 0) -> int:
    value = metadata.get(key, default)
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


def estimate_cost(
    metadata: Mapping[str, Any],
    weights_bytes: int,
    *,
    slots: int,
    ctx_size: int,
    n_batch: int,
    cache_type_k: str = "f16",
    cache_type_v: str = "f16",
    cache_ram_mib: int = 0,
    rs_snapshots: int = 0,
    embeddings: bool = False,
) -> ModelCost:
    """The memory a model takes loaded with these settings, from its GGUF header's
    ``metadata`` and its files' size ``weights_bytes`` (all split parts).

    An estimate, stated as such: the K and V cache is every attention layer's
    ``head_count_kv x key_length`` (``value_length``) per cell, ``slots x ctx_size`` cells
    (an embedding context: ``n_batch``), at the cache type's bytes; a model with recurrent
    state (``ssm.*`` keys) keeps a conv and an SSM state per slot and per rollback snapshot
    (f32), and when ``full_attention_interval`` says which layers attend only those have a
    KV cache (else every layer is counted for both: an over-estimate); the prompt cache its
    ``cache_ram_mib``; llama.cpp's compute and output buffers about ``n_batch`` rows of
    logits and sixteen of activations (f32).
    """
    arch = str(metadata.get("general.architecture", ""))

    def key(name: str, default: int = 0) -> int:
        return _int(metadata, f"{arch}.{name}", default)

    layers = key("block_count")
    n_embd = key("embedding_length")
    heads = key("attention.head_count", 1) or 1
    heads_kv = key("attention.head_count_kv", heads) or heads
    k_len = key("attention.key_length", n_embd // heads)
    v_len = key("attention.value_length", n_embd // heads)
    recurrent_layers = 0
    if key("ssm.inner_size"):
        interval = key("full_attention_interval")
        attention_layers = layers // interval if interval else layers
        recurrent_layers = layers - attention_layers if interval else layers
    else:
        attention_layers = layers
    cells = n_batch if embeddings else slots * ctx_size
    per_cell = heads_kv * (k_len * _CACHE_BYTES[cache_type_k] + v_len * _CACHE_BYTES[cache_type_v])
    kv = math.ceil(attention_layers * cells * per_cell)
    recurrent = 0
    if recurrent_layers:
        inner, state = key("ssm.inner_size"), key("ssm.state_size")
        groups, kernel = key("ssm.group_count", 1), key("ssm.conv_kernel", 4)
        conv = (kernel - 1) * (inner + 2 * groups * state)
        ssm = state * inner
        recurrent = recurrent_layers * slots * (1 + rs_snapshots) * (conv + ssm) * 4
    vocab = _int(metadata, f"{arch}.vocab_size") or _vocab_size(metadata)
    outputs = 0 if embeddings else n_batch * vocab * 4
    buffers = outputs + n_batch * n_embd * 4 * 16
    return ModelCost(
        weights=weights_bytes,
        kv_cache=kv,
        recurrent=recurrent,
        prompt_cache=0 if embeddings else cache_ram_mib * MIB,
        buffers=buffers,
    )


def _vocab_size(metadata: Mapping[str, Any]) -> int:
    tokens = metadata.get("tokenizer.ggml.tokens")
    count = getattr(tokens, "count", 0)
    return int(count) if isinstance(count, int) else 0


@attrs.frozen
class Refusal:
    """A want that is refused: the model and why (the clients' error names both)."""

    model: str
    reason: str
    retry_after: float | None = None


@attrs.frozen
class Actions:
    """What :meth:`LoadPolicy.step` asks for: start these loads, start these unloads,
    answer these wants with an error."""

    load: tuple[str, ...] = ()
    unload: tuple[str, ...] = ()
    refuse: tuple[Refusal, ...] = ()


@attrs.define
class _Model:
    state: ModelState
    cost: int
    pinned: bool
    keep_alive: float
    inflight: int = 0
    last_used: float = 0.0
    expires: float = math.inf
    served: bool = False


@attrs.define
class _Failure:
    reason: str
    count: int
    until: float


@attrs.define
class LoadPolicy:
    """The loaded set of one worker and what to load or unload next (see the module).

    ``max_models`` and ``memory_bytes`` bound the models reserved (0: no bound);
    ``default_keep_alive`` is ``--keep-alive`` in seconds.
    """

    max_models: int = 0
    memory_bytes: int = 0
    default_keep_alive: float = 300.0
    _models: dict[str, _Model] = attrs.field(factory=dict)
    _wants: dict[str, tuple[int, bool, float | None]] = attrs.field(factory=dict)
    _failures: dict[str, _Failure] = attrs.field(factory=dict)
    _now: float = 0.0

    # -- what the worker reads ---------------------------------------------------------------

    def state(self, name: str) -> ModelState | None:
        model = self._models.get(name)
        return None if model is None else model.state

    def wanted(self, name: str) -> bool:
        return name in self._wants

    @property
    def reserved(self) -> int:
        """The bytes reserved by every model loading, loaded or unloading."""
        return sum(model.cost for model in self._models.values())

    def loaded_count(self) -> int:
        return sum(1 for model in self._models.values() if model.state == "loaded")

    @property
    def free(self) -> int | None:
        """The bytes a load could still have without evicting (``None``: no budget)."""
        return None if not self.memory_bytes else max(0, self.memory_bytes - self.reserved)

    def inflight(self, name: str) -> int:
        model = self._models.get(name)
        return 0 if model is None else model.inflight

    def expires(self, name: str) -> float:
        """When the idle model unloads (``inf``: not while idle, or it is busy)."""
        model = self._models.get(name)
        return math.inf if model is None or model.inflight else model.expires

    def next_expiry(self) -> float:
        """The soonest time an idle loaded model runs out of keep-alive (``inf``: none)."""
        return min(
            (m.expires for m in self._models.values() if m.state == "loaded" and not m.inflight),
            default=math.inf,
        )

    # -- what happened ----------------------------------------------------------------------

    def pin(self, name: str, cost: int, now: float) -> None:
        """A model loaded outside the policy (``--model``, at start): counted in the budget,
        never unloaded."""
        self._models[name] = _Model("loaded", cost, True, math.inf, last_used=now, served=True)

    def want(
        self,
        name: str,
        cost: int,
        now: float,
        *,
        pinned: bool = False,
        keep_alive: float | None = None,
    ) -> Refusal | None:
        """A request needs ``name`` loaded (its estimated ``cost`` in bytes, its own
        ``keep_alive`` from the catalog, ``None``: the default). A model loading or loaded
        already joins (nothing to do); one whose last load failed within its back-off is
        refused with that failure; else it waits for :meth:`step`."""
        model = self._models.get(name)
        if model is not None and model.state != "unloading":
            return None
        failure = self._failures.get(name)
        if failure is not None and failure.until > now:
            return Refusal(name, failure.reason, retry_after=failure.until - now)
        self._wants.setdefault(name, (cost, pinned, keep_alive))
        return None

    def loaded(self, name: str, now: float, error: str | None = None) -> None:
        """A load ended: the model is loaded, or (``error``) it is not and its memory is
        freed; wants for it within the back-off are refused with ``error``."""
        model = self._models.get(name)
        if model is None or model.state != "loading":
            raise ValueError(f"{name} is not loading")
        if error is None:
            model.state = "loaded"
            model.last_used = now
            model.expires = now + model.keep_alive
            self._failures.pop(name, None)
            return
        del self._models[name]
        self._back_off(name, error, now)

    def failed(self, name: str, now: float, error: str) -> None:
        """The loaded model's engine died (its decode loop): it starts unloading at once,
        whatever is in flight (those requests fail, and end), and wants for it are refused
        with ``error`` within the back-off, as after a failed load."""
        model = self._models.get(name)
        if model is None or model.state != "loaded":
            raise ValueError(f"{name} is not loaded")
        model.state = "unloading"
        self._back_off(name, error, now)

    def _back_off(self, name: str, error: str, now: float) -> None:
        failure = self._failures.get(name)
        count = 1 if failure is None else failure.count + 1
        delay = min(BACKOFF_S[0] * 2 ** (count - 1), BACKOFF_S[1])
        self._failures[name] = _Failure(error, count, now + delay)

    def begin(self, name: str, now: float) -> None:
        """A request starts on the loaded model (it cannot be unloaded until it ends)."""
        model = self._models.get(name)
        if model is None or model.state != "loaded":
            raise ValueError(f"{name} is not loaded")
        model.inflight += 1
        model.last_used = now
        model.served = True

    def end(self, name: str, now: float, keep_alive: float | None = None) -> None:
        """A request on ``name`` ended; its ``keep_alive`` (seconds, ``inf``: for ever;
        ``None``: the model's) sets when the idle model unloads, unless it is pinned."""
        model = self._models[name]
        if model.inflight < 1:
            raise ValueError(f"no request in flight on {name}")
        model.inflight -= 1
        model.last_used = now
        alive = model.keep_alive if keep_alive is None or model.pinned else keep_alive
        model.expires = now + alive

    def unloaded(self, name: str) -> None:
        """An unload is done: the model's memory is free (no request may be in flight on
        it: a failed model unloads once its failed requests have ended)."""
        model = self._models.get(name)
        if model is None or model.state != "unloading":
            raise ValueError(f"{name} is not unloading")
        if model.inflight:
            raise ValueError(f"{name} has requests in flight")
        del self._models[name]

    def unload(self, name: str) -> bool:
        """An operator's unload (``POST /models/unload``): an idle loaded model starts
        unloading (``True``); a busy, pinned or absent one does not."""
        model = self._models.get(name)
        if model is None or model.state != "loaded" or model.inflight or model.pinned:
            return False
        model.state = "unloading"
        return True

    # -- what to do next ----------------------------------------------------------------------

    def step(self, now: float) -> Actions:
        """Decide: idle models whose keep-alive ran out unload; then the wants, oldest
        first, load where they fit, make LRU idle models unload where they would fit, or
        are refused where they never could."""
        self._now = now
        unload = [
            name
            for name, model in self._models.items()
            if model.state == "loaded" and not model.inflight and model.expires <= now
        ]
        for name in unload:
            self._models[name].state = "unloading"
        load: list[str] = []
        refuse: list[Refusal] = []
        for name, (cost, pinned, keep_alive) in list(self._wants.items()):
            if name in self._models:  # unloading still: wait for it
                break
            never = self._never_fits(cost)
            if never is not None:
                del self._wants[name]
                refuse.append(Refusal(name, never))
                continue
            if self._fits(cost, 1):
                del self._wants[name]
                alive = math.inf if pinned else self.default_keep_alive
                if keep_alive is not None:
                    alive = keep_alive
                self._models[name] = _Model("loading", cost, pinned or alive == math.inf, alive)
                load.append(name)
                continue
            victims = self._victims(cost, now)
            for victim in victims:
                self._models[victim].state = "unloading"
            unload += victims
            break  # the oldest want waits for its room; none overtakes it
        return Actions(tuple(load), tuple(unload), tuple(refuse))

    def _fits(self, cost: int, more: int, freed: int = 0, gone: int = 0) -> bool:
        count_ok = not self.max_models or len(self._models) - gone + more <= self.max_models
        bytes_ok = not self.memory_bytes or self.reserved - freed + cost <= self.memory_bytes
        return count_ok and bytes_ok

    def _never_fits(self, cost: int) -> str | None:
        pinned = [m for m in self._models.values() if m.pinned]
        held = sum(m.cost for m in pinned)
        if self.max_models and len(pinned) >= self.max_models:
            return (
                f"--max-loaded-models {self.max_models} are all pinned models: none can be "
                "unloaded to make room"
            )
        if self.memory_bytes and held + cost > self.memory_bytes:
            return (
                f"it needs about {cost / MIB:.0f} MiB, and the memory budget of "
                f"{self.memory_bytes / MIB:.0f} MiB has {(self.memory_bytes - held) / MIB:.0f} "
                "MiB beside the pinned models"
            )
        return None

    def _victims(self, cost: int, now: float) -> list[str]:
        """The least recently used idle models whose unloading makes ``cost`` fit, or none
        when even all of them would not (the want waits for requests in flight to end;
        models unloading already count as freed)."""
        freed = sum(m.cost for m in self._models.values() if m.state == "unloading")
        gone = sum(1 for m in self._models.values() if m.state == "unloading")
        if self._fits(cost, 1, freed, gone):
            return []  # room is on its way
        idle = sorted(
            (
                (model.last_used, name)
                for name, model in self._models.items()
                if model.state == "loaded"
                and not model.inflight
                and not model.pinned
                and (model.served or now >= model.last_used + GRACE_S)
            ),
        )
        chosen = []
        for _, name in idle:
            chosen.append(name)
            freed += self._models[name].cost
            gone += 1
            if self._fits(cost, 1, freed, gone):
                return chosen
        return []
