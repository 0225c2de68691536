"""The pure text stages: UTF-8 assembly, stop strings, think blocks."""

from __future__ import annotations

import pytest

from llmtrio.engine.generate._text import StopMatcher, ThinkSplitter, Utf8Assembler


def test_utf8_character_split_across_tokens_is_held_until_whole() -> None:
    data = "héllo 👋!".encode()
    assembler = Utf8Assembler()
    out = [assembler.feed(data[i : i + 1]) for i in range(len(data))]
    assert "".join(out) + assembler.flush() == "héllo 👋!"
    # No piece ever carries half a character.
    assert all("\ufffd" not in piece for piece in out)
    assert out[data.index("👋".encode())] == ""


def test_utf8_unfinished_character_at_the_end_becomes_replacement() -> None:
    assembler = Utf8Assembler()
    assert assembler.feed(b"a" + "👋".encode()[:2]) == "a"
    assert assembler.flush() == "\ufffd"


def feed_all(matcher: StopMatcher, pieces: list[str]) -> tuple[str, bool]:
    out = []
    for piece in pieces:
        text, stopped = matcher.feed(piece)
        out.append(text)
        if stopped:
            return "".join(out), True
    return "".join(out) + matcher.flush(), False


@pytest.mark.parametrize(
    ("pieces", "stops", "expected"),
    [
        (["Hello", " wor", "ld", "!"], ("world",), ("Hello ", True)),
        (["a", "b", "S", "T", "O", "P", "c"], ("STOP",), ("ab", True)),
        (["one\n", "\ntwo"], ("\n\n",), ("one", True)),
        (["ST", "x STOP"], ("STOP",), ("STx ", True)),
        (["no stop here"], ("STOP",), ("no stop here", False)),
        (["ends with ST"], ("STOP",), ("ends with ST", False)),
        (["xyz"], ("yz", "x"), ("", True)),
        (["abc"], (), ("abc", False)),
    ],
)
def test_stop_strings(
    pieces: list[str], stops: tuple[str, ...], expected: tuple[str, bool]
) -> None:
    assert feed_all(StopMatcher(stops), pieces) == expected


def test_stop_partial_match_is_held_back_not_emitted() -> None:
    matcher = StopMatcher(("</answer>",))
    assert matcher.feed("42 </ans") == ("42 ", False)
    assert matcher.feed("wer> trailing") == ("", True)
    assert matcher.feed("more") == ("", True)


def test_the_stop_string_that_matched_first_is_named() -> None:
    matcher = StopMatcher(("yz", "x", "never"))
    assert matcher.matched is None
    assert feed_all(matcher, ["ab", "xyz"]) == ("ab", True)
    assert matcher.matched == "x"  # the first in the text, not in the list


def test_think_block_marks_reasoning_and_drops_tags() -> None:
    splitter = ThinkSplitter()
    out = []
    for piece in ["<th", "ink>\nLet me", " see.</thi", "nk>\n\nThe answer", " is 4."]:
        out += splitter.feed(piece)
    out += splitter.flush()
    reasoning = "".join(t for t, r in out if r)
    answer = "".join(t for t, r in out if not r)
    assert reasoning == "Let me see."
    assert answer == "The answer is 4."


def test_think_open_in_prompt_starts_in_reasoning() -> None:
    splitter = ThinkSplitter(reasoning=True)
    out = splitter.feed("\nhmm</think>\n\nok") + splitter.flush()
    assert out == [("hmm", True), ("ok", False)]


def test_text_with_a_lone_angle_bracket_is_not_swallowed() -> None:
    splitter = ThinkSplitter()
    out = splitter.feed("a < b and <t") + splitter.feed("able>") + splitter.flush()
    assert "".join(t for t, _ in out) == "a < b and <table>"


def test_several_tokens_at_once_are_one_event_each_with_their_own_logprob() -> None:
    """Accepted drafts arrive as several tokens in one step: each is its own event, carrying
    its own log-probability (a held-back partial character goes with the piece that ends
    it)."""
    from llmtrio.engine import TokenLogprob
    from llmtrio.engine.generate._output import OutputProcessor
    from llmtrio.engine.llama import RawLogprob

    pieces = {1: b"a", 2: b"b", 3: "é".encode()[:1], 4: "é".encode()[1:], 5: b"c"}
    output = OutputProcessor(
        stops=(),
        opens_think=False,
        piece=pieces.__getitem__,
        token_logprob=lambda raw: TokenLogprob(str(raw.token), pieces[raw.token], raw.logprob),
    )
    raws = [RawLogprob(t, -float(t), ()) for t in (1, 2, 3, 4, 5)]
    events, stopped = output.feed([1, 2, 3, 4, 5], raws)
    assert not stopped
    assert [e.text for e in events] == ["a", "b", "é", "c"]
    assert [[lp.logprob for lp in e.logprobs] for e in events] == [
        [-1.0],
        [-2.0],
        [-3.0, -4.0],
        [-5.0],
    ]
