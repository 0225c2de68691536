"""Durations as Ollama's ``keep_alive`` takes them: seconds (a number) or a Go-style
duration (``"10m"``, ``"1h30m"``, ``"45s"``, ``"-1"``); any negative value is for ever.

Pure: the models file, the ``--keep-alive`` flag and a request's ``keep_alive`` field read
it alike.
"""

from __future__ import annotations

import math
import re

__all__ = ["FOREVER", "keep_alive_seconds"]

#: A keep-alive that never runs out (a negative one).
FOREVER = math.inf

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_DURATION = re.compile(r"^(?:\d+(?:\.\d+)?(?:ms|s|m|h))+$")


def keep_alive_seconds(value: object) -> float:
    """``value`` as seconds: a number (int or float, not a bool) or a string of a number or
    a duration; negative is :data:`FOREVER`.

    Error handling: raises ``ValueError`` saying what was expected.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f'must be seconds or a duration like "5m", not {value!r}')
    if isinstance(value, str):
        text = value.strip()
        sign = -1.0 if text.startswith("-") else 1.0
        body = text.lstrip("+-")
        try:
            seconds = float(body)
        except ValueError:
            if not _DURATION.match(body):
                raise ValueError(
                    f'must be seconds or a duration like "5m", "1h30m", not {value!r}'
                ) from None
            seconds = sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(body))
        seconds *= sign
    else:
        seconds = float(value)
    if math.isnan(seconds):
        raise ValueError("must be a number of seconds, not NaN")
    return FOREVER if seconds < 0 else seconds
