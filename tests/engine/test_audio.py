"""Audio in the batched engine: the qwen35 tiny model with a random-weight ``qwen2a`` (Whisper
encoder) projector (tests/_projector.py), against llama.cpp's own multimodal path on the same
files (``mtmd_helper_bitmap_init_from_buf`` and ``mtmd_helper_eval_chunks`` on one sequence,
through llama-cpp-python); and the header checks that refuse bad audio before decoding."""

from __future__ import annotations

import ctypes
import struct
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import numpy as np
import pytest
import trio
from llama_cpp import mtmd_cpp as mtmd

from llmtrio.engine import (
    MEDIA_MARKER,
    Audio,
    ChatMessage,
    Engine,
    GenerateRequest,
    InvalidRequestError,
    decode_audio,
)

from .._audio import encode, noise, silence, tone
from .._helpers import collect, collect_logprobs, engine_config
from .._mtmd_reference import llama_reference as mtmd_reference
from .._projector import QWEN2A_WINDOW_TOKENS, write_gemma3_projector, write_qwen2a_projector

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

#: Messages as they are, one after the other (so the reference gets the same text).
PLAIN_TEMPLATE = "{% for message in messages %}{{ message.content }}{% endfor %}"
#: Roles before each message: the last message starts past the prompt's start, so a hybrid
#: model's prompt is snapshotted where it starts and ends (the prompt cache's hints).
ROLES_TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"
LIMIT = 600.0


def audio(data: bytes, param: str = "audio") -> Audio:
    return decode_audio(data, max_seconds=LIMIT, param=param)


