"""Images in the batched engine: gemma-3-270m with a random-weight ``gemma3`` projector
(tests/_projector.py), against llama.cpp's own multimodal path on the same files
(``mtmd_helper_eval_chunks`` on one sequence, through llama-cpp-python)."""

from __future__ import annotations

import ctypes
import io
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import numpy as np
import pytest
import trio
from llama_cpp import mtmd_cpp as mtmd
from PIL import Image as PILImage

from llmtrio.engine import (
    MEDIA_MARKER,
    ChatMessage,
    Engine,
    GenerateRequest,
    Image,
    InvalidRequestError,
    ModelLoadError,
    decode_image,
)

from .._helpers import collect, collect_logprobs, engine_config
from .._mtmd_reference import llama_reference as mtmd_reference
from .._projector import GEMMA3_IMAGE_TOKENS, write_gemma3_projector, write_qwen3vl_projector

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


LIMIT = 2**25


def picture(seed: int, size: tuple[int, int] = (48, 40)) -> Image:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return Image.of_rgb(size[0], size[1], pixels.tobytes())


def png_bytes(image: Image) -> bytes:
    out = io.BytesIO()
    PILImage.frombytes("RGB", (image.width, image.height), image.pixels()).save(out, "PNG")
    return out.getvalue()


def ask(*images: Image, text: str = "What is in the picture?", **kwargs: object) -> GenerateRequest:
    content = MEDIA_MARKER * len(images) + text
    return GenerateRequest(
        messages=[ChatMessage("user", content, media=images)],
        max_tokens=kwargs.pop("max_tokens", 8),  # type: ignore[arg-type]
        ignore_eos=True,
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def gemma3_projector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = write_gemma3_projector(tmp_path_factory.mktemp("mmproj") / "mmproj-gemma3.gguf")
    yield path
    path.unlink()


@pytest.fixture
async def vision_engine(gemma_path: Path, gemma3_projector: Path) -> AsyncIterator[Engine]:
    config = engine_config(gemma_path, mmproj=gemma3_projector, threads=1, max_inflight=2)
    async with Engine.open(config) as engine:
        yield engine


def llama_reference(
    model_path: Path, projector: Path, text: str, images: list[Image], steps: int, n_batch: int
) -> tuple[str, int, list[float]]:
    """The greedy reference on llama.cpp's multimodal helper, each image given as its pixels
    with its digest as the bitmap's id."""

    def bitmap_of(projector_ctx: object, image: Image) -> object:
        rgb = image.pixels()
        buf = (ctypes.c_uint8 * len(rgb)).from_buffer_copy(rgb)
        bitmap = mtmd.mtmd_bitmap_init(image.width, image.height, buf)
        mtmd.mtmd_bitmap_set_id(bitmap, image.digest.encode())
        return bitmap

    return mtmd_reference(
        model_path, projector, text, images, bitmap_of, steps=steps, n_batch=n_batch, n_ctx=512
    )


GEMMA_PROMPT = "<start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\n"


async def test_image_request_matches_llama_cpp_helper(
    vision_engine: Engine, gemma_path: Path, gemma3_projector: Path
) -> None:
    image = picture(1)
    text, done = await collect(vision_engine, ask(image, max_tokens=6))
    content = MEDIA_MARKER + "What is in the picture?"
    reference, prompt_len, _ = await trio.to_thread.run_sync(
        llama_reference, gemma_path, gemma3_projector, GEMMA_PROMPT.format(content), [image], 6,
        vision_engine.config.prefill_chunk + vision_engine.config.max_inflight,
    )  # fmt: skip
    assert done.prompt_tokens == prompt_len
    assert text == reference


async def test_image_tokens_counted_and_images_tell_apart(vision_engine: Engine) -> None:
    text_only = GenerateRequest(
        messages=[ChatMessage("user", "What is in the picture?")], max_tokens=8, ignore_eos=True
    )
    _, plain = await collect(vision_engine, text_only)
    one, done_one = await collect(vision_engine, ask(picture(1)))
    # the image's embeddings and its begin/end-of-image tokens
    assert done_one.prompt_tokens >= plain.prompt_tokens + GEMMA3_IMAGE_TOKENS + 2
    await collect(vision_engine, ask(picture(1), picture(2)))
    _, done_two = await collect(vision_engine, ask(picture(2), picture(1)))
    assert done_two.prompt_tokens == done_one.prompt_tokens + GEMMA3_IMAGE_TOKENS + 2
    others = {(await collect(vision_engine, ask(picture(seed))))[0] for seed in (3, 4, 5)}
    assert len(others | {one}) > 1, "different images should give different answers"


async def test_repeated_image_is_not_encoded_again(vision_engine: Engine) -> None:
    first = ask(picture(7), text="Describe it.")
    text, done = await collect(vision_engine, first)
    encodes = vision_engine.stats.image_encodes
    assert done.cached_tokens == 0
    follow = GenerateRequest(
        messages=[
            *first.messages,  # type: ignore[misc]
            ChatMessage("assistant", text),
            ChatMessage("user", "And the colours?"),
        ],
        max_tokens=4,
        ignore_eos=True,
    )
    _, again = await collect(vision_engine, follow)
    assert vision_engine.stats.image_encodes == encodes
    assert again.cached_tokens > GEMMA3_IMAGE_TOKENS
    # a different image in the same place is encoded
    other = ask(picture(8), text="Describe it.")
    await collect(vision_engine, other)
    assert vision_engine.stats.image_encodes == encodes + 1


async def test_an_image_conversation_keeps_its_prefix_when_text_takes_its_slot(
    vision_engine: Engine,
) -> None:
    """A text-only request that shares a conversation's first words takes the slot holding
    the conversation's image (the slot that holds most of it); the conversation's next turn
    still reads its prefix, image included, from the cache (issue 47: it read 8 of its 65
    prompt tokens and encoded the image again, where a text-only conversation in the same
    place keeps 387 of 403)."""
    first = ask(picture(21), text="Describe it.", max_tokens=4)
    answer, _ = await collect(vision_engine, first)
    turn2 = GenerateRequest(
        messages=[
            *first.messages,  # type: ignore[misc]
            ChatMessage("assistant", answer),
            ChatMessage("user", "And the colours?"),
        ],
        max_tokens=4,
        ignore_eos=True,
    )
    answer2, done2 = await collect(vision_engine, turn2)
    # the other request: the same first words (the template's opening), no image
    await collect(
        vision_engine,
        GenerateRequest(messages=[ChatMessage("user", "Describe a cat.")], max_tokens=4),
    )
    encodes = vision_engine.stats.image_encodes
    turn3 = GenerateRequest(
        messages=[
            *turn2.messages,  # type: ignore[misc]
            ChatMessage("assistant", answer2),
            ChatMessage("user", "And the shapes?"),
        ],
        max_tokens=4,
        ignore_eos=True,
    )
    _, done3 = await collect(vision_engine, turn3)
    assert done3.cached_tokens >= done2.prompt_tokens - 4, (done3.cached_tokens, done2)
    assert vision_engine.stats.image_encodes == encodes


async def test_images_beside_text_streams(vision_engine: Engine) -> None:
    text_only = GenerateRequest(
        messages=[ChatMessage("user", "Count to ten.")], max_tokens=12, ignore_eos=True
    )
    alone, _ = await collect(vision_engine, text_only)
    with_image, _ = await collect(vision_engine, ask(picture(11)))
    results: dict[str, str] = {}

    async def one(name: str, request: GenerateRequest) -> None:
        results[name] = (await collect(vision_engine, request))[0]

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one, "text", text_only)
        nursery.start_soon(one, "image", ask(picture(11)))
    assert results == {"text": alone, "image": with_image}


