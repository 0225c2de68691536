"""Values that cross the engine's public face: requests, events, capacity, config."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs

from ._cores import usable_cores
from ._errors import InvalidRequestError
from ._media import MEDIA_MARKER, Image

__all__ = [
    "Capacity",
    "ChatMessage",
    "Done",
    "EngineConfig",
    "Event",
    "Failed",
    "GenerateRequest",
    "Sampling",
    "StopReason",
    "Timings",
    "Token",
    "TokenLogprob",
    "Tool",
    "ToolCall",
]

DEFAULT_REPO = "unsloth/Qwen3.5-0.8B-GGUF"
DEFAULT_QUANT = "Q4_K_M"
#: The speculative decoding methods (``None``: off).
SPEC_KINDS: tuple[str | None, ...] = ("ngram", None)
#: The most draft tokens one sequence may carry into a step.
MAX_DRAFT = 64
#: The most a sequence of a model with recurrent state drafts: the context keeps that many
#: snapshots of each sequence's state to roll back to (llama.cpp's ``n_rs_seq``), memory
#: that attention-only models do not pay; the default ``spec_draft_max`` of 16 would double
#: it (not measured on the real Qwen3.5 here).
MAX_RECURRENT_DRAFT = 8
#: The types a context's K and V cache may be stored in (llama.cpp's ``-ctk``/``-ctv``).
CACHE_TYPES = ("f16", "q8_0", "q4_0")
#: Flash attention: on, off, or llama.cpp's choice for the device (``auto``).
FLASH_ATTN = ("auto", "on", "off")


@attrs.frozen
class EngineConfig:
    """How to load the model and how to schedule it.

    ``model`` is a local GGUF path; when ``None`` the model is resolved from the Hugging Face
    cache (``hf_repo`` and ``hf_file`` or ``quant``). ``ctx_size`` is per slot: the context
    allocated is ``ctx_size * max_inflight`` tokens. ``target_step_ms`` pauses admission while
    the measured decode step is slower than it (0: admission is bounded by ``max_inflight``
    only). ``prefill_chunk`` is the prompt-token budget of one step, shared by all prompts
    being ingested. ``prefill_share`` trades time to first token for smooth streams: while
    streams decode, a step's prompt tokens may cost at most that many decode steps (so a
    running stream's tokens come at most ``1 + prefill_share`` decode steps apart), and
    prompts ingested while no stream runs start their streams together (a wave, up to
    ``max_inflight`` chunks); ``math.inf`` is prompts first (each starts as soon as it is in,
    every stream waits for it: the lowest time to first token). See the ``Scheduler``.

    ``prompt_cache`` reuses what a slot's memory already holds of a new prompt (its previous
    prompt and answer, a shared system prompt) instead of ingesting it again; off, every
    prompt is ingested from scratch. ``cache_ram_mib`` bounds the host memory kept for
    prompt snapshots (copies of a sequence's memory that other slots can restore); 0 keeps
    none (a slot still reuses its own memory). A sliding-window model's window cache is
    full size (llama.cpp's ``swa_full``, its default for a context; llama-server's
    ``--swa-full``), so a sequence's memory can be cut back to any position.

    ``chat_template``: a Jinja chat template used instead of the model's own (llama-server's
    ``--chat-template-file``).

    ``spec`` is speculative decoding: ``"ngram"`` drafts up to ``spec_draft_max`` tokens per
    decoding sequence (at most ``MAX_RECURRENT_DRAFT`` on a model with recurrent state) by
    looking its last tokens up in its own prompt and output, and verifies them in the same
    batch (exact: every token emitted is the one the model picks at its position), the
    default; ``None`` is off. How many drafts a step carries follows the measured step costs
    (and ``target_step_ms``): a step that is compute-bound (many sequences decoding) carries
    none, so the default costs nothing where drafts cannot pay.

    ``spec_pool``: the entries of the core's pool of n-grams, fed with every sequence's
    prompt and output, that a sequence also drafts from (what another request wrote: a
    templated answer, the same text rewritten again); about 100 bytes an entry; 0 is off.
    A shared pool makes one request's speed depend on what others wrote (a timing side
    channel, as the prompt cache is): turn it off where that matters.

    ``kv_unified`` puts every slot's memory in one pool of ``max_inflight * ctx_size`` cells:
    one request may use up to the pool (or ``max_request_ctx``, when set), admission waits
    for free cells, and when the pool runs out idle slots give up their reusable cells, then
    the youngest running sequence is swapped out to host memory until there is room again.
    Off, each slot has its own ``ctx_size`` cells.

    ``mmproj``: a vision projector (llama.cpp's ``mmproj`` GGUF) for the model: chat
    messages may then carry images (:class:`ChatMessage`'s ``images``). Without it, a model
    from a Hugging Face repo gets the repo's own ``mmproj-*.gguf`` (F16 before F32),
    fetched with the weights; ``vision=False`` loads none. ``max_images`` bounds the images
    of one request.

    ``cache_type_k``/``cache_type_v``: the type the K and V cache cells are stored in
    (llama.cpp's ``-ctk``/``-ctv``): ``f16``, or ``q8_0``/``q4_0`` at about a half/a quarter
    of the memory; a quantized V cache needs flash attention (``flash_attn`` not ``off``).
    ``n_gpu_layers``: the layers offloaded to a GPU (-1: all, llama.cpp's default; 0: none;
    nothing on a build without one). ``mmap``: map the file instead of reading it (``None``:
    llama.cpp's choice); ``mlock``: keep the weights in RAM (no swapping).
    """

    model: Path | None = attrs.field(default=None, converter=attrs.converters.optional(Path))
    hf_repo: str = DEFAULT_REPO
    hf_file: str | None = None
    quant: str = DEFAULT_QUANT
    max_inflight: int = 8
    ctx_size: int = 4096
    target_step_ms: float = 0.0
    prefill_chunk: int = 256
    #: Smooth streams by default: issue 48's AIPerf runs (PERFORMANCE.md, "Smooth streams").
    prefill_share: float = 4.0
    #: The cores this process may use (its affinity and cgroup quota, not the host's).
    threads: int = attrs.field(factory=usable_cores)
    allow_fallback: bool = True
    model_name: str | None = None
    prompt_cache: bool = True
    cache_ram_mib: int = 1024
    chat_template: str | None = None
    #: On by default: the budget drafts only where the measured step costs say drafts pay,
    #: and free chat ran no slower with it at 1 and 8 streams (PERFORMANCE.md, "Speculative
    #: decoding").
    spec: str | None = "ngram"
    spec_draft_max: int = 16
    spec_pool: int = 0
    kv_unified: bool = False
    max_request_ctx: int = 0
    mmproj: Path | None = attrs.field(default=None, converter=attrs.converters.optional(Path))
    vision: bool = True
    max_images: int = 8
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    n_gpu_layers: int = -1
    flash_attn: str = "auto"
    mmap: bool | None = None
    mlock: bool = False

    def __attrs_post_init__(self) -> None:
        if self.max_inflight < 1:
            raise ValueError("max_inflight must be at least 1")
        if self.ctx_size < 16:
            raise ValueError("ctx_size must be at least 16")
        if self.target_step_ms < 0:
            raise ValueError("target_step_ms must be 0 or more")
        if self.prefill_chunk < 1:
            raise ValueError("prefill_chunk must be at least 1")
        if not self.prefill_share >= 0:  # NaN too
            raise ValueError("prefill_share must be 0 or more (inf: prompts first)")
        if self.threads < 1:
            raise ValueError("threads must be at least 1")
        if self.cache_ram_mib < 0:
            raise ValueError("cache_ram_mib must be 0 or more")
        if self.spec not in SPEC_KINDS:
            kinds = ", ".join(repr(k) for k in SPEC_KINDS)
            raise ValueError(f"spec must be one of {kinds}, not {self.spec!r}")
        if not 1 <= self.spec_draft_max <= MAX_DRAFT:
            raise ValueError(f"spec_draft_max must be between 1 and {MAX_DRAFT}")
        if self.spec_pool < 0:
            raise ValueError("spec_pool must be 0 (off) or more")
        if self.max_images < 1:
            raise ValueError("max_images must be at least 1")
        if self.max_request_ctx < 0:
            raise ValueError("max_request_ctx must be 0 (the whole context) or more")
        for name, kind in (
            ("cache_type_k", self.cache_type_k),
            ("cache_type_v", self.cache_type_v),
        ):
            if kind not in CACHE_TYPES:
                raise ValueError(f"{name} must be one of {', '.join(CACHE_TYPES)}, not {kind!r}")
        if self.flash_attn not in FLASH_ATTN:
            raise ValueError(f"flash_attn must be one of {', '.join(FLASH_ATTN)}")
        if self.cache_type_v != "f16" and self.flash_attn == "off":
            raise ValueError(
                f"cache_type_v {self.cache_type_v} needs flash attention: flash_attn on or auto"
            )
        if self.n_gpu_layers < -1:
            raise ValueError("n_gpu_layers must be -1 (all), 0 (none) or more")
        if self.max_request_ctx:
            room = self.max_inflight * self.ctx_size if self.kv_unified else self.ctx_size
            if not 16 <= self.max_request_ctx <= room:
                where = "the pool" if self.kv_unified else "a slot's context"
                raise ValueError(
                    f"max_request_ctx must be between 16 and {room} ({where}), "
                    f"not {self.max_request_ctx}"
                )

    @property
    def load_settings(self) -> dict[str, Any]:
        """The settings llama.cpp loads the model and its context with, as ``LlamaModel``
        takes them."""
        return {
            "cache_type_k": self.cache_type_k,
            "cache_type_v": self.cache_type_v,
            "flash_attn": self.flash_attn,
            "n_gpu_layers": self.n_gpu_layers,
            "mmap": self.mmap,
            "mlock": self.mlock,
        }

    @property
    def pool_cells(self) -> int:
        """The context cells of all slots together."""
        return self.max_inflight * self.ctx_size

    @property
    def request_ctx(self) -> int:
        """The most context one request may use: a slot's, or with ``kv_unified`` the
        pool's (either bounded by ``max_request_ctx`` when set)."""
        room = self.pool_cells if self.kv_unified else self.ctx_size
        return min(room, self.max_request_ctx or room)


@attrs.frozen
class Tool:
    """A function the model may call: ``parameters`` is its JSON Schema (an object schema)."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = attrs.field(factory=lambda: {"type": "object", "properties": {}})

    def as_openai(self) -> dict[str, Any]:
        """The tool as OpenAI's ``tools`` entry, the shape chat templates expect."""
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


@attrs.frozen
class ToolCall:
    """A call the model made (or made earlier, in the history): ``arguments`` is JSON text."""

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


def _tuple_of_images(value: Sequence[Image]) -> tuple[Image, ...]:
    return _tuple_of(value, Image, "images")


@attrs.frozen
class ChatMessage:
    """One chat message. An assistant message may carry ``tool_calls``; a ``tool`` message
    answers the call named by ``tool_call_id``. ``images`` go where ``content`` holds
    :data:`MEDIA_MARKER`, one marker per image, in order."""

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=_tuple_of_calls)
    tool_call_id: str | None = None
    images: tuple[Image, ...] = attrs.field(default=(), converter=_tuple_of_images)

    def __attrs_post_init__(self) -> None:
        if self.role not in ("system", "user", "assistant", "developer", "tool"):
            raise InvalidRequestError(f"unknown message role {self.role!r}", param="messages")
        if self.content.count(MEDIA_MARKER) != len(self.images):
            raise InvalidRequestError(
                "a message's content must hold one media marker per image", param="messages"
            )


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


MAX_TOP_LOGPROBS = 20


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
    schema the reply must follow (compiled to a grammar off the event loop, once per schema).
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
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidRequestError(
                f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}", param="top_logprobs"
            )
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
    right. ``stop_string`` is the stop string that ended it (``StopReason.STOP_STRING``)."""

    stop: StopReason
    prompt_tokens: int
    completion_tokens: int
    timings: Timings
    cached_tokens: int = 0
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
