"""Prefix affinity: what a request's prompt begins with, as digests both the ingress and the
workers compute from its body (``llmtrio.api.prefixes_of``); the digests a worker's heartbeat
states (on the wire, optional); and the ring core's preference, among the claimants that may
take a stream, for the one holding the longest of its prefixes, within a slack of load, and
only then (sans-IO: no trio, no sockets)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmtrio.api import CHAT_PATH, COMPLETIONS_PATH, MESSAGES_PATH, RESPONSES_PATH, prefixes_of
from llmtrio.ring import (
    Assign,
    Attach,
    Claim,
    Heartbeat,
    ProtocolError,
    ResponseEnd,
    ResponseHead,
    RingCore,
    ToWorker,
    encode,
)
from llmtrio.worker._held_prefixes import PrefixLog

from .._helpers import HEAD
from .test_ring_protocol import decode_all

SYSTEM = [
    {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197; cch=1a2b3;"},
    {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}},
]
TOOLS = [{"name": "Read", "input_schema": {"type": "object"}}]


def body(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def digests(path: str, data: bytes) -> list[str]:
    return [prefix.digest for prefix in prefixes_of(path, data)]


# -- the digests -------------------------------------------------------------------------------


def test_a_next_turn_begins_with_the_previous_requests_whole_prompt() -> None:
    turn1 = [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {}}]}]
    turn2 = [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},  # its mark moved on
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": [{"type": "text", "text": "more", "cache_control": {}}]},
    ]
    one = prefixes_of(MESSAGES_PATH, body(model="a", system=SYSTEM, tools=TOOLS, messages=turn1))
    two = prefixes_of(MESSAGES_PATH, body(model="b", system=SYSTEM, tools=TOOLS, messages=turn2))
    assert [len(one), len(two)] == [2, 4]  # the head, then one a message
    assert two[: len(one)] == one  # its first two links are the first turn's whole chain
    assert [p.size for p in two] == sorted(p.size for p in two)
    # another billing stamp is the same prompt; another system prompt is another head
    stamped = [{**SYSTEM[0], "text": "x-anthropic-billing-header: cch=ffff;"}, SYSTEM[1]]
    again = body(system=stamped, tools=TOOLS, messages=turn1)
    assert digests(MESSAGES_PATH, again) == [p.digest for p in one]
    other = body(system="You are a poet.", tools=TOOLS, messages=turn1)
    assert not set(digests(MESSAGES_PATH, other)) & {p.digest for p in one}


def test_claude_codes_own_next_turn_begins_with_its_first_requests_chain() -> None:
    """Claude Code 2.1.197's captured first body (tests/data/clients), and its next turn as
    Claude Code sends it: the answer and a question appended, the ``cache_control`` mark
    moved to the newest message, another billing stamp."""
    captured = Path(__file__).parents[1] / "data" / "clients" / "claude-code-2.1.197.messages.json"
    (request,) = json.loads(captured.read_text())["requests"]
    first = request["body"]
    second = copy.deepcopy(first)
    del second["messages"][0]["content"][-1]["cache_control"]
    stamp = second["system"][0]
    assert stamp["text"].startswith("x-anthropic-billing-header:")
    stamp["text"] = "x-anthropic-billing-header: cc_version=2.1.197.456; cc_entrypoint=sdk-cli;"
    second["messages"] += [
        {"role": "assistant", "content": [{"type": "text", "text": "Hi!"}]},
        {
            "role": "user",
            "content": [{"type": "text", "text": "List the files.", "cache_control": {}}],
        },
    ]
    one = prefixes_of(MESSAGES_PATH, json.dumps(first).encode())
    two = prefixes_of(MESSAGES_PATH, json.dumps(second).encode())
    assert len(one) == 1 + len(first["messages"])
    assert two[: len(one)] == one and len(two) == len(one) + 2
    assert one[0].size > 50_000  # the head: its 24 tools and its system prompt


def test_every_generation_route_has_a_chain_and_the_others_none() -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    chat = digests(CHAT_PATH, body(messages=messages))
    assert len(chat) == 3
    responses = digests(RESPONSES_PATH, body(instructions="Be brief.", input="hi"))
    assert len(responses) == 2
    # the same parts in another family are another prompt
    assert not set(chat) & set(digests(RESPONSES_PATH, body(input=messages)))
    prompt = "x" * 2500
    blocks = prefixes_of(COMPLETIONS_PATH, body(prompt=prompt))
    assert [p.size for p in blocks] == [1024, 2048, 2500]
    longer = prefixes_of(COMPLETIONS_PATH, body(prompt=prompt + "y" * 100))
    assert longer[:2] == blocks[:2] and longer[2] != blocks[2]
    assert prefixes_of("/v1/embeddings", body(input="hi")) == ()
    assert prefixes_of(CHAT_PATH, b"not json") == prefixes_of(CHAT_PATH, b"[1]") == ()


def test_a_link_states_the_head_and_the_whole_of_what_it_serves() -> None:
    log = PrefixLog(size=4)
    first = body(messages=[{"role": "user", "content": "a"}])
    assert log.serving(CHAT_PATH, first)
    assert not log.serving(CHAT_PATH, first)  # nothing new to state
    chain = digests(CHAT_PATH, first)
    assert log.held() == (chain[-1], chain[0])
    for i in range(3):
        log.serving(CHAT_PATH, body(messages=[{"role": "user", "content": str(i)}]))
    held = log.held()
    assert len(held) == 4 and chain[-1] not in held  # the oldest went
    assert chain[0] in held  # the shared head, noted again each time: kept


# -- the wire ----------------------------------------------------------------------------------


def test_a_heartbeat_carries_the_prefixes_only_when_it_holds_some() -> None:
    beat = Heartbeat(1, 4, 3, prefixes=("00aa", "11bb"))
    assert decode_all(encode(beat)) == [beat]
    assert b"prefixes" not in encode(Heartbeat(1, 4, 3))  # as the previous version
    with pytest.raises(ValueError, match="at most 256"):
        Heartbeat(1, 4, 3, prefixes=tuple(f"{i:x}" for i in range(257)))
    with pytest.raises(ValueError, match="a digest of 1 to 64"):
        Heartbeat(1, 4, 3, prefixes=("",))
    frame = encode(beat).replace(b'"11bb"', b"123456")  # the same length: a number
    with pytest.raises(ProtocolError, match="list of strings"):
        decode_all(frame)


# -- the core's choice -------------------------------------------------------------------------


def core_with(*workers: str, slots: int = 4) -> RingCore:
    core = RingCore(max_streams=64)
    for worker in workers:
        core.attach(Attach(worker, slots, models=("m",)))
    return core


def assigned_to(effects: list[object]) -> list[str]:
    return [
        effect.worker_id
        for effect in effects
        if isinstance(effect, ToWorker) and isinstance(effect.message, Assign)
    ]


def holds(core: RingCore, worker: str, *digests: str) -> None:
    core.heartbeat(worker, Heartbeat(0, 4, 4, prefixes=digests))


def park(core: RingCore, *prefixes: tuple[str, int]) -> tuple[int, list[str]]:
    stream_id, effects = core.park(HEAD, b"{}", key="m", prefixes=prefixes)
    return stream_id, assigned_to(effects)


def finish(core: RingCore, worker: str, stream_id: int) -> None:
    core.respond(worker, ResponseHead(stream_id, 200))
    core.respond(worker, ResponseEnd(stream_id))


def test_the_claimant_holding_the_longest_prefix_takes_the_stream() -> None:
    core = core_with("a", "b", "c")
    for worker in ("a", "b", "c"):
        core.claim(worker, Claim(2, model="m"))
    holds(core, "b", "head", "turn1")
    holds(core, "c", "head")
    # a is first in turn; b holds the longest prefix
    _, to = park(core, ("head", 100), ("turn1", 900), ("turn2", 1000))
    assert to == ["b"]
    # only the head: held by b and c alike, the turn decides between them (c is ahead of b
    # now: b just took a stream)
    _, to = park(core, ("head", 100), ("other", 300))
    assert to == ["c"]
    # none held: round-robin as without (a's turn)
    _, to = park(core, ("x", 10))
    assert to == ["a"]


def test_a_busy_holder_gives_way_beyond_the_slack() -> None:
    core = core_with("a", "b", slots=8)
    core.claim("a", Claim(8, model="m"))
    core.claim("b", Claim(8, model="m"))
    holds(core, "a", "p")
    taken = [park(core, ("p", 500)) for _ in range(6)]
    # a takes them while it holds no more than the slack (2) beyond b's none: three
    assert [to for _, to in taken] == [["a"], ["a"], ["a"], ["b"], ["a"], ["b"]]
    # as a's streams end, it is preferred again
    for stream_id, to in taken:
        if to == ["a"]:
            finish(core, "a", stream_id)
    core.claim("a", Claim(4, model="m"))
    assert park(core, ("p", 500))[1] == ["a"]


def test_a_claim_takes_the_oldest_parked_stream_whatever_it_holds() -> None:
    core = core_with("a", "b")
    holds(core, "a", "p")
    first, _ = park(core, ("q", 10))
    second, _ = park(core, ("p", 10))
    effects = core.claim("b", Claim(1, model="m"))  # b holds nothing: takes the oldest
    assert [(e.worker_id, e.message.stream_id) for e in effects if isinstance(e, ToWorker)] == [
        ("b", first)
    ]
    assert assigned_to(core.claim("a", Claim(1, model="m"))) == ["a"]
    assert core.state(second) is not None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["park", "claim", "end", "beat"]),
            st.integers(0, 2),
            st.sets(st.sampled_from(["p", "q", "r"]), max_size=2),
        ),
        max_size=40,
    )
)
def test_no_stream_waits_beside_a_claim_that_could_take_it(
    steps: list[tuple[str, int, set[str]]],
) -> None:
    """Affinity changes who takes a stream, never whether: after any steps, no stream is
    parked while a worker has an unfilled claim for its model."""
    workers = ["a", "b", "c"]
    core = core_with(*workers)
    held: dict[str, list[int]] = {w: [] for w in workers}
    for action, index, names in steps:
        worker = workers[index]
        effects: list[object] = []
        if action == "park":
            _, effects = core.park(
                HEAD, b"{}", key="m", prefixes=[(name, i) for i, name in enumerate(names)]
            )
        elif action == "claim":
            stats = {w.worker_id: w for w in core.stats().workers}[worker]
            if stats.waiting_claims + len(stats.held) < 4:
                effects = core.claim(worker, Claim(1, model="m"))
        elif action == "end" and held[worker]:
            finish(core, worker, held[worker].pop(0))
        elif action == "beat":
            effects = core.heartbeat(worker, Heartbeat(0, 4, 4, prefixes=tuple(names)))
        for effect in effects:
            if isinstance(effect, ToWorker) and isinstance(effect.message, Assign):
                held[effect.worker_id].append(effect.message.stream_id)
        stats = core.stats()
        assert not (stats.parked and any(w.waiting_claims for w in stats.workers))
