"""llama.cpp's own grammar engine, driven byte by byte with a model's vocabulary: what a
grammar accepts is asked of ``llama_sampler_init_grammar`` (the sampler the engine uses),
never of a grammar interpreter written here."""

from __future__ import annotations

import codecs
import ctypes
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

__all__ = ["GrammarProbe"]

_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


class GrammarProbe:
    """A model's vocabulary (loaded alone, no weights) and llama.cpp's grammar sampler."""

    def __init__(self, model: Path, *, all_bytes: bool = True) -> None:
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self._model = llama_cpp.llama_model_load_from_file(str(model).encode(), params)
        assert self._model, f"cannot load the vocabulary of {model}"
        self.vocab = llama_cpp.llama_model_get_vocab(self._model)
        n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        buf = ctypes.create_string_buffer(64)
        #: For each byte, a token whose text is that byte alone.
        self.byte_token: dict[int, int] = {}
        for token in range(n_vocab):
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
            if n == 1 and not llama_cpp.llama_vocab_is_eog(self.vocab, token):
                self.byte_token.setdefault(buf.raw[0], token)
        missing = [b for b in range(256) if b not in self.byte_token]
        assert not (missing and all_bytes), f"no single-byte token for bytes {missing[:8]}"
        #: An end-of-generation token (None: the vocabulary has none, as qwen35's).
        self.eog = min(self.eog_tokens(), default=None)

    def close(self) -> None:
        llama_cpp.llama_model_free(self._model)

    def pieces(self) -> list[bytes]:
        """Every token's text, special tokens rendered (as the grammar reads it)."""
        out = []
        buf = ctypes.create_string_buffer(256)
        for token in range(llama_cpp.llama_vocab_n_tokens(self.vocab)):
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
            assert n >= 0, f"token {token}'s text is longer than {len(buf)} bytes"
            out.append(buf.raw[:n])
        return out

    def eog_tokens(self) -> frozenset[int]:
        n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        return frozenset(t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(self.vocab, t))

    @contextmanager
    def grammar(self, gbnf: str) -> Iterator[Any]:
        sampler = llama_cpp.llama_sampler_init_grammar(self.vocab, gbnf.encode(), b"root")
        assert sampler, "llama.cpp refused the grammar"
        try:
            yield sampler
        finally:
            llama_cpp.llama_sampler_free(sampler)

    def allowed(self, sampler: Any, tokens: list[int]) -> list[bool]:
        """Which of ``tokens`` the grammar allows next."""
        data = np.zeros(len(tokens), dtype=_TOKEN_DATA)
        data["id"] = tokens
        array = llama_cpp.llama_token_data_array(
            data=data.ctypes.data_as(llama_cpp.llama_token_data_p),
            size=len(tokens),
            selected=-1,
            sorted=False,
        )
        llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
        return [bool(np.isfinite(x)) for x in data["logit"]]

    def feed(self, sampler: Any, data: bytes) -> bool:
        """Feed ``data`` byte by byte; false (and the sampler spoiled) at the first byte the
        grammar refuses."""
        for byte in data:
            token = self.byte_token[byte]
            if not self.allowed(sampler, [token])[0]:
                return False
            llama_cpp.llama_sampler_accept(sampler, token)
        return True

    def can_end(self, sampler: Any) -> bool:
        """Whether the grammar may end here (never asked, false, without an end token)."""
        return self.eog is not None and self.allowed(sampler, [self.eog])[0]

    def accepts(self, gbnf: str, text: str) -> bool:
        """Whether the grammar accepts exactly ``text``."""
        with self.grammar(gbnf) as sampler:
            return self.feed(sampler, text.encode()) and self.can_end(sampler)

    def walk(
        self,
        gbnf: str,
        choose: Callable[[int, bool], int],
        limit: int = 600,
        *,
        prefix: bool = False,
    ) -> str | None:
        """A random string the grammar accepts: at each step ``choose(n, can_end)`` picks one
        of the ``n`` bytes llama.cpp allows next (those that keep the text valid UTF-8, in
        byte order), or -1 to end where the grammar may end. ``None`` past ``limit`` bytes
        (``prefix``: the text so far, which the grammar may not accept whole)."""
        out = bytearray()
        known = sorted(self.byte_token)  # every byte, unless made with all_bytes=False
        tokens = [self.byte_token[b] for b in known]
        with self.grammar(gbnf) as sampler:
            while len(out) < limit:
                allowed = self.allowed(sampler, tokens)
                options = [b for b, ok in zip(known, allowed, strict=True) if ok]
                options = [b for b in options if _utf8_prefix(out, b)]
                can_end = self.can_end(sampler)
                if prefix and not options and self.eog is None:
                    break  # complete, as far as can be asked
                assert options or can_end, f"the grammar is stuck after {bytes(out)!r}"
                pick = choose(len(options), can_end) if options else -1
                if pick < 0:
                    return out.decode("utf-8")
                assert self.feed(sampler, bytes([options[pick]]))
                out.append(options[pick])
        return out.decode("utf-8", "ignore") if prefix else None


def _utf8_prefix(text: bytearray, byte: int) -> bool:
    """Whether ``text`` + ``byte`` can still be (the start of) valid UTF-8."""
    start = len(text)
    while start > max(0, len(text) - 3) and 0x80 <= text[start - 1] <= 0xBF:
        start -= 1
    start = max(start - 1, 0)  # the last character's lead byte
    second = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}
    if start == len(text) - 1 and text and text[-1] in second:
        low, high = second[text[-1]]
        return low <= byte <= high
    try:
        codecs.utf_8_decode(bytes(text[start:]) + bytes([byte]), "strict", False)
    except UnicodeDecodeError:
        return False
    return True