async def test_bad_image_requests_are_refused(vision_engine: Engine, gemma_path: Path) -> None:
    too_many = ask(*[picture(i, (16, 16)) for i in range(9)])
    with pytest.raises(InvalidRequestError, match="more than the 8"):
        async with vision_engine.submit(too_many):
            pass
    # the engine goes on serving
    text, _ = await collect(vision_engine, ask(picture(1), max_tokens=2))
    assert text
    async with Engine.open(engine_config(gemma_path, threads=1, max_inflight=1)) as plain:
        with pytest.raises(InvalidRequestError, match="takes no images"):
            async with plain.submit(ask(picture(1))):
                pass


def test_marker_must_match_images() -> None:
    with pytest.raises(InvalidRequestError, match="one media marker per image"):
        ChatMessage("user", "no marker", media=[picture(1)])


async def test_image_larger_than_a_decode_is_refused(tmp_path: Path, gemma_path: Path) -> None:
    # 288 / 8 / 4 = 9: 81 image tokens, beyond the engine's smallest decode (64): llama.cpp
    # would abort the process on a non-causal image split across micro-batches
    projector = write_gemma3_projector(tmp_path / "mmproj-big.gguf", image_size=288)
    config = engine_config(
        gemma_path, mmproj=projector, threads=1, max_inflight=1, prefill_chunk=16
    )
    async with Engine.open(config) as engine:
        with pytest.raises(InvalidRequestError, match="81 tokens, more than the 64"):
            async with engine.submit(ask(picture(1))):
                pass
        text, _ = await collect(engine, GenerateRequest.user("Hi", max_tokens=2))
        assert text


