"""Values that cross the engine's public face: requests (chat messages, tools, sampling, a
generation), the events a generation yields, and capacity. The engine's config is
``_config.EngineConfig``."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, TypeVar

import attrs

from ._audio import Audio
from ._errors import InvalidRequestError
from ._media import MEDIA_MARKER, Image

__all__ = [
    "GREEDY",
    "TEXT_INPUT",
    "TEXT_PARAMETERS",
    "Capacity",
    "ChatMessage",
    "Done",
    "Event",
    "Failed",
    "GenerateRequest",
    "Media",
    "Sampling",
    "StopReason",
    "TextFormat",
    "Timings",
    "Token",
    "TokenLogprob",
    "Tool",
    "ToolCall",
]


#: The one parameter a text tool is shown with, and written with: its input.
TEXT_INPUT = "input"
_TEXT_SYNTAXES = (None, "lark", "regex")


@attrs.frozen
class TextFormat:
    """What a text tool's input may be (the Responses API's ``custom`` tool ``format``):
    any text (``syntax`` ``None``), or text that ``definition`` accepts, a Lark grammar
    (``"lark"``: the subset ``llmtrio.engine.grammar`` translates) or a regular expression
    the whole text matches (``"regex"``)."""

    syntax: str | None = None
    definition: str = ""

    def __attrs_post_init__(self) -> None:
        if self.syntax not in _TEXT_SYNTAXES:
            raise InvalidRequestError(
                f"a text format's syntax is 'lark', 'regex' or none, not {self.syntax!r}",
                param="tools",
            )


@attrs.frozen
class Tool:
    """A function the model may call: ``parameters`` is its JSON Schema (an object schema).

    ``strict``: the schema is enforced exactly, and a keyword the grammar cannot enforce is
    refused (an :class:`InvalidRequestError` naming it); otherwise such a keyword is relaxed
    for its sub-schema, with a warning.

    ``text``: the tool takes text instead of JSON arguments (``parameters`` is then unused):
    the model writes it as the one parameter :data:`TEXT_INPUT` (JSON form: ``"arguments":
    {"input": "..."}``; XML form: ``<parameter=input>``), and the call's
    :attr:`ToolCall.arguments` is the text itself. A grammar the engine cannot translate
    leaves the text free, with a warning (refused when ``strict``).
    """

    name: str
    description: str = ""
    parameters: dict[str, Any] = attrs.field(factory=lambda: {"type": "object", "properties": {}})
    strict: bool = False
    text: TextFormat | None = None

    def as_openai(self) -> dict[str, Any]:
        """The tool as OpenAI's ``tools`` entry, the shape chat templates expect (a text
        tool: a function of one string parameter, :data:`TEXT_INPUT`)."""
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = self.parameters if self.text is None else TEXT_PARAMETERS
        return {"type": "function", "function": function}


#: A text tool's parameters as templates are shown them.
TEXT_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {TEXT_INPUT: {"type": "string"}},
    "required": [TEXT_INPUT],
}


@attrs.frozen
class ToolCall:
    """A call the model made (or made earlier, in the history): ``arguments`` is JSON text
    (a text tool's call: the text)."""

    id: str
    name: str
    arguments: str


_Item = TypeVar("_Item")


def _tuple_of(value: Sequence[_Item], kind: type[_Item], param: str) -> tuple[_Item, ...]:
    """``value`` as a tuple, every item a ``kind``: a library caller who passes OpenAI-style
    dicts (or one string) learns so by name here, not from an AttributeError later."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise InvalidRequestError(
            f"{param} is a {type(value).__name__}; give a sequence of {kind.__name__}", param=param
        )
    for index, item in enumerate(value):
        if not isinstance(item, kind):
            raise InvalidRequestError(
                f"{param}[{index}] is a {type(item).__name__}; give {kind.__name__} values "
                f"(llmtrio.engine.{kind.__name__})",
                param=param,
            )
    return tuple(value)


def _tuple_of_calls(value: Sequence[ToolCall]) -> tuple[ToolCall, ...]:
    return _tuple_of(value, ToolCall, "tool_calls")


#: What a message's media markers stand for: an image or an audio file.
Media = Image | Audio


def _tuple_of_media(value: Sequence[Media]) -> tuple[Media, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise InvalidRequestError(
            f"media is a {type(value).__name__}; give a sequence of Image and Audio values",
            param="media",
        )
    for index, item in enumerate(value):
        if not isinstance(item, Image | Audio):
            raise InvalidRequestError(
                f"media[{index}] is a {type(item).__name__}; give Image or Audio values "
                "(llmtrio.engine.Image, llmtrio.engine.Audio)",
                param="media",
            )
    return tuple(value)


@attrs.frozen
class ChatMessage:
    """One chat message. An assistant message may carry ``tool_calls``; a ``tool`` message
    answers the call named by ``tool_call_id``. ``media`` (images and audio files) go where
    ``content`` holds :data:`MEDIA_MARKER`, one marker per item, in order."""

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=_tuple_of_calls)
    tool_call_id: str | None = None
    media: tuple[Media, ...] = attrs.field(default=(), converter=_tuple_of_media)

    def __attrs_post_init__(self) -> None:
        if self.role not in ("system", "user", "assistant", "developer", "tool"):
            raise InvalidRequestError(f"unknown message role {self.role!r}", param="messages")
        if self.content.count(MEDIA_MARKER) != len(self.media):
            raise InvalidRequestError(
                "a message's content must hold one media marker per image or audio file",
                param="messages",
            )

    @property
    def images(self) -> tuple[Image, ...]:
        """Its images, in order."""
        return tuple(item for item in self.media if isinstance(item, Image))

    @property
    def audio(self) -> tuple[Audio, ...]:
        """Its audio files, in order."""
        return tuple(item for item in self.media if isinstance(item, Audio))


@attrs.frozen
class Sampling:
    """Sampling parameters; ``temperature == 0`` is greedy (top-k, top-p, min-p and the seed
    are then unused).

    Penalties apply to greedy and sampled slots alike. ``presence_penalty`` and
    ``frequency_penalty`` are OpenAI's: subtracted from the logit of every token already
    generated (once, and once per occurrence). ``repeat_penalty`` is llama.cpp's: the logit of
    a token among the last ``repeat_last_n`` generated is divided by it (multiplied when
    negative); 1 is off.
    """

    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64

    def __attrs_post_init__(self) -> None:
        if not 0.0 <= self.temperature <= 100.0:
            raise InvalidRequestError("temperature must be between 0 and 100", param="temperature")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError("top_p must be in (0, 1]", param="top_p")
        if self.top_k < 0:
            raise InvalidRequestError("top_k must be 0 (off) or more", param="top_k")
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidRequestError("min_p must be in [0, 1]", param="min_p")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise InvalidRequestError(
                "presence_penalty must be between -2 and 2", param="presence_penalty"
            )
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise InvalidRequestError(
                "frequency_penalty must be between -2 and 2", param="frequency_penalty"
            )
        if not 0.0 < self.repeat_penalty <= 10.0:
            raise InvalidRequestError("repeat_penalty must be in (0, 10]", param="repeat_penalty")
        if self.repeat_last_n < 0:
            raise InvalidRequestError("repeat_last_n must be 0 or more", param="repeat_last_n")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def penalized(self) -> bool:
        """Whether any penalty is on."""
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or (self.repeat_penalty != 1.0 and self.repeat_last_n)
        )


GREEDY = Sampling(temperature=0.0)


def _tuple_of_messages(value: Sequence[ChatMessage] | None) -> tuple[ChatMessage, ...] | None:
    return None if value is None else _tuple_of(value, ChatMessage, "messages")


def _tuple_of_ints(value: Sequence[int] | None) -> tuple[int, ...] | None:
    return None if value is None else tuple(int(v) for v in value)


def _tuple_of_strings(value: Sequence[str]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


def _tuple_of_biases(value: Sequence[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    return tuple((int(token), float(bias)) for token, bias in value)


def _tuple_of_tools(value: Sequence[Tool]) -> tuple[Tool, ...]:
    return _tuple_of(value, Tool, "tools")


@attrs.frozen
class GenerateRequest:
    """One generation: chat ``messages`` (templated with the model's chat template) or raw
    prompt ``tokens``, exactly one of the two.

    ``max_tokens=None`` generates until end of generation or the end of the slot's context.
    ``stop`` strings end generation and are never emitted. ``think`` is passed to the chat
    template as ``enable_thinking`` (``None``: the template's default). ``ignore_eos`` keeps
    generating through end-of-generation tokens (for benchmarks). ``logit_bias`` maps token
    ids to a bias added to their logits (``-inf`` bans a token).

    ``grammar`` is a GBNF grammar (llama.cpp's, root rule ``root``) every generated token must
    follow; the generation ends when the grammar is complete. ``json_schema`` is a JSON
    schema the reply must follow (compiled to a grammar off the event loop, once per schema);
    a keyword the grammar cannot enforce is refused when ``json_schema_strict``, else relaxed
    for its sub-schema with a warning (a tool's ``strict`` says the same for its schema).
    ``logprobs`` asks for each token's log-probability and that many alternatives (0 to 20);
    ``None`` costs nothing.

    ``tools`` are passed to the chat template (or described in a system prompt when the
    template has no tools support); the model's calls come back as text for the caller to
    parse (:class:`ToolCallStream`), in the template's own format (Qwen's XML
    ``<function=...>`` when the template writes calls so, else Hermes JSON).
    ``tool_choice``: ``"auto"`` lets the model write text or calls, and a call it opens
    follows its tool's parameter schema (a lazy grammar); ``"required"`` makes the reply a
    call (of ``tool_name`` when given), by a grammar from the first token; ``"none"``
    constrains nothing. ``parallel_tool_calls``: a call may be followed by more.

    ``reasoning_budget``: at most this many tokens of reasoning (inside the think block);
    once they are spent the engine closes the block itself with the model's end-of-thinking
    marker, through the same path a generated marker takes, and the answer follows.
    ``None``: unbounded. ``0`` with thinking on closes the block at once. The budget is one
    for the whole generation (a second block gets what the first left); the marker counts as
    a generated token; a draft that would cross the budget is cut at the marker. Ignored on
    a model whose vocabulary has no single ``<think>`` and ``</think>`` tokens, and under a
    grammar held from the first token (``grammar``, ``json_schema``, a required tool call),
    which decides every token.

    ``cache_prompt=False`` reuses no memory of earlier requests: the whole prompt is ingested
    (llama.cpp server's ``cache_prompt``). Reuse computes the prompt's last logits from other
    batches than a whole ingestion does, and llama.cpp's logits depend on batch shapes in
    their last bits, so only requests ingested alike are bit-for-bit reproducible.
    """

    messages: tuple[ChatMessage, ...] | None = attrs.field(
        default=None, converter=_tuple_of_messages
    )
    tokens: tuple[int, ...] | None = attrs.field(default=None, converter=_tuple_of_ints)
    max_tokens: int | None = None
    sampling: Sampling = GREEDY
    stop: tuple[str, ...] = attrs.field(default=(), converter=_tuple_of_strings)
    think: bool | None = None
    ignore_eos: bool = False
    logit_bias: tuple[tuple[int, float], ...] = attrs.field(default=(), converter=_tuple_of_biases)
    grammar: str | None = None
    logprobs: int | None = None
    tools: tuple[Tool, ...] = attrs.field(default=(), converter=_tuple_of_tools)
    json_schema: dict[str, Any] | bool | None = None
    json_schema_strict: bool = False
    tool_choice: str = "auto"
    tool_name: str | None = None
    parallel_tool_calls: bool = True
    cache_prompt: bool = True
    reasoning_budget: int | None = None

    def __attrs_post_init__(self) -> None:
        if (self.messages is None) == (self.tokens is None):
            raise InvalidRequestError("give exactly one of messages or tokens", param="messages")
        if self.messages is not None and not self.messages:
            raise InvalidRequestError("messages must not be empty", param="messages")
        if self.tokens is not None and not self.tokens:
            raise InvalidRequestError("tokens must not be empty", param="tokens")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise InvalidRequestError("max_tokens must be at least 1", param="max_tokens")
        if self.reasoning_budget is not None and self.reasoning_budget < 0:
            raise InvalidRequestError(
                "reasoning_budget must not be negative", param="reasoning_budget"
            )
        if any(not s for s in self.stop):
            raise InvalidRequestError("stop strings must not be empty", param="stop")
        if self.logprobs is not None and self.logprobs < 0:
            raise InvalidRequestError("top_logprobs must not be negative", param="top_logprobs")
        if self.grammar is not None and not self.grammar.strip():
            raise InvalidRequestError("grammar must not be empty", param="grammar")
        if self.tool_choice not in ("auto", "required", "none"):
            raise InvalidRequestError(
                "tool_choice must be 'auto', 'required' or 'none'", param="tool_choice"
            )
        if self.tool_choice == "required" and not self.tools:
            raise InvalidRequestError("tool_choice 'required' needs tools", param="tool_choice")
        if self.tool_name is not None and all(t.name != self.tool_name for t in self.tools):
            raise InvalidRequestError(f"no tool named {self.tool_name!r}", param="tool_choice")
        forced = self.tool_choice == "required"
        if sum((self.grammar is not None, self.json_schema is not None, forced)) > 1:
            raise InvalidRequestError(
                "give at most one of grammar, json_schema and a required tool call",
                param="grammar",
            )

    @classmethod
    def user(cls, prompt: str, *, system: str | None = None, **kwargs: object) -> GenerateRequest:
        """A one-turn chat: an optional system message, then ``prompt`` as the user's."""
        messages = [ChatMessage("system", system)] if system else []
        messages.append(ChatMessage("user", prompt))
        return cls(messages=messages, **kwargs)  # type: ignore[arg-type]


class StopReason(enum.Enum):
    END_OF_GENERATION = "end_of_generation"
    MAX_TOKENS = "max_tokens"
    CONTEXT_END = "context_end"
    STOP_STRING = "stop_string"
    CANCELLED = "cancelled"

    @property
    def finish_reason(self) -> str:
        """OpenAI's ``finish_reason`` for this stop."""
        if self in (StopReason.MAX_TOKENS, StopReason.CONTEXT_END):
            return "length"
        return "stop"


@attrs.frozen
class Timings:
    """Seconds spent waiting for a slot, ingesting the prompt (until the first token was
    sampled) and decoding the rest."""

    queue_s: float
    prefill_s: float
    decode_s: float


@attrs.frozen
class TokenLogprob:
    """One generated token's log-probability under the model (a log-softmax of its raw
    logits, before biases, penalties, grammar or temperature), with its text (``piece`` holds
    its exact bytes, possibly part of a character), and the ``top`` alternatives as
    ``(text, bytes, logprob)``, most likely first."""

    token: str
    piece: bytes
    logprob: float
    top: tuple[tuple[str, bytes, float], ...] = ()


@attrs.frozen
class Token:
    """A piece of generated text; ``reasoning`` when it lies inside a think block.

    ``logprobs`` (asked for with ``GenerateRequest.logprobs``) are those of the tokens whose
    text this piece completes, in order; a token whose text is held back (an unfinished
    character, a possible stop string) is reported with the piece that releases it.
    """

    text: str
    reasoning: bool = False
    logprobs: tuple[TokenLogprob, ...] = ()


@attrs.frozen
class Done:
    """The end of a generation. ``cached_tokens`` of the ``prompt_tokens`` were not
    ingested: the slot's memory held them already (prompt reuse). ``draft_tokens`` draft
    tokens were verified for it (speculative decoding), ``accepted_tokens`` of them were
    right. ``stop_string`` is the stop string that ended it (``StopReason.STOP_STRING``).
    ``audio_tokens`` of the ``prompt_tokens`` are audio embeddings."""

    stop: StopReason
    prompt_tokens: int
    completion_tokens: int
    timings: Timings
    cached_tokens: int = 0
    audio_tokens: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    reasoning_tokens: int = 0
    stop_string: str | None = None


@attrs.frozen
class Failed:
    error: Exception


Event = Token | Done | Failed


@attrs.frozen
class Capacity:
    """Slot occupancy, in the fields of the ring's worker heartbeat.

    ``inflight`` counts accepted requests still running, those waiting for admission
    included; ``decoding`` those in the current batch.
    """

    inflight: int
    decoding: int
    max_inflight: int
    available_slots: int
    #: Prompt reuse so far: sequences that reused part of their prompt, tokens reused, and
    #: the host memory prompt snapshots hold now.
    cache_hits: int = 0
    cached_tokens: int = 0
    cache_bytes: int = 0
    #: Context cells the running sequences hold, and all the slots' cells (the shared
    #: pool's, when unified).
    kv_used: int = 0
    kv_total: int = 0
    #: Speculative decoding so far: draft tokens verified, and those that were right.
    spec_drafted: int = 0
    spec_accepted: int = 0
