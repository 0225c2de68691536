"""GGUF header checks: the real models pass; damaged or foreign files fail with a clear message."""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import pytest

from llmtrio.engine import ModelLoadError
from llmtrio.engine.models._gguf import GGUFArray, GGUFFormatError, check_gguf, parse_gguf


def gguf_bytes(
    metadata: list[tuple[str, int, bytes]],
    tensors: list[tuple[str, list[int], int, int]],
    *,
    alignment: int = 32,
    data: bytes = b"",
    version: int = 3,
) -> bytes:
    """A GGUF file: metadata as (key, value type, packed value), tensors as (name, dims,
    ggml type, offset), then padding to ``alignment`` and ``data``."""

    def string(text: str) -> bytes:
        raw = text.encode()
        return struct.pack("<Q", len(raw)) + raw

    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(metadata))
    for key, value_type, value in metadata:
        out += string(key) + struct.pack("<I", value_type) + value
    for name, dims, ggml_type, offset in tensors:
        out += string(name) + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ggml_type, offset)
    out += b"\0" * (-len(out) % alignment)
    return out + data


def arch(name: str) -> tuple[str, int, bytes]:
    raw = name.encode()
    return ("general.architecture", 8, struct.pack("<Q", len(raw)) + raw)


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def load_error(path: Path) -> str:
    with pytest.raises(ModelLoadError) as caught:
        check_gguf(path)
    message = str(caught.value)
    assert str(path) in message
    return message


# -- the real models ------------------------------------------------------------------------


def test_qwen35_tiny_model_passes(qwen35_path: Path) -> None:
    info = check_gguf(qwen35_path)
    assert info.architecture == "qwen35"
    assert info.version == 3
    assert info.tensor_count == 61
    assert info.metadata["qwen35.block_count"] == 2
    assert info.metadata["tokenizer.ggml.tokens"] == GGUFArray("string", 128)
    size = qwen35_path.stat().st_size
    # The data ends inside the file; at most the last tensor's alignment padding follows.
    assert info.data_end <= size < info.data_end + info.alignment


def test_gemma_model_passes(gemma_path: Path) -> None:
    info = check_gguf(gemma_path)
    assert info.architecture == "gemma3"
    assert info.metadata["general.name"] == "Gemma 3 270m"
    assert info.metadata["tokenizer.ggml.tokens"] == GGUFArray("string", 262144)
    assert info.data_end == gemma_path.stat().st_size


# -- not a file -----------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    message = load_error(tmp_path / "nothing-here.gguf")
    assert "not found" in message


def test_directory(tmp_path: Path) -> None:
    message = load_error(tmp_path)
    assert "is a directory" in message


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file(tmp_path: Path, qwen35_path: Path) -> None:
    path = write(tmp_path, "locked.gguf", qwen35_path.read_bytes()[:4096])
    path.chmod(0)
    try:
        message = load_error(path)
    finally:
        path.chmod(0o600)
    assert "permission denied" in message


# -- not a GGUF -----------------------------------------------------------------------------


def test_text_file(tmp_path: Path) -> None:
    message = load_error(write(tmp_path, "notes.gguf", b"hello world, this is text\n"))
    assert "not a GGUF file" in message
    assert "b'hello wo'" in message


def test_zip_file(tmp_path: Path) -> None:
    message = load_error(write(tmp_path, "model.gguf", b"PK\x03\x04\x14\x00\x00\x00" + bytes(64)))
    assert "not a GGUF file" in message
    assert r"b'PK\x03\x04" in message


def test_empty_file(tmp_path: Path) -> None:
    message = load_error(write(tmp_path, "empty.gguf", b""))
    assert "not a GGUF file" in message
    assert "empty" in message


def test_git_lfs_pointer(tmp_path: Path) -> None:
    pointer = b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 5294368\n"
    message = load_error(write(tmp_path, "pointer.gguf", pointer))
    assert "Git LFS pointer" in message


def test_html_error_page(tmp_path: Path) -> None:
    message = load_error(write(tmp_path, "page.gguf", b"<!DOCTYPE html><html>Not Found</html>"))
    assert "HTML page" in message


def test_unsupported_version(tmp_path: Path, qwen35_path: Path) -> None:
    data = bytearray(qwen35_path.read_bytes())
    data[4:8] = struct.pack("<I", 1)
    message = load_error(write(tmp_path, "v1.gguf", bytes(data)))
    assert "version 1 is not supported" in message


def test_big_endian_file(tmp_path: Path) -> None:
    data = b"GGUF" + struct.pack(">IQQ", 3, 0, 0)
    message = load_error(write(tmp_path, "be.gguf", data))
    assert "big-endian" in message