def ask(*files: Audio, text: str = " What is said?", **kwargs: object) -> GenerateRequest:
    return GenerateRequest(
        messages=[ChatMessage("user", "Listen: " + MEDIA_MARKER * len(files) + text, media=files)],
        max_tokens=kwargs.pop("max_tokens", 6),  # type: ignore[arg-type]
        ignore_eos=True,
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def qwen2a_projector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = write_qwen2a_projector(tmp_path_factory.mktemp("mmproj") / "mmproj-qwen2a.gguf")
    yield path
    path.unlink()


@pytest.fixture
async def audio_engine(qwen35_path: Path, qwen2a_projector: Path) -> AsyncIterator[Engine]:
    config = engine_config(
        qwen35_path, mmproj=qwen2a_projector, threads=1, max_inflight=2,
        chat_template=ROLES_TEMPLATE, ctx_size=4096,
    )  # fmt: skip
    async with Engine.open(config) as engine:
        yield engine


def llama_reference(
    model_path: Path, projector: Path, text: str, files: list[bytes], steps: int, n_batch: int
) -> tuple[str, int, list[float]]:
    """The greedy reference on llama.cpp's multimodal helper, each file read by
    ``mtmd_helper_bitmap_init_from_buf`` (as llama-server reads it)."""

    def bitmap_of(projector_ctx: object, data: bytes) -> object:
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        return mtmd.mtmd_helper_bitmap_init_from_buf(projector_ctx, buf, len(data), False)

    return mtmd_reference(
        model_path, projector, text, files, bitmap_of, steps=steps, n_batch=n_batch, n_ctx=4096
    )


@pytest.mark.parametrize("prefill_chunk", [256, 1024])
async def test_audio_request_matches_llama_cpp_helper(
    qwen35_path: Path, qwen2a_projector: Path, prefill_chunk: int
) -> None:
    """2 s of audio is one 30-second window: 750 embeddings. With a prefill chunk of 256
    they are ingested in three prompt chunks of their own (256, 256, 238), as llama.cpp's
    helper decodes them in batches of 256; with 1024, whole. Either way the same greedy
    tokens and log-probabilities as llama.cpp's own path on the same file."""
    data = encode(tone(440, 2.0), "wav")
    config = engine_config(
        qwen35_path, mmproj=qwen2a_projector, threads=1, max_inflight=1,
        chat_template=PLAIN_TEMPLATE, ctx_size=2048, prefill_chunk=prefill_chunk,
    )  # fmt: skip
    request = ask(audio(data), max_tokens=8, logprobs=1)
    async with Engine.open(config) as engine:
        logprobs, done = await collect_logprobs(engine, request)
        assert engine.stats.audio_encodes == 1
    content = request.messages[0].content  # type: ignore[index]
    reference, positions, reference_logprobs = await trio.to_thread.run_sync(
        llama_reference, qwen35_path, qwen2a_projector, content, [data], 8, prefill_chunk
    )
    assert done.audio_tokens == QWEN2A_WINDOW_TOKENS
    assert done.prompt_tokens == positions  # one position per audio token
    assert "".join(lp.token for lp in logprobs) == reference
    assert [lp.logprob for lp in logprobs] == pytest.approx(reference_logprobs, abs=2e-6)


async def test_formats_and_windows(audio_engine: Engine) -> None:
    """WAV, MP3 and FLAC of one tone are read; 40 s is two windows (1,500 audio tokens)."""
    windows = {}
    for fmt in ("wav", "mp3", "flac"):
        _, done = await collect(audio_engine, ask(audio(encode(tone(440, 2.0), fmt))))
        windows[fmt] = done.audio_tokens
    assert windows == {"wav": 750, "mp3": 750, "flac": 750}
    _, long = await collect(audio_engine, ask(audio(encode(tone(300, 40.0), "flac"))))
    assert long.audio_tokens == 2 * QWEN2A_WINDOW_TOKENS


async def test_different_audio_gives_different_answers(tmp_path: Path, gemma_path: Path) -> None:
    """On gemma-3-270m (real weights: the tiny random qwen35 model barely minds its input)
    with a 640-wide ``qwen2a`` projector: a tone, noise, silence and a loud tone."""
    projector = write_qwen2a_projector(tmp_path / "mmproj-qwen2a-640.gguf", text_width=640)
    config = engine_config(gemma_path, mmproj=projector, threads=1, max_inflight=1, ctx_size=1024)
    answers = set()
    async with Engine.open(config) as engine:
        for samples in (tone(440, 3.0), noise(3.0), silence(3.0), tone(1000, 3.0, amplitude=0.9)):
            answers.add((await collect(engine, ask(audio(encode(samples, "wav")))))[0])
    assert len(answers) == 4, "different audio should give different answers"


async def test_repeated_audio_is_not_encoded_again(audio_engine: Engine) -> None:
    first = ask(audio(encode(tone(523, 35.0), "wav")), text=" Transcribe it.")
    text, done = await collect(audio_engine, first)
    encodes = audio_engine.stats.audio_encodes
    assert done.cached_tokens == 0 and done.audio_tokens == 2 * QWEN2A_WINDOW_TOKENS
    follow = GenerateRequest(
        messages=[
            *first.messages,  # type: ignore[misc]
            ChatMessage("assistant", text),
            ChatMessage("user", " And the speaker?"),
        ],
        max_tokens=4,
        ignore_eos=True,
    )
    _, again = await collect(audio_engine, follow)
    assert audio_engine.stats.audio_encodes == encodes  # both windows from the cache
    assert again.cached_tokens > 2 * QWEN2A_WINDOW_TOKENS
    # the same audio once more in a new request: its windows' embeddings are cached too
    await collect(audio_engine, ask(audio(encode(tone(523, 35.0), "wav")), text=" Again."))
    assert audio_engine.stats.audio_encodes == encodes
    await collect(audio_engine, ask(audio(encode(tone(659, 35.0), "wav")), text=" Again."))
    assert audio_engine.stats.audio_encodes == encodes + 2


async def test_audio_beside_text_streams(audio_engine: Engine) -> None:
    text_only = GenerateRequest(
        messages=[ChatMessage("user", "Count to ten.")], max_tokens=12, ignore_eos=True
    )
    alone, _ = await collect(audio_engine, text_only)
    with_audio, _ = await collect(audio_engine, ask(audio(encode(noise(4.0, seed=3), "wav"))))
    results: dict[str, str] = {}

    async def one(name: str, request: GenerateRequest) -> None:
        results[name] = (await collect(audio_engine, request))[0]

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one, "text", text_only)
        nursery.start_soon(one, "audio", ask(audio(encode(noise(4.0, seed=3), "wav"))))
    assert results == {"text": alone, "audio": with_audio}


