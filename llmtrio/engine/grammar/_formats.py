"""The string formats structured output enforces, as patterns of the supported subset. Pure.

Each is exact in one direction: every string it allows is valid for the format (as
``jsonschema``'s format checker and RFC 3339 / RFC 1123 / RFC 4291 read it). Where the format
allows more than a grammar should offer a model, it is narrowed, as stated here:

- ``date`` (``2024-02-29``: years 0001-9999, real month lengths, leap years), ``time``
  (``23:59:30``, an optional fraction of 1-9 digits, ``Z`` or a ``+hh:mm`` offset; no leap
  second), ``date-time`` (a date, ``T``, a time);
- ``duration`` (ISO 8601 as RFC 3339's appendix A: ``P1Y2M3DT4H5M6S``, ``P3W``; 1-4 digits per
  part);
- ``email`` (a dot-atom local part of 1-4 atoms of 1-15 characters, ``@``, a domain of 2-4
  labels), ``hostname`` (1-6 labels of 1-40 letters, digits and inner hyphens: never over
  253 characters);
- ``ipv4`` (no leading zeros), ``ipv6`` (RFC 4291's text forms, ``::`` and an IPv4 tail
  included), ``uuid`` (8-4-4-4-12 hex digits, either case).
"""

from __future__ import annotations

import functools

from ._automaton import Dfa
from ._regex import pattern_dfa

__all__ = ["FORMATS", "format_dfa"]

_DAY_31 = "(0[1-9]|[12][0-9]|3[01])"
_DAY_30 = "(0[1-9]|[12][0-9]|30)"
_DAY_28 = "(0[1-9]|1[0-9]|2[0-8])"
_YEAR = "(000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})"
# Years divisible by 4 and not by 100, or divisible by 400 (never 0000).
_LEAP = "([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)"
_DATE = (
    f"({_YEAR}-(0[13578]|1[02])-{_DAY_31}|{_YEAR}-(0[469]|11)-{_DAY_30}"
    f"|{_YEAR}-02-{_DAY_28}|{_LEAP}-02-29)"
)
_HOUR = "([01][0-9]|2[0-3])"
_TIME = f"{_HOUR}:[0-5][0-9]:[0-5][0-9](\\.[0-9]{{1,9}})?(Z|[+-]{_HOUR}:[0-5][0-9])"
_N = "[0-9]{1,4}"
_DUR_TIME = f"T({_N}H({_N}M({_N}S)?)?|{_N}M({_N}S)?|{_N}S)"
_DUR_DATE = f"({_N}D|{_N}M({_N}D)?|{_N}Y({_N}M({_N}D)?)?)"
_DURATION = f"P({_DUR_DATE}({_DUR_TIME})?|{_DUR_TIME}|{_N}W)"


def _label(longest: int) -> str:
    return f"[A-Za-z0-9]([-A-Za-z0-9]{{0,{longest - 2}}}[A-Za-z0-9])?"


_HOSTNAME = f"{_label(40)}(\\.{_label(40)}){{0,5}}"
_ATOM = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]{1,15}"
_EMAIL = f"{_ATOM}(\\.{_ATOM}){{0,3}}@{_label(40)}(\\.{_label(40)}){{1,3}}"
_OCTET = "(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4 = f"{_OCTET}(\\.{_OCTET}){{3}}"
_H16 = "[0-9a-fA-F]{1,4}"
_LS32 = f"({_H16}:{_H16}|{_IPV4})"


def _ipv6() -> str:
    # RFC 3986's IPv6address: n groups before '::' and m after, n + m <= 7 (6 with an
    # IPv4 tail counted as two), or 8 groups and no '::'.
    forms = [f"({_H16}:){{6}}{_LS32}", f"::({_H16}:){{5}}{_LS32}"]
    for before in range(0, 7):
        head = f"({_H16}(:{_H16}){{0,{before}}})?::" if before else f"({_H16})?::"
        after = 4 - before
        if after > 0:
            forms.append(f"{head}({_H16}:){{{after}}}{_LS32}")
        elif after == 0:
            forms.append(f"{head}{_LS32}")
        elif after == -1:
            forms.append(f"{head}{_H16}")
        else:
            forms.append(head)
    return "(" + "|".join(forms) + ")"


_UUID = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"

#: Each enforced format's pattern (matched whole).
FORMATS: dict[str, str] = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}T{_TIME}",
    "duration": _DURATION,
    "email": _EMAIL,
    "hostname": _HOSTNAME,
    "ipv4": _IPV4,
    "ipv6": _ipv6(),
    "uuid": _UUID,
}
# Older names llama.cpp's converter took for a UUID: any UUID is one of them.
for _version in range(1, 6):
    FORMATS[f"uuid{_version}"] = _UUID


@functools.cache
def format_dfa(name: str) -> Dfa:
    """The strings format ``name`` allows here (``KeyError``: not enforced)."""
    return pattern_dfa(f"^{FORMATS[name]}$", search=False)
