"""The budget and eviction policy (``llmtrio.worker._load_policy``), pure: a hypothesis state
machine drives wants, loads, requests, engines dying, unloads and time through it and checks
that no model is unloaded while a request runs on it (a dead engine's model unloads once its
requests have ended), the budget is never exceeded, a pinned model is never evicted, and every
waiting request is answered; then the cost estimate."""

from __future__ import annotations

import math

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from llmtrio.worker._load_policy import GRACE_S, MIB, Actions, LoadPolicy, estimate_cost

COSTS = {"a": 300, "b": 500, "c": 200, "d": 800, "huge": 5000}
PINNED = "p"
NAMES = st.sampled_from(sorted(COSTS))


class Policy(RuleBasedStateMachine):
    """A worker's view: requests wait on a model's load, run on it once loaded, end."""

    @initialize(
        budget=st.sampled_from([0, 1000, 1300]),
        max_models=st.sampled_from([0, 1, 2, 3]),
        pinned=st.booleans(),
    )
    def start(self, budget: int, max_models: int, pinned: bool) -> None:
        self.policy = LoadPolicy(max_models=max_models, memory_bytes=budget, default_keep_alive=5)
        self.now = 0.0
        self.waiting: dict[str, int] = {}  # requests waiting on a load, by model
        self.running: dict[str, int] = {}
        self.answered_with_error = 0
        self.dead: set[str] = set()  # engines that died, unloading once their requests end
        self.pinned = pinned and max_models != 1
        if self.pinned:
            assert self.policy.want(PINNED, 100, self.now, pinned=True) is None
            self.apply(self.policy.step(self.now))
            assert self.policy.state(PINNED) == "loading"
            self.policy.loaded(PINNED, self.now)

    def apply(self, actions: Actions) -> None:
        for name in actions.unload:
            assert self.running.get(name, 0) == 0, f"{name} unloaded with requests in flight"
            assert name != PINNED, "a pinned model was evicted"
        for refusal in actions.refuse:
            self.answered_with_error += self.waiting.pop(refusal.model, 0)

    @rule(name=NAMES, keep_alive=st.sampled_from([None, 0.0, 3.0, math.inf]))
    def request(self, name: str, keep_alive: float | None) -> None:
        state = self.policy.state(name)
        if state == "loaded":
            self.policy.begin(name, self.now)
            self.running[name] = self.running.get(name, 0) + 1
            return
        refusal = self.policy.want(name, COSTS[name], self.now, keep_alive=keep_alive)
        if refusal is not None:
            assert refusal.model == name and refusal.reason
            self.answered_with_error += 1
            return
        self.waiting[name] = self.waiting.get(name, 0) + 1
        self.apply(self.policy.step(self.now))

    @rule(name=NAMES, ok=st.booleans())
    def load_done(self, name: str, ok: bool) -> None:
        if self.policy.state(name) != "loading":
            return
        self.policy.loaded(name, self.now, None if ok else "a corrupt file")
        waiters = self.waiting.pop(name, 0)
        if ok:
            for _ in range(waiters):
                self.policy.begin(name, self.now)
            self.running[name] = self.running.get(name, 0) + waiters
        else:
            self.answered_with_error += waiters
        self.apply(self.policy.step(self.now))

    @rule(name=NAMES, keep_alive=st.sampled_from([None, 0.0, 2.0, math.inf]))
    def request_ends(self, name: str, keep_alive: float | None) -> None:
        if not self.running.get(name):
            return
        self.running[name] -= 1
        self.policy.end(name, self.now, keep_alive)
        self.apply(self.policy.step(self.now))

    @rule(name=NAMES)
    def engine_dies(self, name: str) -> None:
        """Its decode loop fails: it unloads once what runs on it has ended."""
        if self.policy.state(name) != "loaded":
            return
        self.policy.failed(name, self.now, "the decode loop failed")
        self.dead.add(name)
        self.apply(self.policy.step(self.now))

    @rule(name=NAMES)
    def unload_done(self, name: str) -> None:
        if self.policy.state(name) != "unloading" or self.running.get(name):
            return
        self.policy.unloaded(name)
        self.dead.discard(name)
        self.apply(self.policy.step(self.now))

    @rule(seconds=st.sampled_from([0.5, 2.0, 11.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds
        self.apply(self.policy.step(self.now))

    @precondition(lambda self: self.pinned)
    @rule(keep_alive=st.sampled_from([0.0, 1.0]))
    def a_client_asks_the_pinned_model_to_go(self, keep_alive: float) -> None:
        self.policy.begin(PINNED, self.now)
        self.policy.end(PINNED, self.now, keep_alive)
        self.now += 2
        self.apply(self.policy.step(self.now))
        assert self.policy.state(PINNED) == "loaded"
        assert not self.policy.unload(PINNED)

    @invariant()
    def within_the_budget(self) -> None:
        if not hasattr(self, "policy"):
            return
        policy = self.policy
        if policy.memory_bytes:
            assert policy.reserved <= policy.memory_bytes
        held = [n for n in [*COSTS, PINNED] if policy.state(n) is not None]
        if policy.max_models:
            assert len(held) <= policy.max_models
        for name, count in self.running.items():
            if count:
                # Only a dead engine's requests run on a model that is not loaded.
                assert policy.state(name) == ("unloading" if name in self.dead else "loaded")
                assert policy.inflight(name) == count

    def teardown(self) -> None:
        """Every request ends and every load and unload completes: then every request that
        waited has been answered (run, or refused with a reason)."""
        if not hasattr(self, "policy"):
            return
        for _ in range(4 * len(COSTS)):
            for name, count in list(self.running.items()):
                for _ in range(count):
                    self.policy.end(name, self.now)
                self.running[name] = 0
            for name in [*COSTS, PINNED]:
                if self.policy.state(name) == "loading":
                    self.load_done(name, ok=True)
                elif self.policy.state(name) == "unloading":
                    self.unload_done(name)
            self.time_passes(GRACE_S + 1)
        assert not any(self.waiting.values()), f"requests never answered: {self.waiting}"
        assert not any(self.policy.wanted(name) for name in COSTS)


Policy.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestPolicy = Policy.TestCase


def test_the_least_recently_used_idle_model_makes_room() -> None:
    policy = LoadPolicy(max_models=2, default_keep_alive=60)
    for at, name in enumerate(("a", "b")):
        policy.want(name, 1, float(at))
        assert policy.step(float(at)).load == (name,)
        policy.loaded(name, float(at))
        policy.begin(name, float(at))
        policy.end(name, float(at))
    policy.begin("b", 5.0)  # b is busy, a is idle and older
    policy.want("c", 1, 6.0)
    assert policy.step(6.0) == Actions(unload=("a",))
    assert policy.step(6.0) == Actions()  # c waits for a's memory
    policy.unloaded("a")
    assert policy.step(7.0).load == ("c",)
    policy.loaded("c", 8.0)
    policy.want("a", 1, 8.0)  # b busy, c just loaded and not yet used: a waits
    assert policy.step(8.0) == Actions()
    policy.end("b", 9.0)
    assert policy.step(9.0) == Actions(unload=("b",))


def test_keep_alive_a_request_sets_when_the_idle_model_unloads() -> None:
    policy = LoadPolicy(default_keep_alive=300)
    policy.want("a", 1, 0.0)
    policy.step(0.0)
    policy.loaded("a", 0.0)
    assert policy.next_expiry() == 300.0
    policy.begin("a", 1.0)
    assert policy.step(1000.0) == Actions()  # busy: never unloaded
    policy.end("a", 1000.0, keep_alive=0.0)
    assert policy.step(1000.0) == Actions(unload=("a",))
    policy.unloaded("a")
    policy.want("a", 1, 1001.0, keep_alive=math.inf)  # the models file's -1: pinned
    policy.step(1001.0)
    policy.loaded("a", 1001.0)
    policy.begin("a", 1001.0)
    policy.end("a", 1001.0, keep_alive=0.0)
    assert policy.step(1e9) == Actions() and not policy.unload("a")


def test_a_failed_load_backs_off_then_tries_again() -> None:
    policy = LoadPolicy()
    policy.want("a", 1, 0.0)
    policy.step(0.0)
    policy.loaded("a", 0.0, error="not a GGUF file")
    refusal = policy.want("a", 1, 0.5)
    assert refusal is not None and refusal.reason == "not a GGUF file"
    assert refusal.retry_after == pytest.approx(0.5)
    assert policy.want("a", 1, 1.0) is None and policy.step(1.0).load == ("a",)
    policy.loaded("a", 1.0, error="not a GGUF file")
    assert policy.want("a", 1, 2.5) is not None  # the second back-off is 2 s
    assert policy.want("a", 1, 3.0) is None


def test_a_model_whose_engine_dies_unloads_once_its_requests_end_and_backs_off() -> None:
    policy = LoadPolicy(default_keep_alive=60)
    policy.want("a", 1, 0.0)
    policy.step(0.0)
    policy.loaded("a", 0.0)
    policy.begin("a", 1.0)
    policy.failed("a", 2.0, "the decode loop failed")
    assert policy.state("a") == "unloading"
    with pytest.raises(ValueError, match="in flight"):
        policy.unloaded("a")  # its failed request has not ended yet
    policy.end("a", 2.5)
    policy.unloaded("a")
    refusal = policy.want("a", 1, 2.5)
    assert refusal is not None and refusal.reason == "the decode loop failed"
    assert policy.want("a", 1, 3.0) is None and policy.step(3.0).load == ("a",)


def test_a_model_that_never_fits_is_refused_at_once() -> None:
    policy = LoadPolicy(memory_bytes=1000 * MIB)
    policy.want("p", 600 * MIB, 0.0, pinned=True)
    policy.step(0.0)
    policy.loaded("p", 0.0)
    policy.want("big", 500 * MIB, 0.0)
    (refusal,) = policy.step(0.0).refuse
    assert refusal.model == "big"
    assert "500 MiB" in refusal.reason and "400 MiB beside the pinned" in refusal.reason
    assert not policy.wanted("big")


# -- the cost estimate -----------------------------------------------------------------------

GEMMA = {
    "general.architecture": "gemma3",
    "gemma3.embedding_length": 640,
    "gemma3.block_count": 18,
    "gemma3.attention.head_count": 4,
    "gemma3.attention.head_count_kv": 1,
    "gemma3.attention.key_length": 256,
    "gemma3.attention.value_length": 256,
}


def test_the_kv_cache_follows_the_settings() -> None:
    def cost(**settings: object) -> int:
        merged: dict[str, object] = {"slots": 4, "ctx_size": 4096, "n_batch": 512, **settings}
        return estimate_cost(GEMMA, 253 * MIB, **merged).kv_cache  # type: ignore[arg-type]

    # 18 layers x 16384 cells x (256 + 256) x 2 bytes
    assert cost() == 18 * 4 * 4096 * 512 * 2 == 288 * MIB
    assert cost(cache_type_k="q8_0", cache_type_v="q8_0") == 288 * MIB * 34 // 64
    assert cost(ctx_size=2048) == cost() // 2
    full = estimate_cost(GEMMA, 253 * MIB, slots=4, ctx_size=4096, n_batch=512, cache_ram_mib=64)
    assert full.weights == 253 * MIB and full.prompt_cache == 64 * MIB
    assert full.total == full.weights + full.kv_cache + full.prompt_cache + full.buffers
    assert full.recurrent == 0 and full.buffers > 0


def test_recurrent_state_per_slot_and_snapshot() -> None:
    hybrid = {
        "general.architecture": "qwen35",
        "qwen35.embedding_length": 256,
        "qwen35.block_count": 4,
        "qwen35.full_attention_interval": 4,
        "qwen35.attention.head_count": 2,
        "qwen35.attention.head_count_kv": 2,
        "qwen35.attention.key_length": 128,
        "qwen35.attention.value_length": 128,
        "qwen35.ssm.inner_size": 256,
        "qwen35.ssm.state_size": 128,
        "qwen35.ssm.group_count": 2,
        "qwen35.ssm.conv_kernel": 4,
    }
    one = estimate_cost(hybrid, 0, slots=1, ctx_size=256, n_batch=64)
    assert one.kv_cache == 1 * 256 * 2 * 256 * 2  # one attention layer of four
    per_layer = (3 * (256 + 2 * 2 * 128) + 128 * 256) * 4
    assert one.recurrent == 3 * per_layer
    snapshots = estimate_cost(hybrid, 0, slots=2, ctx_size=256, n_batch=64, rs_snapshots=8)
    assert snapshots.recurrent == 2 * 9 * one.recurrent
