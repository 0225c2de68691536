"""Reading and checking a GGUF file's header before llama.cpp is asked to load it.

llama.cpp reports a bad file with a bare "failed to load model"; this module says what is wrong
(missing, not a GGUF, truncated, a Git LFS pointer, ...) and names the path. The parser is a
pure function of a byte buffer and the file's size (:func:`parse_gguf`); :func:`check_gguf`
maps the file and turns every failure into :class:`ModelLoadError`.

The format (little-endian): ``b"GGUF"``, uint32 version, uint64 tensor count, uint64 metadata
count, the metadata key/value pairs, the tensor infos (name, dims, ggml type, offset), padding
to ``general.alignment`` (default 32), then the tensor data. Every count and length read from
the file is bounded by the bytes left before anything is allocated or looped over, so a
corrupt or hostile file ends in an error, never in a crash or a long loop.
"""

from __future__ import annotations

import mmap
import stat
import struct
from collections.abc import Mapping
from pathlib import Path

import attrs

from .._errors import ModelLoadError

__all__ = [
    "GGML_BLOCK_SIZES",
    "POOLING_NAMES",
    "RANK_POOLING",
    "GGUFArray",
    "GGUFFormatError",
    "GGUFInfo",
    "MetadataValue",
    "check_gguf",
    "model_kind",
    "model_kind_of",
    "parse_gguf",
]

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_NESTING = 8

#: ggml type id -> (elements per block, bytes per block), as in ggml.c's type traits of the
#: llama.cpp that llama-cpp-python 0.3.36 vendors. gguf-py 0.19.0's ``GGML_QUANT_SIZES`` agrees
#: except for Q8_1, where it says 40 bytes; ggml-common.h asserts 36 (two halves and 32 quants).
GGML_BLOCK_SIZES: Mapping[int, tuple[int, int]] = {
    0: (1, 4),  # F32
    1: (1, 2),  # F16
    2: (32, 18),  # Q4_0
    3: (32, 20),  # Q4_1
    6: (32, 22),  # Q5_0
    7: (32, 24),  # Q5_1
    8: (32, 34),  # Q8_0
    9: (32, 36),  # Q8_1
    10: (256, 84),  # Q2_K
    11: (256, 110),  # Q3_K
    12: (256, 144),  # Q4_K
    13: (256, 176),  # Q5_K
    14: (256, 210),  # Q6_K
    15: (256, 292),  # Q8_K
    16: (256, 66),  # IQ2_XXS
    17: (256, 74),  # IQ2_XS
    18: (256, 98),  # IQ3_XXS
    19: (256, 50),  # IQ1_S
    20: (32, 18),  # IQ4_NL
    21: (256, 110),  # IQ3_S
    22: (256, 82),  # IQ2_S
    23: (256, 136),  # IQ4_XS
    24: (1, 1),  # I8
    25: (1, 2),  # I16
    26: (1, 4),  # I32
    27: (1, 8),  # I64
    28: (1, 8),  # F64
    29: (256, 56),  # IQ1_M
    30: (1, 2),  # BF16
    34: (256, 54),  # TQ1_0
    35: (256, 66),  # TQ2_0
    39: (32, 17),  # MXFP4
    40: (64, 36),  # NVFP4
    41: (128, 18),  # Q1_0
    42: (64, 18),  # Q2_0
}

_U64 = struct.Struct("<Q")

# Metadata value types: id -> (struct format, size) for the fixed-size ones.
_STRING = 8
_ARRAY = 9
_SCALARS: Mapping[int, tuple[str, int]] = {
    0: ("<B", 1),  # uint8
    1: ("<b", 1),  # int8
    2: ("<H", 2),  # uint16
    3: ("<h", 2),  # int16
    4: ("<I", 4),  # uint32
    5: ("<i", 4),  # int32
    6: ("<f", 4),  # float32
    7: ("<?", 1),  # bool
    10: ("<Q", 8),  # uint64
    11: ("<q", 8),  # int64
    12: ("<d", 8),  # float64
}
_TYPE_NAMES: Mapping[int, str] = {
    0: "uint8",
    1: "int8",
    2: "uint16",
    3: "int16",
    4: "uint32",
    5: "int32",
    6: "float32",
    7: "bool",
    8: "string",
    9: "array",
    10: "uint64",
    11: "int64",
    12: "float64",
}


