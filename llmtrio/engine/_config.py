"""How the engine loads a model and schedules it (:class:`EngineConfig`), with the bounds
of its settings."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from ._cores import usable_cores

__all__ = [
    "CACHE_TYPES",
    "DEFAULT_QUANT",
    "DEFAULT_REPO",
    "FLASH_ATTN",
    "MAX_DRAFT",
    "MAX_RECURRENT_DRAFT",
    "SPEC_KINDS",
    "EngineConfig",
    "LoraSpec",
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
class LoraSpec:
    """A LoRA adapter served on a model: the model ``name`` requests choose it by, its GGUF
    file (llama.cpp's adapter format: ``general.type = adapter``, ``adapter.type = lora``)
    and the ``scale`` it is applied at (1: as trained; 0: not at all)."""

    name: str
    path: Path = attrs.field(converter=Path)
    scale: float = attrs.field(default=1.0, converter=float)

    def __attrs_post_init__(self) -> None:
        if not self.name or self.name != self.name.strip():
            raise ValueError(f"an adapter's name must be a name, not {self.name!r}")
        if not math.isfinite(self.scale):
            raise ValueError(f"adapter {self.name}: the scale must be a number, not {self.scale}")


def _lora_specs(value: Iterable[LoraSpec]) -> tuple[LoraSpec, ...]:
    specs = tuple(value)
    names = [spec.name for spec in specs]
    for name in names:
        if names.count(name) > 1:
            raise ValueError(f"two adapters are named {name!r}")
    return specs


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
    ``choose_threads``: each step runs on ``threads`` or on 1, whichever measures faster
    (``ThreadChooser``: a machine with fewer free cores than threads); off, always on
    ``threads``. llama.cpp's bits follow the thread count as they follow a batch's shape, so
    runs compared bit for bit turn it off.

    ``prompt_cache`` reuses what a slot's memory already holds of a new prompt (its previous
    prompt and answer, a shared system prompt) instead of ingesting it again; off, every
    prompt is ingested from scratch. ``cache_ram_mib`` bounds the host memory kept for
    prompt snapshots (copies of a sequence's memory that other slots can restore); 0 keeps
    none (a slot still reuses its own memory). A sliding-window model's window cache is
    full size (llama.cpp's ``swa_full``, its default for a context; llama-server's
    ``--swa-full``), so a sequence's memory can be cut back to any position.

    ``cache_dir``: a folder where the prompt cache's snapshots outlive the process (its
    model's own folder in it): a snapshot evicted from ``cache_ram_mib``, and what the slots
    and snapshots hold when the engine closes (a model unloaded, a server drained), are
    written there, and a prompt whose prefix is found there (after a restart, an unload, or
    written by another process sharing the folder) is restored instead of computed.
    ``cache_disk_mib`` bounds the files (least recently used removed first). ``None``: off.

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

    ``mmproj``: a projector (llama.cpp's ``mmproj`` GGUF: a vision encoder, an audio
    encoder, or both) for the model: chat messages may then carry images or audio
    (:class:`ChatMessage`'s ``media``). Without it, a model from a Hugging Face repo gets the
    repo's own ``mmproj-*.gguf`` (F16 before F32), fetched with the weights; ``vision=False``
    loads none. ``max_images`` bounds the images of one request (audio is bounded by its
    length, which the request's parse checks, and by the context).

    ``cache_type_k``/``cache_type_v``: the type the K and V cache cells are stored in
    (llama.cpp's ``-ctk``/``-ctv``): ``f16``, or ``q8_0``/``q4_0`` at about a half/a quarter
    of the memory; a quantized V cache needs flash attention (``flash_attn`` not ``off``).
    ``n_gpu_layers``: the layers offloaded to a GPU (-1: all, llama.cpp's default; 0: none;
    nothing on a build without one). ``mmap``: map the file instead of reading it (``None``:
    llama.cpp's choice); ``mlock``: keep the weights in RAM (no swapping).

    ``lora``: the LoRA adapters served on the model from the start, each under its own name
    (more can be loaded and unloaded at run time: :meth:`Engine.load_adapter`); a request
    runs under the adapters it names (``GenerateRequest.model_name``, ``lora``).
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
    choose_threads: bool = True
    allow_fallback: bool = True
    model_name: str | None = None
    prompt_cache: bool = True
    cache_ram_mib: int = 1024
    cache_dir: Path | None = attrs.field(default=None, converter=attrs.converters.optional(Path))
    cache_disk_mib: int = 8192
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
    lora: tuple[LoraSpec, ...] = attrs.field(default=(), converter=_lora_specs)

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
        if self.cache_disk_mib < 1:
            raise ValueError("cache_disk_mib must be at least 1")
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
