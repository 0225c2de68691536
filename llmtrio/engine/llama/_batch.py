"""A ``llama_batch`` over numpy arrays (:class:`Batch`): what one ``llama_decode`` takes.

Runs on the thread that owns the context; nothing here knows of Trio.
"""

from __future__ import annotations

import ctypes
from typing import Any, cast

import llama_cpp
import numpy as np
import numpy.typing as npt

__all__ = ["Batch"]


class Batch:
    """A ``llama_batch`` over numpy arrays, filled a slice at a time (no per-token objects).

    Every token belongs to one sequence; the ``seq_id`` pointers are set once to point into a
    flat array, so sequence ids are filled like the other columns.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.token = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.seq = np.zeros(capacity, dtype=np.int32)
        self.n_seq_id = np.ones(capacity, dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        item = ctypes.sizeof(ctypes.c_int32)
        base = self.seq.ctypes.data
        self._seq_ptrs = (ctypes.POINTER(llama_cpp.llama_seq_id) * capacity)(
            *(
                ctypes.cast(base + i * item, ctypes.POINTER(llama_cpp.llama_seq_id))
                for i in range(capacity)
            )
        )
        self.struct: Any = cast(Any, llama_cpp.llama_batch())
        self.struct.token = self.token.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token))
        self.struct.embd = None
        self.struct.pos = self.pos.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_pos))
        self.struct.n_seq_id = self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.struct.seq_id = self._seq_ptrs
        self.struct.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        self.n = 0

    def clear(self) -> None:
        self.n = 0

    def add(
        self,
        tokens: npt.NDArray[np.int32] | list[int],
        start_pos: int,
        seq: int,
        *,
        output_last: bool,
        output_all: bool = False,
    ) -> int:
        """Append ``tokens`` of ``seq`` at positions ``start_pos...``; returns the batch index
        of the last one (whose logits are output when ``output_last``; every token's are
        when ``output_all``)."""
        n = len(tokens)
        i = self.n
        self.token[i : i + n] = tokens
        self.pos[i : i + n] = np.arange(start_pos, start_pos + n, dtype=np.int32)
        self.seq[i : i + n] = seq
        self.logits[i : i + n] = 1 if output_all else 0
        if output_last:
            self.logits[i + n - 1] = 1
        self.n = i + n
        self.struct.n_tokens = self.n
        return i + n - 1

    def add_one(self, token: int, pos: int, seq: int) -> int:
        i = self.n
        self.token[i] = token
        self.pos[i] = pos
        self.seq[i] = seq
        self.logits[i] = 1
        self.n = i + 1
        self.struct.n_tokens = self.n
        return i