# -- truncated copies of the qwen35 model ---------------------------------------------------


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("in the counts", "runs past the end"),
        ("before the metadata", "metadata entries and 61 tensors"),
        ("in the metadata", "reading metadata entry"),
        ("in the tensor infos", "reading tensor info"),
    ],
)
def test_truncated_inside_the_header(
    tmp_path: Path, qwen35_path: Path, where: str, expected: str
) -> None:
    data = qwen35_path.read_bytes()
    info = parse_gguf(data)
    cut = {
        "in the counts": 12,
        "before the metadata": 40,
        "in the metadata": 5000,
        "in the tensor infos": info.data_offset - 64,
    }[where]
    message = load_error(write(tmp_path, "cut.gguf", data[:cut]))
    assert expected in message
    assert "truncated or corrupt" in message


@pytest.mark.parametrize("fraction", [0.0, 0.5, 0.999999])
def test_truncated_inside_the_data(tmp_path: Path, qwen35_path: Path, fraction: float) -> None:
    data = qwen35_path.read_bytes()
    info = parse_gguf(data)
    cut = info.data_offset + int((info.data_end - info.data_offset) * fraction)
    assert cut < info.data_end
    message = load_error(write(tmp_path, "cut.gguf", data[:cut]))
    assert "truncated" in message
    assert f"should end at byte {info.data_end}" in message
    assert f"has {cut} bytes" in message
    assert f"({info.data_end - cut} byte" in message


# -- garbage --------------------------------------------------------------------------------


def test_absurd_counts_fail_at_once(tmp_path: Path) -> None:
    data = b"GGUF" + struct.pack("<IQQ", 3, 2**63, 2**63) + bytes(100)
    message = load_error(write(tmp_path, "absurd.gguf", data))
    assert "truncated or corrupt" in message


def test_absurd_string_and_array_lengths(tmp_path: Path) -> None:
    huge_string = gguf_bytes([("general.name", 8, struct.pack("<Q", 2**62))], [])
    assert "runs past the end" in load_error(write(tmp_path, "s.gguf", huge_string))
    huge_array = gguf_bytes([("tokens", 9, struct.pack("<IQ", 8, 2**60))], [])
    assert "runs past the end" in load_error(write(tmp_path, "a.gguf", huge_array))
    deep = struct.pack("<IQ", 9, 1) * 20 + struct.pack("<IQ", 0, 0)
    nested = gguf_bytes([("deep", 9, deep)], [])
    assert "nested" in load_error(write(tmp_path, "n.gguf", nested))


def test_random_damage_never_crashes(qwen35_path: Path) -> None:
    """Bytes overwritten anywhere in the header give a result or a GGUF error, nothing else."""
    data = qwen35_path.read_bytes()
    header_end = parse_gguf(data).data_offset
    rng = random.Random(20240607)
    failures = 0
    for _ in range(400):
        damaged = bytearray(data[: header_end + 64])
        for _ in range(rng.randint(1, 6)):
            at = rng.randrange(4, header_end - 8)
            damaged[at : at + 8] = rng.getrandbits(64).to_bytes(8, "little")
        try:
            parse_gguf(bytes(damaged), len(data))
        except GGUFFormatError:
            failures += 1
    assert failures > 100


# -- crafted files --------------------------------------------------------------------------


def test_alignment_and_tensor_sizes(tmp_path: Path) -> None:
    # A Q4_K tensor of 512 x 2 is 4 blocks of 144 bytes; an F32 of 3 floats follows it.
    metadata = [arch("llama"), ("general.alignment", 4, struct.pack("<I", 64))]
    tensors = [("a", [512, 2], 12, 0), ("b", [3], 0, 576)]
    path = write(tmp_path, "ok.gguf", gguf_bytes(metadata, tensors, alignment=64, data=bytes(588)))
    info = check_gguf(path)
    assert info.architecture == "llama"
    assert info.alignment == 64
    assert info.data_offset % 64 == 0
    assert info.data_end == info.data_offset + 576 + 12 == path.stat().st_size


def test_unknown_tensor_type_skips_the_size_but_checks_the_offset(tmp_path: Path) -> None:
    fits = gguf_bytes([arch("llama")], [("t", [64], 200, 32)], data=bytes(40))
    assert check_gguf(write(tmp_path, "fits.gguf", fits)).architecture == "llama"
    beyond = gguf_bytes([arch("llama")], [("t", [64], 200, 64)], data=bytes(40))
    assert "truncated" in load_error(write(tmp_path, "beyond.gguf", beyond))


def test_misaligned_offset_and_bad_alignment(tmp_path: Path) -> None:
    misaligned = gguf_bytes([arch("llama")], [("t", [4], 0, 8)], data=bytes(32))
    assert "not a multiple of the alignment" in load_error(write(tmp_path, "m.gguf", misaligned))
    odd = gguf_bytes([("general.alignment", 4, struct.pack("<I", 24))], [])
    assert "power of two" in load_error(write(tmp_path, "o.gguf", odd))


def test_row_not_a_multiple_of_the_block(tmp_path: Path) -> None:
    bad = gguf_bytes([arch("llama")], [("t", [100], 12, 0)], data=bytes(1024))
    assert "block size 256" in load_error(write(tmp_path, "b.gguf", bad))
