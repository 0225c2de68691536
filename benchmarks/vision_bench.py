"""What an image costs in the batched engine, on gemma-3-270m with a random-weight ``gemma3``
projector (``tests/_projector.py``) sized by ``--width``/``--blocks``/``--image-size`` (the
encode is a SigLIP-style ViT over (image_size / 8) ** 2 patches):

- the projector's encode time per image, and TTFT of one image request alone;
- turn 2 of a conversation repeating the image: TTFT against turn 1 (no second encode);
- the gaps between tokens of ``--streams`` text streams already decoding, p50 and p95, with
  ``--images`` image requests arriving meanwhile, against none (the encode runs on the decode
  thread between two steps: every stream waits for it).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/vision_bench.py --threads 1
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _token_gaps import count_and_time

from llmtrio.engine import (
    MEDIA_MARKER,
    ChatMessage,
    Engine,
    EngineConfig,
    GenerateRequest,
    Token,
    decode_image,
    demo_model_path,
)


def _image(seed: int) -> bytes:
    from PIL import Image as PILImage

    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    PILImage.fromarray(rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)).save(out, "PNG")
    return out.getvalue()


def _ask(seed: int, max_tokens: int = 4) -> GenerateRequest:
    image = decode_image(_image(seed), max_pixels=2**25, param="image")
    return GenerateRequest(
        messages=[ChatMessage("user", MEDIA_MARKER + "Describe it.", media=[image])],
        max_tokens=max_tokens,
        ignore_eos=True,
    )


async def _ttft(engine: Engine, request: GenerateRequest) -> tuple[float, str, int]:
    started = time.perf_counter()
    first = 0.0
    text = []
    cached = 0
    async with engine.submit(request) as generation:
        async for event in generation:
            if isinstance(event, Token):
                first = first or time.perf_counter() - started
                text.append(event.text)
            else:
                cached = getattr(event, "cached_tokens", 0)
    return first, "".join(text), cached


async def _gaps(engine: Engine, streams: int, tokens: int, images: int) -> list[float]:
    gaps: list[float] = []

    async def stream(i: int) -> None:
        await count_and_time(engine, i, tokens, gaps)

    async def arrivals(seed: int) -> None:
        await trio.sleep(0.3)
        for k in range(images):
            await _ttft(engine, _ask(seed + k))

    async with trio.open_nursery() as nursery:
        for i in range(streams):
            nursery.start_soon(stream, i)
        if images:
            nursery.start_soon(arrivals, 1000 + streams)
    return gaps


def _ms(values: list[float], q: float) -> float:
    return float(np.quantile(values, q) * 1000) if values else float("nan")


async def _main(args: argparse.Namespace) -> None:
    from tests._projector import write_gemma3_projector

    with tempfile.TemporaryDirectory() as folder:
        projector = write_gemma3_projector(
            Path(folder) / "mmproj.gguf",
            width=args.width,
            blocks=args.blocks,
            image_size=args.image_size,
        )
        config = EngineConfig(
            model=demo_model_path(),
            mmproj=projector,
            threads=args.threads,
            max_inflight=args.streams + 1,
            spec=None,
            prefill_chunk=max(256, (args.image_size // 32) ** 2),
        )
        async with Engine.open(config) as engine:
            await _ttft(engine, _ask(0))  # warm up
            stats = engine.stats
            before = (stats.image_encodes, stats.image_encode_s)
            first, answer, _ = await _ttft(engine, _ask(1))
            encode_ms = (stats.image_encode_s - before[1]) / (stats.image_encodes - before[0])
            follow = GenerateRequest(
                messages=[
                    *_ask(1).messages,  # type: ignore[misc]
                    ChatMessage("assistant", answer),
                    ChatMessage("user", "More."),
                ],
                max_tokens=4,
                ignore_eos=True,
            )
            second, _, cached = await _ttft(engine, follow)
            print(f"image tokens: {(args.image_size // 32) ** 2}")
            print(f"encode per image: {encode_ms * 1000:.1f} ms")
            print(f"TTFT turn 1 (encode): {first * 1000:.1f} ms")
            print(f"TTFT turn 2 (same image, {cached} cached tokens): {second * 1000:.1f} ms")
            for images in (0, args.images):
                gaps = []
                for _ in range(args.rounds):
                    gaps += await _gaps(engine, args.streams, args.tokens, images)
                print(
                    f"{args.streams} streams, {images} image requests: gap p50 "
                    f"{_ms(gaps, 0.5):.1f} ms, p95 {_ms(gaps, 0.95):.1f} ms, max "
                    f"{max(gaps) * 1000:.1f} ms ({len(gaps)} gaps)"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--images", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--image-size", type=int, default=448)
    trio.run(_main, parser.parse_args())


if __name__ == "__main__":
    main()
