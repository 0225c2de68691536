"""A test model with the default model's own tokenizer and chat template, written with
``gguf`` at test time.

The architecture, hyperparameters and every tensor but the two vocabulary tables are those of
``data/qwen35-tiny-random.gguf`` (llama.cpp's ``qwen35``: 2 layers, width 256, random
weights). The tokenizer is Qwen's byte-level BPE from ``data/ggml-vocab-qwen35.gguf`` (151,936
entries, the ``qwen35`` pre-tokenizer), with the added tokens that file leaves out written
where Qwen3 has them (see :data:`ADDED_TOKENS`); the chat template is the Qwen3.5 family's own
(``data/templates/Qwen3.5-4B.jinja``). ``token_embd`` and ``output`` are new random F16
tables of 151,936 rows (78 MB each: written to a temporary folder, never committed).

The weights are random, so the text is noise: tests force structure (a grammar, a forced tool
call, a logit bias) and assert the tokens, tags and stops the real template and tokenizer
give. See data/README-qwen35-real.md for the sources and what was checked.
"""

from __future__ import annotations

import functools
import struct
from pathlib import Path
from typing import Any

import gguf
import numpy as np

__all__ = [
    "ADDED_TOKENS",
    "QWEN35_TEMPLATE",
    "QWEN35_VOCAB",
    "TEMPLATES",
    "write_qwen35_real",
]

DATA = Path(__file__).resolve().parent / "data"
TEMPLATES = DATA / "templates"
QWEN35_VOCAB = DATA / "ggml-vocab-qwen35.gguf"
QWEN35_TEMPLATE = TEMPLATES / "Qwen3.5-4B.jinja"
TINY = DATA / "qwen35-tiny-random.gguf"

#: Qwen's added tokens at Qwen3's ids (Qwen3's tokenizer_config.json). The vocabulary file
#: carries only the first three (as control tokens); the rest of its ids from 151646 are
#: ``[PAD...]`` placeholders. Its 151,643 BPE entries and merges are those of
#: ``ggml-vocab-qwen2.gguf`` entry for entry, so Qwen2/3's layout is the one that fits it. (The
#: real Qwen3.5 models have a larger vocabulary, 248,320 entries, per llama.cpp's
#: tests/snapshots/qwen3.5-*.schema; their ids differ, so tests look tokens up by text.)
ADDED_TOKENS = {
    151643: "<|endoftext|>",
    151644: "<|im_start|>",
    151645: "<|im_end|>",
    151646: "<|object_ref_start|>",
    151647: "<|object_ref_end|>",
    151648: "<|box_start|>",
    151649: "<|box_end|>",
    151650: "<|quad_start|>",
    151651: "<|quad_end|>",
    151652: "<|vision_start|>",
    151653: "<|vision_end|>",
    151654: "<|vision_pad|>",
    151655: "<|image_pad|>",
    151656: "<|video_pad|>",
    151657: "<tool_call>",
    151658: "</tool_call>",
    151659: "<|fim_prefix|>",
    151660: "<|fim_middle|>",
    151661: "<|fim_suffix|>",
    151662: "<|fim_pad|>",
    151663: "<|repo_name|>",
    151664: "<|file_sep|>",
    151665: "<tool_response>",
    151666: "</tool_response>",
    151667: "<think>",
    151668: "</think>",
}
IM_END = 151645
ENDOFTEXT = 151643


def _token_type(text: str, markers: gguf.TokenType) -> gguf.TokenType:
    """``<|...|>`` tokens are control tokens (Qwen marks them special, and llama.cpp's
    converter would make them control either way); the others (``<think>``, ``<tool_call>``,
    ``<tool_response>`` and their ends) are ``markers``: Qwen3's tokenizer_config.json has
    them ``"special": false``, so convert_hf_to_gguf.py writes them USER_DEFINED."""
    return gguf.TokenType.CONTROL if text.startswith("<|") else markers


# GGUF value types (gguf.GGUFValueType) and their struct formats, fixed-size ones.
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9


