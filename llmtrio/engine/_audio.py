"""Audio in: WAV, MP3 and FLAC files, their length read from their headers before anything
is decoded.

Pure (no llama.cpp): :func:`decode_audio` sniffs the format from the bytes (never from a
declared one), reads how long the audio is without decoding a sample, and refuses it past
``max_seconds``, so a two-hour file costs a header's reading, not two hours of samples. The
samples are decoded later, by llama.cpp's multimodal helper (miniaudio: the same decoder and
resampler as llama.cpp's server), in the thread that prepares the request.

How the length is read, and what is checked:

- **WAV** (RIFF ``WAVE``): the ``fmt`` chunk (PCM, IEEE float, A-law or mu-law, or their
  ``WAVE_FORMAT_EXTENSIBLE`` forms) and the ``data`` chunk's size; a ``data`` chunk that says
  more bytes than the file holds (a truncated file, a header that lies) is refused;
- **FLAC**: ``STREAMINFO``'s sample rate and total samples (a stream that gives none is
  refused); the last frame is found and checked whole (its header's CRC-8, the frame's
  CRC-16 up to the end of the file) and must end where the total says, so a truncated file
  or a header that lies about the length is refused;
- **MP3** (MPEG-1/2/2.5 layer I, II or III, after an optional ID3v2 tag): every frame's
  header is read (no sample is decoded) and their samples summed, stopping as soon as the sum
  passes ``max_seconds``; the frames must follow one another to the end of the file (an
  ID3v1 or APE tag may close it), so a cut frame is refused.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Final

import attrs

from ._errors import InvalidRequestError

__all__ = ["AUDIO_FORMATS", "Audio", "decode_audio"]

#: The formats read, by the name requests give them.
AUDIO_FORMATS: Final = ("wav", "mp3", "flac")

# WAV format tags whose frames are ``block_align`` bytes each (miniaudio reads them all).
_WAV_CODES: Final = {1: "PCM", 3: "IEEE float", 6: "A-law", 7: "mu-law"}
_WAV_EXTENSIBLE: Final = 0xFFFE


@attrs.frozen(eq=False)
class Audio:
    """An audio file of a request: ``seconds`` long (read from its header), in ``format``
    (``wav``, ``mp3`` or ``flac``: from its bytes), and the SHA-256 (hex) of its bytes
    (``digest``): the id llama.cpp's chunks carry and the prompt cache recognizes a repeated
    file by. Made by :func:`decode_audio`; its samples are decoded by the engine.
    ``param`` names where it came from, for errors."""

    seconds: float
    format: str
    digest: str
    param: str = "audio"
    _encoded: bytes = attrs.field(default=b"", repr=False, alias="encoded")

    @property
    def data(self) -> bytes:
        """The file's bytes, as the request gave them."""
        return self._encoded