@attrs.frozen
class GGUFArray:
    """A metadata array, summarised: its item type (``"string"``, ``"int32"``, ...) and length."""

    item_type: str
    count: int


MetadataValue = int | float | bool | str | GGUFArray


@attrs.frozen
class GGUFInfo:
    """What the header says. ``metadata`` holds every key; arrays appear as :class:`GGUFArray`.

    ``data_offset`` is where the tensor data begins, ``data_end`` where the last tensor's data
    ends (for a tensor of an unknown ggml type only its start is counted). ``architecture`` is
    ``general.architecture``, ``None`` when absent (the later parts of a split model).
    """

    version: int
    tensor_count: int
    metadata: Mapping[str, MetadataValue]
    architecture: str | None
    alignment: int
    data_offset: int
    data_end: int
    file_size: int


class GGUFFormatError(Exception):
    """A problem with the bytes; :func:`check_gguf` adds the path."""


@attrs.define
class _Cursor:
    _buf: bytes | mmap.mmap
    _size: int
    _pos: int = 0
    _where: str = "the file header"

    @property
    def pos(self) -> int:
        return self._pos

    @property
    def left(self) -> int:
        return self._size - self._pos

    def at(self, where: str) -> None:
        self._where = where

    def need(self, n: int) -> None:
        if n > self.left:
            raise GGUFFormatError(
                f"the GGUF header runs past the end of the file (at byte {self._pos} of "
                f"{self._size}, reading {self._where}): the file is truncated or corrupt"
            )

    def unpack(self, fmt: str, size: int) -> int | float | bool:
        self.need(size)
        value: int | float | bool
        (value,) = struct.unpack_from(fmt, self._buf, self._pos)
        self._pos += size
        return value

    def u32(self) -> int:
        return int(self.unpack("<I", 4))

    def u64(self) -> int:
        return int(self.unpack("<Q", 8))

    def skip(self, n: int) -> None:
        self.need(n)
        self._pos += n

    def skip_strings(self, count: int) -> None:
        """Skip ``count`` strings (a hot loop: a tokenizer's vocabulary is 100k-300k of them)."""
        self.need(count * 8)  # every string is at least its length
        buf, size, pos = self._buf, self._size, self._pos
        for _ in range(count):
            if pos + 8 > size:
                self._pos = min(pos, size)
                self.need(8)  # raises
            (length,) = _U64.unpack_from(buf, pos)
            pos += 8 + length
        if pos > size:
            self.need(pos - self._pos)  # raises
        self._pos = pos

    def string(self, limit: int | None = None) -> str:
        length = self.u64()
        self.need(length)
        end = self._pos + (length if limit is None else min(length, limit))
        text = bytes(self._buf[self._pos : end]).decode("utf-8", errors="replace")
        self._pos += length
        return text


def _skip_array(cur: _Cursor, item_type: int, count: int, depth: int) -> None:
    if item_type in _SCALARS:
        cur.skip(count * _SCALARS[item_type][1])
    elif item_type == _STRING:
        cur.skip_strings(count)
    elif item_type == _ARRAY:
        if depth >= MAX_ARRAY_NESTING:
            raise GGUFFormatError(f"metadata arrays nested more than {MAX_ARRAY_NESTING} deep")
        cur.need(count * 12)  # every array is at least its type and count
        for _ in range(count):
            inner_type = cur.u32()
            _skip_array(cur, inner_type, cur.u64(), depth + 1)
    else:
        raise GGUFFormatError(f"unknown metadata array item type {item_type}")


def _value(cur: _Cursor, value_type: int) -> MetadataValue:
    if value_type in _SCALARS:
        fmt, size = _SCALARS[value_type]
        return cur.unpack(fmt, size)
    if value_type == _STRING:
        return cur.string()
    if value_type == _ARRAY:
        item_type = cur.u32()
        count = cur.u64()
        _skip_array(cur, item_type, count, 1)
        return GGUFArray(_TYPE_NAMES.get(item_type, str(item_type)), count)
    raise GGUFFormatError(f"unknown metadata value type {value_type}")