@functools.cache
def _vocabulary() -> dict[str, Any]:
    """The key-value pairs of the vocabulary file (which has no tensors).

    Read here rather than with ``gguf.GGUFReader``, which builds a numpy view for each of the
    file's 300,000 strings and takes half a minute on a loaded machine for it."""
    data = QWEN35_VOCAB.read_bytes()
    magic, _version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", data)
    assert magic == b"GGUF" and n_tensors == 0, (magic, n_tensors)
    at = 24

    def string() -> str:
        nonlocal at
        (length,) = struct.unpack_from("<Q", data, at)
        at += 8 + length
        return data[at - length : at].decode("utf-8")

    def value(vtype: int) -> Any:
        nonlocal at
        if vtype == _STRING:
            return string()
        if vtype == _ARRAY:
            item, count = struct.unpack_from("<IQ", data, at)
            at += 12
            if item in _SCALARS:
                fmt = f"<{count}{_SCALARS[item]}"
                items = list(struct.unpack_from(fmt, data, at))
                at += struct.calcsize(fmt)
                return items
            return [value(item) for _ in range(count)]
        fmt = "<" + _SCALARS[vtype]
        (scalar,) = struct.unpack_from(fmt, data, at)
        at += struct.calcsize(fmt)
        return scalar

    fields: dict[str, Any] = {}
    for _ in range(n_kv):
        key = string()
        (vtype,) = struct.unpack_from("<I", data, at)
        at += 4
        fields[key] = value(vtype)
    return fields


def _field_value(field: gguf.ReaderField) -> tuple[Any, gguf.GGUFValueType, Any]:
    vtype = field.types[0]
    sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(field.types) > 1 else None
    return field.contents(), vtype, sub


def write_qwen35_real(
    path: Path,
    *,
    seed: int = 0,
    markers: gguf.TokenType = gguf.TokenType.USER_DEFINED,
    template: str | None = None,
) -> Path:
    """Write the model to ``path`` and return it.

    ``markers``: the token type of ``<think>``, ``<tool_call>`` and the other added tokens
    that are not ``<|...|>`` (USER_DEFINED, as llama.cpp's converter writes Qwen3's; CONTROL
    to try the engine on a GGUF that marks them so). ``template``: the chat template (Qwen3.5's
    own unless given).
    """
    arch = gguf.GGUFReader(TINY)
    vocab = _vocabulary()
    assert (vocab["tokenizer.ggml.model"], vocab["tokenizer.ggml.pre"]) == ("gpt2", "qwen35")
    tokens: list[str] = list(vocab["tokenizer.ggml.tokens"])
    types: list[int] = list(vocab["tokenizer.ggml.token_type"])
    merges: list[str] = vocab["tokenizer.ggml.merges"]
    for token_id, text in ADDED_TOKENS.items():
        assert tokens[token_id] in (text, f"[PAD{token_id}]"), (token_id, tokens[token_id])
        tokens[token_id] = text
        types[token_id] = int(_token_type(text, markers))
    n_vocab = len(tokens)

    writer = gguf.GGUFWriter(path, "qwen35")
    for key, field in arch.fields.items():
        if key.startswith(("GGUF.", "tokenizer.")) or key == "general.architecture":
            continue
        value, vtype, sub = _field_value(field)
        if vtype == gguf.GGUFValueType.ARRAY and sub is None:
            continue  # an empty array of no stated type (unused by qwen35)
        if key == "qwen35.vocab_size":
            value = n_vocab
        writer.add_key_value(key, value, vtype, sub_type=sub)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen35")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(IM_END)
    writer.add_bos_token_id(ENDOFTEXT)
    writer.add_pad_token_id(ENDOFTEXT)
    writer.add_add_bos_token(False)
    writer.add_chat_template(template if template is not None else QWEN35_TEMPLATE.read_text())

    rng = np.random.default_rng(seed)
    for tensor in arch.tensors:
        data = np.array(tensor.data)
        if tensor.name in ("token_embd.weight", "output.weight"):
            width = data.shape[-1]
            table = rng.standard_normal((n_vocab, width), dtype=np.float32) * float(data.std())
            data = table.astype(np.float16)
        writer.add_tensor(tensor.name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