async def test_a_cancelled_request_stops_encoding_between_windows(
    audio_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four windows of audio: the request is cancelled while the first is encoded; the
    preparing thread encodes no other."""
    projector = audio_engine._model.projector
    assert projector is not None
    original, inputs = projector.encode, audio_engine._inputs
    encoded: list[int] = []
    entered, release, prepared = threading.Event(), threading.Event(), threading.Event()

    def encode_one(chunk, n_embd):  # type: ignore[no-untyped-def]
        encoded.append(chunk.index)
        if len(encoded) == 1:
            entered.set()
            release.wait(30)
        return original(chunk, n_embd)

    prepare = inputs.prepare

    def prepare_once(*args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            return prepare(*args, **kwargs)
        finally:
            prepared.set()

    monkeypatch.setattr(projector, "encode", encode_one)
    monkeypatch.setattr(inputs, "prepare", prepare_once)
    request = ask(audio(encode(tone(200, 100.0), "flac")))
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:

            async def submit() -> None:
                async with audio_engine.submit(request):
                    pass

            nursery.start_soon(submit)
            # Bounded: a preparation that fails before its first window must fail the test,
            # not hang it (a thread's wait cannot be cancelled).
            assert await trio.to_thread.run_sync(entered.wait, 60), "no window was encoded"
            scope.cancel()
    release.set()
    assert await trio.to_thread.run_sync(prepared.wait, 60), "the preparation did not end"
    assert encoded == [0]
    monkeypatch.undo()
    text, _ = await collect(audio_engine, ask(audio(encode(tone(200, 2.0), "wav"))))
    assert text  # the engine goes on serving


async def test_audio_refused_where_it_cannot_go(
    tmp_path: Path, qwen35_path: Path, gemma_path: Path
) -> None:
    clip = audio(encode(tone(440, 1.0), "wav"))
    async with Engine.open(engine_config(qwen35_path, threads=1, max_inflight=1)) as plain:
        with pytest.raises(InvalidRequestError, match="takes no audio"):
            async with plain.submit(ask(clip)):
                pass
    projector = write_gemma3_projector(tmp_path / "mmproj-gemma3.gguf")
    config = engine_config(gemma_path, mmproj=projector, threads=1, max_inflight=1)
    async with Engine.open(config) as vision_only:
        assert vision_only.takes_images and not vision_only.takes_audio
        with pytest.raises(InvalidRequestError, match="takes no audio"):
            async with vision_only.submit(ask(clip)):
                pass


def test_marker_count_must_match_media() -> None:
    with pytest.raises(InvalidRequestError, match="one media marker per image or audio file"):
        ChatMessage("user", "no marker", media=[audio(encode(tone(440, 1.0), "wav"))])


# -- bad files: refused from their headers, naming the part -----------------------------------


def lying_wav(seconds_said: float, seconds_held: float) -> bytes:
    data = encode(tone(440, seconds_held), "wav")
    said = int(seconds_said * 16000) * 2
    return (
        data[:4] + struct.pack("<I", 36 + said) + data[8:40] + struct.pack("<I", said) + data[44:]
    )


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (encode(tone(440, 2.0), "wav")[:-100], "truncated"),
        (encode(tone(440, 2.0), "flac")[:-100], "cut short"),
        (encode(tone(440, 2.0), "mp3")[:-100], "truncated"),
        (lying_wav(2.0, 1.0), "the file holds"),
        (np.random.default_rng(7).bytes(4000), "not a WAV, MP3 or FLAC"),
        (encode(silence(0.0), "wav"), "no samples"),
        (b"RIFF\x00\x00\x00\x00WAVE", "no 'data' chunk"),
    ],
    ids=["wav-cut", "flac-cut", "mp3-cut", "wav-lies", "random", "zero-samples", "wav-header"],
)
def test_bad_audio_is_refused_naming_the_part(data: bytes, reason: str) -> None:
    with pytest.raises(InvalidRequestError, match=reason) as refused:
        decode_audio(data, max_seconds=LIMIT, param="messages[0].content[1].input_audio.data")
    assert refused.value.param == "messages[0].content[1].input_audio.data"


def test_two_hours_are_refused_from_the_header() -> None:
    """Two hours of silence in FLAC (about 360 kB): the header says how long it is, and
    nothing is decoded."""
    data = encode(silence(7200.0), "flac")
    assert len(data) < 1_000_000
    with pytest.raises(InvalidRequestError, match=r"2\.0 h long, longer than the 10\.0 min"):
        decode_audio(data, max_seconds=LIMIT, param="file")
    # an MP3's frames are counted only up to the limit
    clip = encode(tone(440, 2.0), "mp3")
    with pytest.raises(InvalidRequestError, match=r"longer than the 1\.0 s"):
        decode_audio(clip, max_seconds=1.0, param="file")


@pytest.mark.parametrize("fmt", ["wav", "mp3", "flac"])
@pytest.mark.parametrize("rate", [8000, 16000, 44100])
def test_header_lengths(fmt: str, rate: int) -> None:
    read = decode_audio(encode(tone(440, 3.0, rate), fmt, rate), max_seconds=LIMIT, param="p")
    assert read.format == fmt
    # an MP3 carries its encoder's delay and padding (a frame or two)
    assert read.seconds == pytest.approx(3.0, abs=0.2 if fmt == "mp3" else 1e-9)
