"""Logical time (int ns since the epoch) to and from RFC 3339, without the machine clock."""

from __future__ import annotations

import datetime as _dt
import functools
import re

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
#: the range of RFC 3339 (years 0001..9999), in ns since the epoch: every time kai-es reads (a
#: Kubernetes timestamp, an event's logical time) must lie in it; a decoded event outside it is
#: refused (`kai_es.events.codec.decode`)
MIN_TIME_NS = -62_135_596_800 * 1_000_000_000
MAX_TIME_NS = 253_402_300_799 * 1_000_000_000 + 999_999_999
_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(Z|z|[+-]\d{2}:\d{2})$"
)


@functools.lru_cache(maxsize=4096)
def rfc3339(ns: int) -> str:
    """`ns` rendered as UTC RFC 3339 with nanoseconds when non-zero (deterministic; memoised,
    since a cycle's decisions all share one logical time). Total: a time outside RFC 3339's
    years (`MIN_TIME_NS`..`MAX_TIME_NS`) is rendered as `<ns>ns since the epoch`."""
    if not MIN_TIME_NS <= ns <= MAX_TIME_NS:
        return f"{ns}ns since the epoch"
    seconds, frac = divmod(ns, 1_000_000_000)
    base = _second(seconds)
    if frac:
        return f"{base}.{frac:09d}".rstrip("0") + "Z"
    return base + "Z"


@functools.lru_cache(maxsize=64)
def _second(seconds: int) -> str:
    """The date and time of a second since the epoch, without zone (memoised: an observed
    event's time is the wall clock's, distinct to the nanosecond, yet many share a second)."""
    t = _EPOCH + _dt.timedelta(seconds=seconds)
    # not strftime: its %Y drops the leading zeros of years before 1000 on glibc
    return f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}"


@functools.lru_cache(maxsize=4096)  # a pod's timestamps come back in each of its watch events
def parse_rfc3339(text: str) -> int:
    """RFC 3339 timestamp to int ns since the epoch. Raises ValueError with the text on failure."""
    m = _RFC3339.match(text.strip())
    if not m:
        raise ValueError(f"not an RFC 3339 timestamp: {text!r}")
    year, month, day, hour, minute, sec, frac, zone = m.groups()
    tz = _dt.timezone.utc
    if zone not in ("Z", "z"):
        sign = 1 if zone[0] == "+" else -1
        tz = _dt.timezone(sign * _dt.timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6])))
    moment = _dt.datetime(int(year), int(month), int(day), int(hour), int(minute), int(sec), tzinfo=tz)
    delta = moment - _EPOCH
    whole = (delta.days * 86_400 + delta.seconds) * 1_000_000_000
    return whole + (int(frac.ljust(9, "0")) if frac else 0)


#: the longest duration kai-es reads (a run length, a grace period, a window): 100 years
MAX_DURATION_NS = 100 * 365 * 86_400 * 10**9
#: at most 24 digits a term: more is never a duration within MAX_DURATION_NS, and is refused
#: before a huge integer is built
_DURATION = re.compile(r"(\d{1,24})(ns|us|µs|ms|s|m|h|d)")
_UNIT_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000,
            "m": 60_000_000_000, "h": 3_600_000_000_000, "d": 86_400_000_000_000}


def parse_duration(text: str) -> int:
    """Kubernetes/Go-style duration (`90s`, `5m`, `1h30m`, `0s`) to int ns. Raises ValueError."""
    s = str(text).strip()
    if s == "0":
        return 0
    pos = 0
    total = 0
    for m in _DURATION.finditer(s):
        if m.start() != pos:
            break
        total += int(m.group(1)) * _UNIT_NS[m.group(2)]
        pos = m.end()
    if pos != len(s) or not s:
        raise ValueError(f"not a duration (use e.g. 90s, 5m, 2h): {_shown(text)}")
    if total > MAX_DURATION_NS:
        raise ValueError(f"{_shown(text)} is longer than the longest duration accepted (100 years)")
    return total


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 40 else f"{text[:40]!r}... ({len(text)} characters)"


def parse_signed_duration(text: str) -> int:
    """`parse_duration` that also accepts a leading `-` (KAI's "negative: never", e.g. a staleness
    grace period of `-1s`). Raises ValueError."""
    s = str(text).strip()
    if s.startswith("-"):
        return -parse_duration(s[1:])
    return parse_duration(s)


def format_duration(ns: int) -> str:
    """int ns to a short human duration (`1h2m3s`, `250ms`; whole seconds truncated; under a
    second, exact: `250ms` or `1500ns`). Decision reasons are written with it: its output for a
    given `ns` never changes (logs must replay). For display, `format_span`."""
    if ns == 0:
        return "0s"
    if ns < 0:
        return "-" + format_duration(-ns)
    if ns < 1_000_000_000:
        return f"{ns // 1_000_000}ms" if ns % 1_000_000 == 0 else f"{ns}ns"
    seconds = ns // 1_000_000_000
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    out = (f"{h}h" if h else "") + (f"{m}m" if m else "") + (f"{s}s" if s or not (h or m) else "")
    return out


def format_span(ns: int) -> str:
    """A measured span for people (a wait, a delta): `format_duration` rounded to whole
    milliseconds under a second and to whole seconds above (`536ms`, `3m55s`, never `536057820ns`)."""
    if ns < 0:
        return "-" + format_span(-ns)
    if ns < 1_000_000_000:
        return format_duration((ns + 500_000) // 1_000_000 * 1_000_000)
    return format_duration((ns + 500_000_000) // 1_000_000_000 * 1_000_000_000)
