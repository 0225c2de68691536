"""LoRA adapters written with ``gguf`` at test time, and a reference with the adapter merged
into the weights.

An adapter is llama.cpp's format (what ``convert_lora_to_gguf.py`` writes): ``general.type =
adapter``, ``general.architecture`` the base's, ``adapter.type = lora``,
``adapter.lora.alpha``, and for each adapted weight ``W`` (``n_out x n_in``) two F32 tensors,
``NAME.lora_a`` (``r x n_in``) and ``NAME.lora_b`` (``n_out x r``): llama.cpp adds
``scale * (alpha / r) * B @ (A @ x)`` to ``W @ x``. Their values are random (seeded), large
enough to move the base's greedy choices.

The merged reference (``W + (alpha / r) * B @ A``, computed in float64, stored as F32) is
written for the qwen35 tiny model, whose weights are all F32: its logits then match the
adapter's within float32 rounding. (gemma's file is quantized: every matmul after an adapted
weight quantizes its input activations, so a rounding difference of the last bit can move an
activation by a quantization step, and the merged copy's logits are no reference there.)
llama.cpp applies a weight's ``.scale`` tensor (the qwen35 tiny model has one per weight)
*before* the adapter's term in ``build_lora_mm`` (attention and recurrent projections:
``s * W @ x + delta @ x``) and *after* it in the feed-forward block (``s * (W @ x + delta @
x)``): the merged weight is ``W + delta / s`` in the first case and ``W + delta`` in the
second.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import gguf
import numpy as np
import numpy.typing as npt

from llmtrio.engine.models import check_gguf

__all__ = [
    "GEMMA_TARGETS",
    "QWEN35_TARGETS",
    "Lora",
    "gemma_shapes",
    "qwen35_shapes",
    "write_lora",
    "write_merged",
]

DATA = Path(__file__).resolve().parent / "data"
TINY = DATA / "qwen35-tiny-random.gguf"

#: Adapted weights of the qwen35 tiny model: its recurrent layer's projections (scaled before
#: the adapter), its attention layer's (the same) and feed-forward weights of both (scaled
#: after).
QWEN35_TARGETS = (
    "blk.0.attn_qkv.weight",
    "blk.0.attn_gate.weight",
    "blk.0.ssm_out.weight",
    "blk.0.ffn_up.weight",
    "blk.0.ffn_down.weight",
    "blk.1.attn_q.weight",
    "blk.1.attn_v.weight",
    "blk.1.attn_output.weight",
    "blk.1.ffn_gate.weight",
)
#: Adapted weights of gemma-3-270m (18 layers).
GEMMA_TARGETS = tuple(
    f"blk.{layer}.{weight}.weight"
    for layer in (0, 5, 11, 17)
    for weight in ("attn_q", "attn_v", "attn_output", "ffn_up", "ffn_down")
)


@attrs.frozen(eq=False)
class Lora:
    """An adapter file and what it adds to each weight at scale 1 (``(alpha / r) * B @ A``,
    float64, numpy's ``n_out x n_in``)."""

    path: Path
    rank: int
    alpha: float
    deltas: Mapping[str, npt.NDArray[np.float64]]


def write_lora(
    path: Path,
    architecture: str,
    shapes: Mapping[str, tuple[int, int]],
    *,
    rank: int = 4,
    alpha: float = 8.0,
    std: float = 0.05,
    seed: int = 0,
) -> Lora:
    """An adapter of ``architecture`` for the weights of ``shapes`` (name: ``(n_out,
    n_in)``), with random ``A`` and ``B`` of standard deviation ``std``."""
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(path, architecture)
    writer.add_type("adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    deltas = {}
    for name, (n_out, n_in) in shapes.items():
        a = (rng.standard_normal((rank, n_in)) * std).astype(np.float32)
        b = (rng.standard_normal((n_out, rank)) * std).astype(np.float32)
        writer.add_tensor(f"{name}.lora_a", a)
        writer.add_tensor(f"{name}.lora_b", b)
        deltas[name] = (alpha / rank) * (b.astype(np.float64) @ a.astype(np.float64))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Lora(path, rank, alpha, deltas)


def qwen35_shapes(targets: Sequence[str] = QWEN35_TARGETS) -> dict[str, tuple[int, int]]:
    """The ``(n_out, n_in)`` of the qwen35 tiny model's ``targets``."""
    reader = gguf.GGUFReader(TINY)
    found = {t.name: t.shape for t in reader.tensors}
    return {name: (int(found[name][1]), int(found[name][0])) for name in targets}


def gemma_shapes(path: Path, targets: Sequence[str] = GEMMA_TARGETS) -> dict[str, tuple[int, int]]:
    """The ``(n_out, n_in)`` of a llama-like model's ``targets``, from its header's widths
    (reading every tensor of a 262k-token vocabulary's file with ``gguf`` takes a minute)."""
    meta = check_gguf(path).metadata
    arch = meta["general.architecture"]

    def key(name: str) -> int:
        value = meta[f"{arch}.{name}"]
        assert isinstance(value, int)
        return value

    n_embd, n_ff = key("embedding_length"), key("feed_forward_length")
    q = key("attention.head_count") * key("attention.key_length")
    kv_k = key("attention.head_count_kv") * key("attention.key_length")
    kv_v = key("attention.head_count_kv") * key("attention.value_length")
    widths = {
        "attn_q": (q, n_embd),
        "attn_k": (kv_k, n_embd),
        "attn_v": (kv_v, n_embd),
        "attn_output": (n_embd, q),
        "ffn_up": (n_ff, n_embd),
        "ffn_gate": (n_ff, n_embd),
        "ffn_down": (n_embd, n_ff),
    }
    return {name: widths[name.split(".")[2]] for name in targets}


def _field_value(field: gguf.ReaderField) -> tuple[Any, gguf.GGUFValueType, Any]:
    vtype = field.types[0]
    sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(field.types) > 1 else None
    return field.contents(), vtype, sub


def write_merged(path: Path, lora: Lora, *, scale: float = 1.0) -> Path:
    """The qwen35 tiny model with ``lora`` at ``scale`` merged into its weights (see the
    module for the ``.scale`` tensors)."""
    reader = gguf.GGUFReader(TINY)
    tensors = {t.name: np.array(t.data) for t in reader.tensors}
    writer = gguf.GGUFWriter(path, "qwen35")
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value, vtype, sub = _field_value(field)
        if vtype == gguf.GGUFValueType.ARRAY and sub is None:
            continue  # an empty array of no stated type (unused by qwen35)
        writer.add_key_value(key, value, vtype, sub_type=sub)
    for name, data in tensors.items():
        delta = lora.deltas.get(name)
        if delta is not None:
            delta = scale * delta
            weight_scale = tensors.get(name.removesuffix(".weight") + ".scale")
            if weight_scale is not None and ".ffn_" not in name:
                delta = delta / float(weight_scale[0])  # scaled before the adapter's term
            data = (data.astype(np.float64) + delta).astype(np.float32)
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
