"""Reranking test models (cross-encoders), written with ``gguf`` at test time: nothing is
downloaded, nothing large is committed.

- :func:`write_minilm_reranker`: ``data/all-MiniLM-L6-v2-Q8_0.gguf`` (BERT, a real WordPiece
  vocabulary of 30,522 entries) copied with rank pooling (``bert.pooling_type`` 4,
  ``LLAMA_POOLING_TYPE_RANK``), one output label and a random classification head: ``cls``
  (384 x 384 and a bias, then tanh) and ``cls.output`` (1 x 384 and a bias). That is the
  layout of the ms-marco MiniLM cross-encoders (BertForSequenceClassification: the pooler's
  dense layer and tanh over the ``[CLS]`` state, then the classifier), which llama.cpp computes
  as ``Wo·tanh(Wc·h_cls + bc) + bo`` (``llm_graph_context::build_pooling``, 0.3.36's vendored
  sources). Its scores are that logit, as llama.cpp's server gives them.
- :func:`write_qwen3_reranker`: a tiny random Qwen3 (llama.cpp's ``qwen3``: 2 layers, width
  64) with Qwen's byte-level BPE vocabulary (``data/ggml-vocab-qwen35.gguf`` and the added
  tokens of ``_qwen35_real``), laid out as llama.cpp's converter writes Qwen3-Reranker
  (``conversion/qwen.py``): rank pooling, the labels ``yes`` and ``no``, ``cls.output`` holding
  the two labels' rows (2 x 64), no ``cls``, and the ``rerank`` chat template with ``{query}``
  and ``{document}``. llama.cpp pools its last token and takes the softmax over the two rows:
  the score is the probability of ``yes``.

``pooling`` writes the same model with another pooling (CLS for the encoder, last for the
decoder): an embedding model whose vector is the hidden state the head reads, so a test can
compute the head in NumPy over the model's own state (:func:`head_weights` gives the head).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np

from ._qwen35_real import ADDED_TOKENS, ENDOFTEXT, IM_END, _token_type, _vocabulary

__all__ = [
    "MINILM",
    "QWEN3_RERANK_TEMPLATE",
    "RANK",
    "head_weights",
    "write_minilm_reranker",
    "write_qwen3_reranker",
]

DATA = Path(__file__).resolve().parent / "data"
MINILM = DATA / "all-MiniLM-L6-v2-Q8_0.gguf"
#: llama.cpp's ``enum llama_pooling_type``.
CLS, LAST, RANK = 2, 3, 4
#: The template llama.cpp's converter writes for Qwen3-Reranker (``conversion/qwen.py``).
QWEN3_RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that "
    "answer the query\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n"
)
_QWEN3 = {
    "context_length": 512,
    "embedding_length": 64,
    "block_count": 2,
    "feed_forward_length": 128,
    "head_count": 4,
    "head_count_kv": 2,
    "head_dim": 16,
}


def _random(rng: np.random.Generator, *shape: int, scale: float) -> np.ndarray[Any, Any]:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def head_weights(path: Path, *, from_gguf: bool = False) -> dict[str, np.ndarray[Any, Any]]:
    """The classification head a writer below put in ``path``: ``cls.weight``,
    ``cls.bias``, ``cls.output.weight`` and ``cls.output.bias`` as it has them, in NumPy's
    shapes (rows are outputs: ``cls.output.weight`` is labels x width). Read from the arrays
    the writer saved beside the GGUF (``.head.npz``), or with ``from_gguf`` from the GGUF
    itself (gguf's reader parses the whole vocabulary first: half a minute for Qwen3's)."""
    if not from_gguf:
        with np.load(_head_path(path)) as saved:
            return {name: saved[name] for name in saved.files}
    reader = gguf.GGUFReader(path)
    return {
        t.name: np.array(t.data, dtype=np.float32)
        for t in reader.tensors
        if t.name.startswith("cls.")
    }


def _head_path(path: Path) -> Path:
    return path.with_suffix(".head.npz")


def _add_head(
    writer: gguf.GGUFWriter, head: dict[str, np.ndarray[Any, Any]], name: str, array: Any
) -> None:
    writer.add_tensor(name, array)
    head[name] = np.asarray(array, dtype=np.float32)


def write_minilm_reranker(
    path: Path, *, seed: int = 0, pooling: int = RANK, dequantize: bool = False
) -> Path:
    """MiniLM as a cross-encoder (see the module's doc) at ``path``; ``pooling`` CLS writes
    the same weights as an embedding model of the ``[CLS]`` state. ``dequantize`` writes its
    Q8_0 tensors as F32."""
    source = gguf.GGUFReader(MINILM)
    writer = gguf.GGUFWriter(path, "bert")
    for key, field in source.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if key == "bert.pooling_type":
            value = pooling
        if key == "general.name":
            value = "MiniLM L6 H384 cross-encoder (random head)"
        writer.add_key_value(key, value, vtype, sub_type=sub)
    writer.add_classifier_output_labels(["LABEL_0"])
    for tensor in source.tensors:
        if dequantize and tensor.tensor_type == gguf.GGMLQuantizationType.Q8_0:
            weights = gguf.quants.dequantize(np.array(tensor.data), tensor.tensor_type)
            writer.add_tensor(tensor.name, weights.astype(np.float32))
            continue
        writer.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=tensor.tensor_type)
    rng = np.random.default_rng(seed)
    width = 384
    head: dict[str, np.ndarray[Any, Any]] = {}
    _add_head(writer, head, "cls.weight", _random(rng, width, width, scale=0.1))
    _add_head(writer, head, "cls.bias", _random(rng, width, scale=0.1))
    _add_head(writer, head, "cls.output.weight", _random(rng, 1, width, scale=0.1))
    _add_head(writer, head, "cls.output.bias", _random(rng, 1, scale=0.1))
    _finish(writer)
    np.savez(_head_path(path), **head)
    return path


def write_qwen3_reranker(path: Path, *, seed: int = 0, pooling: int = RANK) -> Path:
    """The tiny Qwen3 reranker (see the module's doc) at ``path``; ``pooling`` LAST writes
    the same weights as an embedding model of the last token's state."""
    vocab = _vocabulary()
    tokens: list[str] = list(vocab["tokenizer.ggml.tokens"])
    types: list[int] = list(vocab["tokenizer.ggml.token_type"])
    for token_id, text in ADDED_TOKENS.items():
        tokens[token_id] = text
        types[token_id] = int(_token_type(text, gguf.TokenType.USER_DEFINED))
    n_vocab = len(tokens)
    shape = _QWEN3
    width, heads, kv_heads, head_dim = (
        shape["embedding_length"],
        shape["head_count"],
        shape["head_count_kv"],
        shape["head_dim"],
    )

    writer = gguf.GGUFWriter(path, "qwen3")
    writer.add_name("Qwen3 reranker, tiny and random")
    writer.add_context_length(shape["context_length"])
    writer.add_embedding_length(width)
    writer.add_block_count(shape["block_count"])
    writer.add_feed_forward_length(shape["feed_forward_length"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_pooling_type(gguf.PoolingType(pooling))
    writer.add_classifier_output_labels(["yes", "no"])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen35")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(vocab["tokenizer.ggml.merges"])
    writer.add_eos_token_id(IM_END)
    writer.add_bos_token_id(ENDOFTEXT)
    writer.add_pad_token_id(ENDOFTEXT)
    writer.add_add_bos_token(False)
    writer.add_chat_template([{"name": "rerank", "template": QWEN3_RERANK_TEMPLATE}])

    rng = np.random.default_rng(seed)
    writer.add_tensor(
        "token_embd.weight", _random(rng, n_vocab, width, scale=1.0).astype(np.float16)
    )
    writer.add_tensor("output_norm.weight", np.ones(width, dtype=np.float32))
    ffn = shape["feed_forward_length"]
    for block in range(shape["block_count"]):
        prefix = f"blk.{block}"
        for name in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"{prefix}.{name}.weight", np.ones(width, dtype=np.float32))
        for name in ("attn_q_norm", "attn_k_norm"):
            writer.add_tensor(f"{prefix}.{name}.weight", np.ones(head_dim, dtype=np.float32))
        matrices = {
            "attn_q": (heads * head_dim, width),
            "attn_k": (kv_heads * head_dim, width),
            "attn_v": (kv_heads * head_dim, width),
            "attn_output": (width, heads * head_dim),
            "ffn_gate": (ffn, width),
            "ffn_up": (ffn, width),
            "ffn_down": (width, ffn),
        }
        for name, (rows, columns) in matrices.items():
            weights = _random(rng, rows, columns, scale=1 / np.sqrt(columns))
            writer.add_tensor(f"{prefix}.{name}.weight", weights)
    # the rows of "yes" and "no", as the converter takes them from the output head
    head: dict[str, np.ndarray[Any, Any]] = {}
    _add_head(writer, head, "cls.output.weight", _random(rng, 2, width, scale=0.3))
    _finish(writer)
    np.savez(_head_path(path), **head)
    return path


def _finish(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
