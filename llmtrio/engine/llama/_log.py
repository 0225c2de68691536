"""llama.cpp's log, routed to the ``llmtrio.llama`` logger; its last lines kept, so a failed
load or parse can say why."""

from __future__ import annotations

import ctypes
import logging
import threading
from collections import deque

import llama_cpp

__all__ = ["recent_log"]

logger = logging.getLogger("llmtrio.llama")

# llama.cpp logs through one process-wide callback. Its warnings and errors go to our logger;
# the last lines are kept so a failed load can say why.
_recent_lines: deque[str] = deque(maxlen=20)
_log_lock = threading.Lock()
# ggml's levels: 1 debug, 2 info, 3 warn, 4 error, 5 continues the previous line's level.
_LEVELS = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR}
_last_level = [logging.DEBUG]


@llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]
def _log_callback(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    line = text.decode("utf-8", "replace").rstrip()
    if not line:
        return
    with _log_lock:
        _recent_lines.append(line)
        if level != 5:
            _last_level[0] = _LEVELS.get(level, logging.DEBUG)
        py_level = _last_level[0]
    logger.log(py_level, "%s", line)


llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
llama_cpp.llama_backend_init()


def recent_log() -> str:
    """The last error lines llama.cpp logged (and forget them)."""
    with _log_lock:
        lines = [line for line in _recent_lines if "error" in line.lower() or "failed" in line]
        _recent_lines.clear()
    return "; ".join(lines[-3:])