def decode_audio(data: bytes, *, max_seconds: float, param: str) -> Audio:
    """``data`` (a WAV, MP3 or FLAC file: sniffed from the bytes) as an :class:`Audio`, its
    length read from its header and checked now (see the module's doc); its samples are
    decoded later, by the engine.

    Error handling: :class:`InvalidRequestError` naming ``param`` for bytes that are none of
    those formats, a truncated file or one whose header does not agree with its bytes, audio
    with no samples, or audio longer than ``max_seconds`` (refused before it is decoded)."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        kind, seconds = "wav", _wav_seconds(data, param)
    elif data[:4] == b"fLaC":
        kind, seconds = "flac", _flac_seconds(data, param)
    elif data[:3] == b"ID3" or _mp3_header(data, 0) is not None:
        kind, seconds = "mp3", _mp3_seconds(data, param, max_seconds)
    else:
        raise InvalidRequestError("the data is not a WAV, MP3 or FLAC file", param=param)
    if seconds <= 0:
        raise InvalidRequestError("the audio has no samples", param=param)
    if seconds > max_seconds:
        raise InvalidRequestError(
            f"the audio is {_duration(seconds)} long, longer than the {_duration(max_seconds)} "
            "this server takes (--max-audio-seconds)",
            param=param,
        )
    return Audio(seconds, kind, hashlib.sha256(data).hexdigest(), param, encoded=data)


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds:.1f} s" if seconds < 60 else f"{seconds / 60:.1f} min"


# -- WAV -------------------------------------------------------------------------------------


def _wav_seconds(data: bytes, param: str) -> float:
    pos, fmt = 12, None
    while pos + 8 <= len(data):
        chunk, size = data[pos : pos + 4], int(struct.unpack_from("<I", data, pos + 4)[0])
        body = pos + 8
        if chunk == b"fmt ":
            if size < 16 or body + size > len(data):
                raise InvalidRequestError("the WAV's 'fmt ' chunk is cut short", param=param)
            fmt = _wav_format(data, body, size, param)
        elif chunk == b"data":
            if fmt is None:
                raise InvalidRequestError(
                    "the WAV has its samples before its 'fmt ' chunk", param=param
                )
            held = len(data) - body
            if size > held:
                raise InvalidRequestError(
                    f"the WAV's header says {size} bytes of samples, but the file holds "
                    f"{held} (a truncated file, or a header that does not match it)",
                    param=param,
                )
            rate, block = fmt
            return (size // block) / rate
        pos = body + size + (size & 1)
    raise InvalidRequestError("the WAV has no 'data' chunk (a truncated file?)", param=param)


def _wav_format(data: bytes, at: int, size: int, param: str) -> tuple[int, int]:
    """The sample rate and bytes per frame of a ``fmt`` chunk."""
    code, channels, rate, _, block, bits = struct.unpack_from("<HHIIHH", data, at)
    if code == _WAV_EXTENSIBLE and size >= 40:
        code = struct.unpack_from("<H", data, at + 24)[0]  # the sub-format GUID's first two bytes
    if code not in _WAV_CODES:
        raise InvalidRequestError(
            f"the WAV's encoding (format {code:#x}) is not read: send PCM, IEEE float, A-law "
            "or mu-law samples",
            param=param,
        )
    if not (channels and rate and block and bits):
        raise InvalidRequestError(
            "the WAV's 'fmt ' chunk gives no channels, rate or sample size", param=param
        )
    return rate, block


# -- FLAC ------------------------------------------------------------------------------------


def _flac_seconds(data: bytes, param: str) -> float:
    if len(data) < 42 or data[4] & 0x7F != 0:
        raise InvalidRequestError(
            "the FLAC has no STREAMINFO block (a truncated file?)", param=param
        )
    info = data[8:42]
    min_block, max_block = struct.unpack_from(">HH", info, 0)
    packed = int.from_bytes(info[10:18], "big")
    rate = packed >> 44
    total = packed & ((1 << 36) - 1)
    if rate == 0:
        raise InvalidRequestError("the FLAC's STREAMINFO gives no sample rate", param=param)
    if total == 0:
        raise InvalidRequestError(
            "the FLAC's STREAMINFO gives no length (a stream written without it is not read)",
            param=param,
        )
    pos, last = 4, False
    while not last:  # the metadata blocks, to the first frame
        if pos + 4 > len(data):
            raise InvalidRequestError("the FLAC's metadata is cut short", param=param)
        last = bool(data[pos] & 0x80)
        pos += 4 + int.from_bytes(data[pos + 1 : pos + 4], "big")
    if pos >= len(data):
        raise InvalidRequestError("the FLAC has no audio frames (a truncated file?)", param=param)
    max_frame = int.from_bytes(info[7:10], "big") or _FLAC_MAX_FRAME
    end = _flac_last_frame_end(
        data, pos, min_block if min_block == max_block else 0, max_frame + 16
    )
    if end is None:
        raise InvalidRequestError(
            "the FLAC's last frame is cut short (a truncated file?)", param=param
        )
    if end != total:
        raise InvalidRequestError(
            f"the FLAC's header says {total} samples, but its frames end at sample {end}",
            param=param,
        )
    return total / rate


def _flac_last_frame_end(data: bytes, first: int, fixed_block: int, max_frame: int) -> int | None:
    """The sample number the file's last frame ends at, that frame checked whole (its
    header's CRC-8, its CRC-16 running to the file's end); ``None`` when no frame within
    ``max_frame`` bytes of the end checks out (the file is cut)."""
    search, floor = len(data) - 2, max(first, len(data) - max_frame)
    while True:
        at = data.rfind(b"\xff", floor, search)
        if at < 0:
            return None
        search = at
        if data[at + 1] & 0xFE != 0xF8:
            continue
        header = _flac_frame_header(data, at, fixed_block)
        if header is None or _crc16(data[at:-2]) != int.from_bytes(data[-2:], "big"):
            continue  # not a frame header, or not one whose frame runs to the end
        start, block = header
        return start + block


def _flac_frame_header(data: bytes, at: int, fixed_block: int) -> tuple[int, int] | None:
    """A frame header at ``at`` (its CRC-8 checked): its first sample and its block size."""
    if at + 6 > len(data):
        return None
    variable = bool(data[at + 1] & 1)
    size_code, rate_code = data[at + 2] >> 4, data[at + 2] & 0x0F
    if size_code == 0 or rate_code == 15 or data[at + 3] & 1:
        return None
    number, pos = _utf8_number(data, at + 4)
    if number is None:
        return None
    if size_code == 1:
        block = 192
    elif 2 <= size_code <= 5:
        block = 576 << (size_code - 2)
    elif size_code == 6:
        block, pos = data[pos] + 1, pos + 1
    elif size_code == 7:
        block, pos = int.from_bytes(data[pos : pos + 2], "big") + 1, pos + 2
    else:
        block = 256 << (size_code - 8)
    pos += {12: 1, 13: 2, 14: 2}.get(rate_code, 0)
    if pos >= len(data) or _crc8(data[at:pos]) != data[pos]:
        return None
    if variable:
        return number, block
    return number * (fixed_block or block), block


def _utf8_number(data: bytes, at: int) -> tuple[int | None, int]:
    """FLAC's UTF-8-like coded frame or sample number at ``at``, and where it ends."""
    if at >= len(data):
        return None, at
    first = data[at]
    if first < 0x80:
        return first, at + 1
    count = 0
    while count < 7 and first & (0x80 >> count):
        count += 1
    if count < 2 or count > 7 or at + count > len(data):
        return None, at
    value = first & (0x7F >> count)
    for byte in data[at + 1 : at + count]:
        if byte & 0xC0 != 0x80:
            return None, at
        value = (value << 6) | (byte & 0x3F)
    return value, at + count