def _describe_start(head: bytes) -> str:
    if not head:
        return "the file is empty"
    if head.startswith(b"version https://git-lfs"):
        return "it is a Git LFS pointer, not the model: fetch the real file (git lfs pull)"
    lowered = head.lstrip().lower()
    if lowered.startswith((b"<!doctype", b"<html")):
        return f"starts with {head[:8]!r}: an HTML page, perhaps a failed download"
    return f"starts with {head[:8]!r}"


def parse_gguf(buf: bytes | mmap.mmap, file_size: int | None = None) -> GGUFInfo:
    """Parse a GGUF header from ``buf`` (the whole file, or a mapping of it).

    ``file_size`` defaults to ``len(buf)``; the tensor data must end within it.

    Error handling: raises :class:`GGUFFormatError` saying what is wrong (not a GGUF file, an
    unsupported version, a header running past the end, a truncated file, an impossible
    value); never anything else, whatever the bytes.
    """
    size = len(buf) if file_size is None else file_size
    head = bytes(buf[:64])
    if len(head) < 4 or head[:4] != GGUF_MAGIC:
        raise GGUFFormatError(f"not a GGUF file ({_describe_start(head)})")
    cur = _Cursor(buf, len(buf))
    cur.skip(4)
    cur.at("the version")
    version = cur.u32()
    if version not in SUPPORTED_VERSIONS:
        if int.from_bytes(version.to_bytes(4, "little"), "big") in SUPPORTED_VERSIONS:
            raise GGUFFormatError("a big-endian GGUF file; only little-endian files are supported")
        raise GGUFFormatError(
            f"GGUF version {version} is not supported (versions 2 and 3 are); "
            "convert the model again with a recent llama.cpp"
        )
    cur.at("the tensor and metadata counts")
    tensor_count = cur.u64()
    kv_count = cur.u64()
    # The smallest key/value pair is 13 bytes (empty key, type, a uint8); the smallest tensor
    # info 24 (empty name, no dims, type, offset).
    if kv_count * 13 + tensor_count * 24 > cur.left:
        raise GGUFFormatError(
            f"the header declares {kv_count} metadata entries and {tensor_count} tensors, more "
            f"than the file's {len(buf)} bytes can hold: the file is truncated or corrupt"
        )

    metadata: dict[str, MetadataValue] = {}
    for i in range(kv_count):
        cur.at(f"metadata entry {i + 1} of {kv_count}")
        key = cur.string()
        cur.at(f"metadata entry {i + 1} of {kv_count} ({key!r})")
        metadata[key] = _value(cur, cur.u32())

    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if (
        isinstance(alignment, bool)
        or not isinstance(alignment, int)
        or alignment <= 0
        or alignment & (alignment - 1)
    ):
        raise GGUFFormatError(f"general.alignment is {alignment!r}, not a power of two")
    architecture = metadata.get("general.architecture")
    if architecture is not None and not isinstance(architecture, str):
        raise GGUFFormatError(f"general.architecture is {architecture!r}, not a string")

    tensors: list[tuple[str, int, int | None]] = []  # name, offset, byte size if known
    for i in range(tensor_count):
        cur.at(f"tensor info {i + 1} of {tensor_count}")
        name = cur.string(limit=256)
        cur.at(f"tensor info {i + 1} of {tensor_count} ({name!r})")
        n_dims = cur.u32()
        if n_dims > MAX_DIMS:
            raise GGUFFormatError(f"tensor {name!r} has {n_dims} dimensions (at most {MAX_DIMS})")
        dims = [cur.u64() for _ in range(n_dims)]
        ggml_type = cur.u32()
        offset = cur.u64()
        if offset % alignment:
            raise GGUFFormatError(
                f"tensor {name!r} starts at offset {offset}, not a multiple of the alignment "
                f"{alignment}"
            )
        nbytes: int | None = None
        if ggml_type in GGML_BLOCK_SIZES:
            block, type_size = GGML_BLOCK_SIZES[ggml_type]
            elements = 1
            for d in dims:
                elements *= d
            if dims and dims[0] % block:
                raise GGUFFormatError(
                    f"tensor {name!r} has rows of {dims[0]} elements, not a multiple of its "
                    f"type's block size {block}"
                )
            nbytes = elements // block * type_size
        tensors.append((name, offset, nbytes))

    data_offset = -(-cur.pos // alignment) * alignment
    data_end = data_offset
    for _name, offset, nbytes in tensors:
        data_end = max(data_end, data_offset + offset + (nbytes or 0))
    if data_end > size:
        missing = data_end - size
        raise GGUFFormatError(
            f"the file is truncated: its tensor data should end at byte {data_end}, but the "
            f"file has {size} bytes ({missing} {'byte' if missing == 1 else 'bytes'} missing); "
            "download or copy it again"
        )
    return GGUFInfo(
        version=version,
        tensor_count=tensor_count,
        metadata=metadata,
        architecture=architecture,
        alignment=alignment,
        data_offset=data_offset,
        data_end=data_end,
        file_size=size,
    )


def check_gguf(path: Path) -> GGUFInfo:
    """Check that ``path`` is a complete GGUF file llama.cpp can be asked to load.

    Resource handling: the file is memory-mapped read-only while the header is parsed and
    unmapped before returning; only the header's pages are read.

    Error handling: raises :class:`ModelLoadError`, naming the path, when the file is missing,
    a directory, unreadable, not a GGUF file, of an unsupported version, cut short inside its
    header or its tensor data, or holds impossible values.
    """
    path = Path(path)
    try:
        mode = path.stat().st_mode
        if stat.S_ISDIR(mode):
            raise ModelLoadError(f"{path} is a directory, not a GGUF model file")
        if not stat.S_ISREG(mode):
            raise ModelLoadError(f"{path} is not a regular file, so not a GGUF model file")
        with path.open("rb") as f:
            size = f.seek(0, 2)
            if size == 0:
                raise ModelLoadError(f"{path}: not a GGUF file (the file is empty)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                return parse_gguf(mapped, size)
    except GGUFFormatError as e:
        raise ModelLoadError(f"{path}: {e}") from None
    except FileNotFoundError:
        raise ModelLoadError(f"model file not found: {path}") from None
    except IsADirectoryError:
        raise ModelLoadError(f"{path} is a directory, not a GGUF model file") from None
    except PermissionError:
        raise ModelLoadError(f"cannot read {path}: permission denied") from None
    except OSError as e:
        raise ModelLoadError(f"cannot read {path}: {e.strerror or e}") from None


#: llama.cpp's ``enum llama_pooling_type`` values that make a sentence embedding.
POOLING_NAMES: Mapping[int, str] = {1: "mean", 2: "cls", 3: "last"}
#: llama.cpp's ``LLAMA_POOLING_TYPE_RANK``: a cross-encoder's pooling, each sequence (a query
#: and a document) pooled through the model's classification head into ``n_cls_out`` scores.
RANK_POOLING = 4


def model_kind(info: GGUFInfo) -> str:
    """``"embedding"`` for a model whose GGUF names a sentence pooling (``{arch}.pooling_type``
    mean, CLS or last: BERT and its kin, embedding fine-tunes of decoders such as
    Qwen3-Embedding), ``"rerank"`` for one that names rank pooling (a cross-encoder: BERT's
    ms-marco rerankers, bge-reranker, Qwen3-Reranker), ``"chat"`` for any other (a generating
    model). Pure."""
    pooling = info.metadata.get(f"{info.architecture}.pooling_type")
    if isinstance(pooling, int) and not isinstance(pooling, bool):
        if pooling in POOLING_NAMES:
            return "embedding"
        if pooling == RANK_POOLING:
            return "rerank"
    return "chat"


def model_kind_of(path: Path) -> str:
    """:func:`model_kind` of the GGUF file at ``path`` (its header only).

    Error handling: :class:`ModelLoadError` as :func:`check_gguf` raises it."""
    return model_kind(check_gguf(path))
