"""Random-weight vision projectors (``mmproj`` GGUF files) for the test models, written with
``gguf`` at test time.

The test suite cannot download a vision model, so this writes the smallest projector of a type
llama.cpp's multimodal library supports whose output width matches a test model's:

- :func:`write_gemma3_projector`: llama.cpp's ``gemma3`` projector (a SigLIP-style ViT with
  learned position embeddings, average pooling of the patch grid by ``scale_factor``, an RMS
  "soft embedding" norm and an input projection to the text model's width), with tiny vision
  dimensions and a 640-wide output: it pairs with google/gemma-3-270m, whose vocabulary has
  Gemma 3's ``<start_of_image>`` and ``<end_of_image>``. llama.cpp decodes Gemma 3's image
  tokens with non-causal attention (``mtmd_decode_use_non_causal``).
- :func:`write_qwen3vl_projector`: Qwen3-VL's ``qwen3vl_merger`` (2x2 patch merge, M-RoPE
  image positions), 256 wide, for ``data/qwen35-tiny-random.gguf``.
- :func:`write_qwen2a_projector`: Qwen2-Audio's ``qwen2a`` audio projector (a Whisper encoder:
  two 1-D convolutions over the log-mel spectrogram, the second with stride 2, learned
  positions, pre-norm blocks, average pooling by 2, and one linear layer to the text model's
  width), tiny, 256 wide for the qwen35 tiny model: every 30-second window of audio (a
  shorter file is padded to one) is 3,000 mel frames, 1,500 after the convolutions and
  :data:`QWEN2A_WINDOW_TOKENS` (750) embeddings after the pooling.

Key names and tensor layouts are those of llama.cpp's ``tools/mtmd/clip-impl.h`` and
``clip.cpp`` (0.3.36's vendored sources) and ``gguf-py``'s constants. Shapes below are numpy's
(the reverse of ggml's ``ne``). The weights are random (seeded): an image's embeddings are noise
the text model has never seen, but they are deterministic, and two different images give
different embeddings, which is all the tests need.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

__all__ = [
    "GEMMA3_IMAGE_TOKENS",
    "QWEN2A_WINDOW_TOKENS",
    "write_gemma3_projector",
    "write_qwen2a_projector",
    "write_qwen3vl_projector",
]

#: The embeddings of one 30-second window of audio through the ``qwen2a`` projector.
QWEN2A_WINDOW_TOKENS = 750

# the gemma3 projector below: a 64x64 image in 8-pixel patches is an 8x8 grid, pooled by 4 to
# 2x2... too few to tell images apart reliably; 128 / 8 = 16x16 patches pooled by 4 is 16 tokens
_GEMMA3_IMAGE_SIZE = 128
_GEMMA3_PATCH = 8
_GEMMA3_SCALE = 4
GEMMA3_IMAGE_TOKENS = (_GEMMA3_IMAGE_SIZE // _GEMMA3_PATCH // _GEMMA3_SCALE) ** 2


def _random(rng: np.random.Generator, *shape: int, scale: float = 0.02) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _vit_tensors(
    writer: gguf.GGUFWriter,
    rng: np.random.Generator,
    *,
    width: int,
    ffn: int,
    blocks: int,
    patch: int,
    n_positions: int,
    patch_embd_count: int = 1,
    fused_qkv: bool = False,
) -> None:
    """The SigLIP/ViT encoder llama.cpp's ``build_vit`` reads: patch embedding (a conv of
    ``patch`` x ``patch`` x 3 -> ``width``), learned positions, pre-norm blocks with biased
    attention and a GELU MLP, and a final layer norm."""
    # ggml ne = [patch, patch, 3, width]: numpy (width, 3, patch, patch)
    writer.add_tensor("v.patch_embd.weight", _random(rng, width, 3, patch, patch, scale=0.2))
    if patch_embd_count == 2:
        writer.add_tensor("v.patch_embd.weight.1", _random(rng, width, 3, patch, patch, scale=0.2))
    writer.add_tensor("v.patch_embd.bias", _random(rng, width))
    writer.add_tensor("v.position_embd.weight", _random(rng, n_positions, width, scale=0.2))
    for block in range(blocks):
        prefix = f"v.blk.{block}"
        if fused_qkv:
            writer.add_tensor(
                f"{prefix}.attn_qkv.weight", _random(rng, 3 * width, width, scale=0.2)
            )
            writer.add_tensor(f"{prefix}.attn_qkv.bias", _random(rng, 3 * width))
        names = ("attn_out",) if fused_qkv else ("attn_q", "attn_k", "attn_v", "attn_out")
        for name in names:
            writer.add_tensor(f"{prefix}.{name}.weight", _random(rng, width, width, scale=0.2))
            writer.add_tensor(f"{prefix}.{name}.bias", _random(rng, width))
        for name in ("ln1", "ln2"):
            writer.add_tensor(f"{prefix}.{name}.weight", np.ones(width, dtype=np.float32))
            writer.add_tensor(f"{prefix}.{name}.bias", np.zeros(width, dtype=np.float32))
        writer.add_tensor(f"{prefix}.ffn_up.weight", _random(rng, ffn, width, scale=0.2))
        writer.add_tensor(f"{prefix}.ffn_up.bias", _random(rng, ffn))
        writer.add_tensor(f"{prefix}.ffn_down.weight", _random(rng, width, ffn, scale=0.2))
        writer.add_tensor(f"{prefix}.ffn_down.bias", _random(rng, width))


def _vision_header(
    writer: gguf.GGUFWriter,
    *,
    projector_type: str,
    width: int,
    ffn: int,
    blocks: int,
    heads: int,
    image_size: int,
    patch: int,
    projection_dim: int,
) -> None:
    writer.add_string("general.name", f"llmtrio test projector ({projector_type})")
    writer.add_string("general.file_type_name", "F32")
    writer.add_bool(gguf.Keys.Clip.HAS_VISION_ENCODER, True)
    writer.add_bool(gguf.Keys.Clip.HAS_AUDIO_ENCODER, False)
    writer.add_string(gguf.Keys.Clip.PROJECTOR_TYPE, projector_type)
    writer.add_bool(gguf.Keys.ClipVision.USE_GELU, True)
    writer.add_uint32(gguf.Keys.ClipVision.EMBEDDING_LENGTH, width)
    writer.add_uint32(gguf.Keys.ClipVision.FEED_FORWARD_LENGTH, ffn)
    writer.add_uint32(gguf.Keys.ClipVision.BLOCK_COUNT, blocks)
    writer.add_uint32(gguf.Keys.ClipVision.Attention.HEAD_COUNT, heads)
    writer.add_float32(gguf.Keys.ClipVision.Attention.LAYERNORM_EPS, 1e-6)
    writer.add_uint32(gguf.Keys.ClipVision.IMAGE_SIZE, image_size)
    writer.add_uint32(gguf.Keys.ClipVision.PATCH_SIZE, patch)
    writer.add_uint32(gguf.Keys.ClipVision.PROJECTION_DIM, projection_dim)
    writer.add_array(gguf.Keys.ClipVision.IMAGE_MEAN, [0.5, 0.5, 0.5])
    writer.add_array(gguf.Keys.ClipVision.IMAGE_STD, [0.5, 0.5, 0.5])


def write_gemma3_projector(
    path: Path,
    *,
    text_width: int = 640,
    image_size: int = _GEMMA3_IMAGE_SIZE,
    seed: int = 0,
    width: int = 32,
    blocks: int = 2,
) -> Path:
    """Write a random ``gemma3`` projector to ``path`` (about 1 MB) and return it.

    ``text_width`` is the text model's embedding width (gemma-3-270m's is 640). An image,
    resized to 128x128, is 16x16 patches pooled 4x4 to :data:`GEMMA3_IMAGE_TOKENS` (16)
    embeddings (``image_size`` changes that: (image_size / 32) ** 2 tokens). ``width`` and
    ``blocks`` size the encoder (benchmarks make it costlier)."""
    ffn, heads = 2 * width, 2
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "clip")
    _vision_header(
        writer,
        projector_type="gemma3",
        width=width,
        ffn=ffn,
        blocks=blocks,
        heads=heads,
        image_size=image_size,
        patch=_GEMMA3_PATCH,
        projection_dim=text_width,
    )
    writer.add_uint32(gguf.Keys.ClipVision.Projector.SCALE_FACTOR, _GEMMA3_SCALE)
    n_patches = (image_size // _GEMMA3_PATCH) ** 2
    _vit_tensors(
        writer, rng, width=width, ffn=ffn, blocks=blocks, patch=_GEMMA3_PATCH,
        n_positions=n_patches,
    )  # fmt: skip
    writer.add_tensor("v.post_ln.weight", np.ones(width, dtype=np.float32))
    writer.add_tensor("v.post_ln.bias", np.zeros(width, dtype=np.float32))
    writer.add_tensor("mm.soft_emb_norm.weight", np.ones(width, dtype=np.float32))
    # ggml ne = [text_width, width] (clip.cpp multiplies by its transpose)
    writer.add_tensor("mm.input_projection.weight", _random(rng, width, text_width, scale=1.0))
    _finish(writer)
    return path


def write_qwen3vl_projector(path: Path, *, text_width: int = 256, seed: int = 0) -> Path:
    """Write a random ``qwen3vl_merger`` projector to ``path`` and return it: a ViT whose
    2x2-merged patches go through a two-layer MLP to ``text_width`` (the qwen35 tiny model's
    256), with M-RoPE image positions in the text model."""
    width, ffn, blocks, heads, patch, merge = 32, 64, 2, 2, 16, 2
    image_size = 256
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "clip")
    _vision_header(
        writer,
        projector_type="qwen3vl_merger",
        width=width,
        ffn=ffn,
        blocks=blocks,
        heads=heads,
        image_size=image_size,
        patch=patch,
        projection_dim=text_width,
    )
    writer.add_uint32(gguf.Keys.ClipVision.SPATIAL_MERGE_SIZE, merge)
    writer.add_uint32(gguf.Keys.ClipVision.IMAGE_MIN_PIXELS, 4 * (patch * merge) ** 2)
    writer.add_uint32(gguf.Keys.ClipVision.IMAGE_MAX_PIXELS, 64 * (patch * merge) ** 2)
    writer.add_array(gguf.Keys.ClipVision.IS_DEEPSTACK_LAYERS, [False] * blocks)
    n_positions = (image_size // patch) ** 2
    _vit_tensors(
        writer, rng, width=width, ffn=ffn, blocks=blocks, patch=patch,
        n_positions=n_positions, patch_embd_count=2, fused_qkv=True,
    )  # fmt: skip
    writer.add_tensor("v.post_ln.weight", np.ones(width, dtype=np.float32))
    writer.add_tensor("v.post_ln.bias", np.zeros(width, dtype=np.float32))
    merged = width * merge * merge
    writer.add_tensor("mm.0.weight", _random(rng, merged, merged, scale=0.1))
    writer.add_tensor("mm.0.bias", _random(rng, merged))
    writer.add_tensor("mm.2.weight", _random(rng, text_width, merged, scale=0.5))
    writer.add_tensor("mm.2.bias", _random(rng, text_width))
    _finish(writer)
    return path


def write_qwen2a_projector(
    path: Path,
    *,
    text_width: int = 256,
    seed: int = 0,
    width: int = 32,
    blocks: int = 2,
    heads: int = 2,
    n_mel: int = 128,
) -> Path:
    """Write a random ``qwen2a`` audio projector to ``path`` and return it (``width`` and
    ``blocks`` size the Whisper encoder: benchmarks make it costlier; Qwen2-Audio's has 128
    mel bins). llama.cpp reads it as clip.cpp's ``PROJECTOR_TYPE_QWEN2A``: 16 kHz audio,
    30-second windows, :data:`QWEN2A_WINDOW_TOKENS` embeddings each."""
    ffn = 2 * width
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_string("general.name", "llmtrio test projector (qwen2a)")
    writer.add_string("general.file_type_name", "F32")
    writer.add_bool(gguf.Keys.Clip.HAS_VISION_ENCODER, False)
    writer.add_bool(gguf.Keys.Clip.HAS_AUDIO_ENCODER, True)
    writer.add_string(gguf.Keys.Clip.PROJECTOR_TYPE, "qwen2a")
    writer.add_uint32(gguf.Keys.ClipAudio.EMBEDDING_LENGTH, width)
    writer.add_uint32(gguf.Keys.ClipAudio.FEED_FORWARD_LENGTH, ffn)
    writer.add_uint32(gguf.Keys.ClipAudio.BLOCK_COUNT, blocks)
    writer.add_uint32(gguf.Keys.ClipAudio.Attention.HEAD_COUNT, heads)
    writer.add_float32(gguf.Keys.ClipAudio.Attention.LAYERNORM_EPS, 1e-5)
    writer.add_uint32(gguf.Keys.ClipAudio.PROJECTION_DIM, text_width)
    writer.add_uint32(gguf.Keys.ClipAudio.NUM_MEL_BINS, n_mel)
    # ggml ne = [3, n_mel, width]: numpy (width, n_mel, 3); the biases (width, 1), as
    # convert_hf_to_gguf's WhisperEncoderModel writes them
    writer.add_tensor("a.conv1d.1.weight", _random(rng, width, n_mel, 3, scale=0.2))
    writer.add_tensor("a.conv1d.1.bias", _random(rng, width, 1))
    writer.add_tensor("a.conv1d.2.weight", _random(rng, width, width, 3, scale=0.2))
    writer.add_tensor("a.conv1d.2.bias", _random(rng, width, 1))
    writer.add_tensor("a.position_embd.weight", _random(rng, 1500, width, scale=0.2))
    for block in range(blocks):
        prefix = f"a.blk.{block}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            writer.add_tensor(f"{prefix}.{name}.weight", _random(rng, width, width, scale=0.2))
            if name != "attn_k":  # Whisper's key projection has no bias
                writer.add_tensor(f"{prefix}.{name}.bias", _random(rng, width))
        for name in ("ln1", "ln2"):
            writer.add_tensor(f"{prefix}.{name}.weight", np.ones(width, dtype=np.float32))
            writer.add_tensor(f"{prefix}.{name}.bias", np.zeros(width, dtype=np.float32))
        writer.add_tensor(f"{prefix}.ffn_up.weight", _random(rng, ffn, width, scale=0.2))
        writer.add_tensor(f"{prefix}.ffn_up.bias", _random(rng, ffn))
        writer.add_tensor(f"{prefix}.ffn_down.weight", _random(rng, width, ffn, scale=0.2))
        writer.add_tensor(f"{prefix}.ffn_down.bias", _random(rng, width))
    writer.add_tensor("a.post_ln.weight", np.ones(width, dtype=np.float32))
    writer.add_tensor("a.post_ln.bias", np.zeros(width, dtype=np.float32))
    writer.add_tensor("mm.a.fc.weight", _random(rng, text_width, width, scale=1.0))
    writer.add_tensor("mm.a.fc.bias", _random(rng, text_width))
    _finish(writer)
    return path


def _finish(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