def _crc8(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc = _CRC8[crc ^ byte]
    return crc


def _crc16(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ _CRC16[(crc >> 8) ^ byte]
    return crc


def _crc_table(poly: int, bits: int) -> list[int]:
    top, mask, table = 1 << (bits - 1), (1 << bits) - 1, []
    for byte in range(256):
        crc = byte << (bits - 8)
        for _ in range(8):
            crc = ((crc << 1) ^ poly) if crc & top else (crc << 1)
        table.append(crc & mask)
    return table


_CRC8: Final = _crc_table(0x07, 8)
#: How far from the end a FLAC's last frame is looked for when STREAMINFO gives no size.
_FLAC_MAX_FRAME: Final = 1 << 20
_CRC16: Final = _crc_table(0x8005, 16)


# -- MP3 -------------------------------------------------------------------------------------

# kbit/s by [MPEG-1?][layer 1..3][index]
_BITRATES: Final = {
    (True, 1): (0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448),
    (True, 2): (0, 32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384),
    (True, 3): (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    (False, 1): (0, 32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256),
    (False, 2): (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
    (False, 3): (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
_RATES: Final = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}


def _mp3_header(data: bytes, at: int) -> tuple[int, int, int] | None:
    """The MPEG audio frame header at ``at``: the frame's length in bytes, its samples and
    its sample rate; ``None`` when no frame starts there."""
    if at + 4 > len(data) or data[at] != 0xFF or data[at + 1] & 0xE0 != 0xE0:
        return None
    version, layer_bits = (data[at + 1] >> 3) & 3, (data[at + 1] >> 1) & 3
    rate_index, bitrate_index = (data[at + 2] >> 2) & 3, data[at + 2] >> 4
    if version == 1 or layer_bits == 0 or rate_index == 3 or bitrate_index in (0, 15):
        return None  # reserved values, or a free-format bitrate (no length in the header)
    layer, mpeg1 = 4 - layer_bits, version == 3
    bitrate = _BITRATES[(mpeg1, layer)][bitrate_index] * 1000
    rate = _RATES[version][rate_index]
    padding = (data[at + 2] >> 1) & 1
    if layer == 1:
        return (12 * bitrate // rate + padding) * 4, 384, rate
    if layer == 3 and not mpeg1:
        return 72 * bitrate // rate + padding, 576, rate
    return 144 * bitrate // rate + padding, 1152, rate


def _mp3_seconds(data: bytes, param: str, max_seconds: float) -> float:
    pos = 0
    if data[:3] == b"ID3" and len(data) >= 10:
        size = 0
        for byte in data[6:10]:
            size = (size << 7) | (byte & 0x7F)
        pos = 10 + size + (10 if data[5] & 0x10 else 0)
    seconds, frames, declared = 0.0, 0, _xing_frames(data, pos)
    while pos < len(data):
        header = _mp3_header(data, pos)
        if header is None:
            rest = data[pos:]
            if frames and ((rest[:3] == b"TAG" and len(rest) == 128) or rest[:8] == b"APETAGEX"):
                break  # an ID3v1 or APE tag closes the file
            if frames < 2:  # random bytes may look like one frame header
                raise InvalidRequestError("the data is not a WAV, MP3 or FLAC file", param=param)
            raise InvalidRequestError(
                f"the MP3 has bytes that are no MPEG audio frame at byte {pos} (a truncated "
                "or corrupt file)",
                param=param,
            )
        length, samples, rate = header
        if pos + length > len(data):
            raise InvalidRequestError(
                "the MP3's last frame is cut short (a truncated file?)", param=param
            )
        if not (frames == 0 and declared is not None):  # a Xing/Info frame holds no audio
            seconds += samples / rate
        frames += 1
        if seconds > max_seconds:
            return seconds  # no need to read further: it is refused
        pos += length
    if declared is not None and frames - 1 != declared:
        raise InvalidRequestError(
            f"the MP3's Xing/Info header says {declared} frames, but the file holds "
            f"{frames - 1} (a truncated file?)",
            param=param,
        )
    return seconds


def _xing_frames(data: bytes, at: int) -> int | None:
    """The frame count a Xing or Info header in the first frame at ``at`` gives (the
    frames after it), if it has one."""
    header = _mp3_header(data, at)
    if header is None:
        return None
    frame = data[at : at + header[0]]
    for tag in (b"Xing", b"Info"):
        i = frame.find(tag, 4, 48)
        if i >= 0 and i + 12 <= len(frame) and frame[i + 7] & 1:
            return int.from_bytes(frame[i + 8 : i + 12], "big")
    return None
