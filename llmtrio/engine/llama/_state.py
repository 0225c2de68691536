"""What names the format of a sequence's state as this llama.cpp build writes it
(``llama_state_seq_get_data``): a snapshot written by another build is never restored."""

from __future__ import annotations

from typing import Final

import llama_cpp

__all__ = ["STATE_FORMAT"]

STATE_FORMAT: Final = (
    f"llama-cpp-python {llama_cpp.__version__}, "
    f"state {llama_cpp.LLAMA_STATE_SEQ_MAGIC:#x} v{llama_cpp.LLAMA_STATE_SEQ_VERSION}, "
    f"session v{llama_cpp.LLAMA_SESSION_VERSION}"
)
"""The llama.cpp build's name for its state format (the binding's version, which pins the
vendored llama.cpp, and the format versions llama.cpp declares)."""
