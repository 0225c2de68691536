"""Test audio, synthesized with NumPy: tones, noise and silence at any rate, written as WAV
(the standard library's ``wave``), and as MP3 and FLAC (``soundfile``: libsndfile with LAME
and libFLAC), with the request shapes that carry it (chat's and the Responses API's
``input_audio`` parts)."""

from __future__ import annotations

import base64
import io
import wave

import numpy as np
import soundfile

__all__ = ["encode", "input_audio", "noise", "silence", "tone", "wav"]


def tone(hz: float, seconds: float, rate: int = 16000, amplitude: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (amplitude * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def noise(seconds: float, rate: int = 16000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (0.2 * rng.standard_normal(int(seconds * rate))).astype(np.float32)


def silence(seconds: float, rate: int = 16000) -> np.ndarray:
    return np.zeros(int(seconds * rate), dtype=np.float32)


def wav(samples: np.ndarray, rate: int = 16000) -> bytes:
    """16-bit PCM mono WAV (the standard library writes it)."""
    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return out.getvalue()


def encode(samples: np.ndarray, fmt: str, rate: int = 16000) -> bytes:
    """``samples`` as a ``wav``, ``mp3`` or ``flac`` file."""
    if fmt == "wav":
        return wav(samples, rate)
    out = io.BytesIO()
    soundfile.write(out, samples, rate, format=fmt.upper())
    return out.getvalue()


def input_audio(data: bytes, fmt: str = "wav") -> dict[str, object]:
    """An ``input_audio`` part (chat completions' and the Responses API's shape)."""
    return {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt},
    }