#: Messages as they are, one after the other (so the reference gets the same text).
PLAIN_TEMPLATE = "{% for message in messages %}{{ message.content }}{% endfor %}"


async def test_mrope_projector_matches_llama_cpp_helper(tmp_path: Path, qwen35_path: Path) -> None:
    """The hybrid qwen35 model with a qwen3vl_merger projector: image positions follow
    M-RoPE (fewer positions than tokens), and the text after an image sits where llama.cpp's
    helper puts it."""
    projector = write_qwen3vl_projector(tmp_path / "mmproj-qwen3vl.gguf")
    config = engine_config(
        qwen35_path, mmproj=projector, threads=1, max_inflight=1, chat_template=PLAIN_TEMPLATE
    )
    image = picture(5, (64, 48))
    content = "Look: " + MEDIA_MARKER + " What is it?"
    request = GenerateRequest(
        messages=[ChatMessage("user", content, media=[image])],
        max_tokens=8,
        ignore_eos=True,
        logprobs=1,
    )
    async with Engine.open(config) as engine:
        logprobs, done = await collect_logprobs(engine, request)
        n_batch = config.prefill_chunk + config.max_inflight
    reference, positions, reference_logprobs = await trio.to_thread.run_sync(
        llama_reference, qwen35_path, projector, content, [image], 8, n_batch
    )
    assert positions < done.prompt_tokens  # M-RoPE: the image takes fewer positions
    assert "".join(lp.token for lp in logprobs) == reference
    # the same batches: the same logits. The tiny random model barely minds positions: the
    # text after the image placed 8 positions off (as if M-RoPE were ignored) moves these
    # log-probabilities by 1e-5, while the two paths agree to 3e-7 (float rounding).
    assert [lp.logprob for lp in logprobs] == pytest.approx(reference_logprobs, abs=2e-6)


def test_decode_image_round_trip() -> None:
    image = picture(3)
    decoded = decode_image(png_bytes(image), max_pixels=LIMIT, param="p")
    assert (decoded.width, decoded.height) == (48, 40)
    assert decoded.pixels() == image.pixels()


#: Long enough for a snapshot (the prompt cache keeps none under 64 tokens).
LONG = "Look closely at this picture, please, and tell me everything that you can see in it: " * 3


async def test_hybrid_model_reuses_an_image_turn(tmp_path: Path, qwen35_path: Path) -> None:
    """Recurrent memory cannot be cut anywhere: the prompt is snapshotted where its last
    message ends (a hint found with the images in place), so the next turn restores the
    image from there instead of ingesting it again."""
    projector = write_qwen3vl_projector(tmp_path / "mmproj-qwen3vl.gguf")
    template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"
    config = engine_config(
        qwen35_path, mmproj=projector, threads=1, max_inflight=1, chat_template=template
    )
    first = GenerateRequest(
        messages=[ChatMessage("user", LONG + MEDIA_MARKER + " What?", media=[picture(6)])],
        max_tokens=4,
        ignore_eos=True,
    )
    async with Engine.open(config) as engine:
        text, done = await collect(engine, first)
        follow = GenerateRequest(
            messages=[
                *first.messages,  # type: ignore[misc]
                ChatMessage("assistant", text),
                ChatMessage("user", "And?"),
            ],
            max_tokens=4,
            ignore_eos=True,
        )
        _, again = await collect(engine, follow)
    assert done.cached_tokens == 0
    # restored where the first turn's user message ended (image and all)
    assert done.prompt_tokens - 4 <= again.cached_tokens < done.prompt_tokens


async def test_a_projector_of_another_width_is_refused_at_load(
    tmp_path: Path, gemma_path: Path
) -> None:
    projector = write_gemma3_projector(tmp_path / "mmproj-256.gguf", text_width=256)
    config = engine_config(gemma_path, mmproj=projector, threads=1, max_inflight=1)
    with pytest.raises(ModelLoadError, match="cannot load the projector"):
        async with Engine.open(config):
            pass
