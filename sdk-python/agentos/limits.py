"""Resource limits as people write them: ``"256M"`` of memory, ``0.5`` CPUs.

The grammar is the CLI's (``agentos spawn --memory 256M --cpus 0.5``): a
size is a whole number of bytes, optionally followed by ``K``, ``M`` or
``G`` (powers of 1024, in either case, ``B``/``iB`` allowed after them);
a CPU share is a positive number of CPUs, sent as a quota over a period
of 100 ms.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Union

Size = Union[int, str]

#: The CPU period, in microseconds, that a share in CPUs is a quota of.
CPU_PERIOD_US = 100_000

_SCALES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_LIMIT_KEYS = ("memory", "cpus", "cpu_quota", "cpu_period", "max_pids")


def parse_size(size: Size) -> int:
    """Bytes from ``512``, ``"64K"``, ``"50M"``, ``"2G"`` or ``"1GiB"``.

    >>> parse_size("256M")
    268435456
    >>> parse_size("64k"), parse_size("1GiB"), parse_size(4096)
    (65536, 1073741824, 4096)
    >>> parse_size("1.5G")
    Traceback (most recent call last):
    ...
    ValueError: unknown unit in '1.5G': use K, M or G
    """
    if isinstance(size, bool) or not isinstance(size, (int, str)):
        raise TypeError(f"a size is an int or a str like '256M', not {size!r}")
    if isinstance(size, int):
        if size < 0:
            raise ValueError(f"a size cannot be negative: {size}")
        return size
    text = size.strip()
    digits_end = len(text)
    for at, char in enumerate(text):
        if not ("0" <= char <= "9"):
            digits_end = at
            break
    digits, unit = text[:digits_end], text[digits_end:].upper()
    if not digits:
        raise ValueError(f"{text!r} is not a size (try 512M)")
    while unit.endswith("IB"):
        unit = unit[:-2]
    unit = unit.rstrip("B")
    if unit not in _SCALES:
        raise ValueError(f"unknown unit in {text!r}: use K, M or G")
    value = int(digits) * _SCALES[unit]
    if value >= 1 << 64:
        raise ValueError(f"{text!r} is too large")
    return value


def cpu_quota(cpus: float) -> int:
    """The quota, in microseconds per :data:`CPU_PERIOD_US`, of a share in CPUs.

    >>> cpu_quota(0.5), cpu_quota(2)
    (50000, 200000)
    """
    if isinstance(cpus, bool) or not isinstance(cpus, (int, float)):
        raise TypeError(f"cpus is a number of CPUs, not {cpus!r}")
    if not (cpus > 0 and cpus != float("inf")):
        raise ValueError(f"cpus must be a positive number, not {cpus!r}")
    return round(cpus * CPU_PERIOD_US)


def wire_limits(limits: Mapping[str, Any], *, period: bool = True) -> Dict[str, int]:
    """A request's ``limits``: ``memory`` as a size, ``cpus`` as a CPU share
    (or ``cpu_quota`` and ``cpu_period`` in microseconds), ``max_pids``.
    An EXEC run's period is always the kernel's 100 ms, so for a run
    (``period=False``) a share is sent as its quota alone.

    >>> wire_limits({"memory": "256M", "cpus": 0.5, "max_pids": 64})
    {'memory': 268435456, 'cpu_quota': 50000, 'cpu_period': 100000, 'max_pids': 64}
    >>> wire_limits({"cpus": 0.5}, period=False)
    {'cpu_quota': 50000}
    """
    unknown = [key for key in limits if key not in _LIMIT_KEYS]
    if unknown:
        raise ValueError(
            f"unknown limit {unknown[0]!r}: limits are {', '.join(_LIMIT_KEYS)}"
        )
    if "cpus" in limits and ("cpu_quota" in limits or "cpu_period" in limits):
        raise ValueError("give cpus, or cpu_quota and cpu_period, not both")
    wire: Dict[str, int] = {}
    for key, value in limits.items():
        if key == "memory":
            wire["memory"] = parse_size(value)
        elif key == "cpus":
            wire["cpu_quota"] = cpu_quota(value)
            if period:
                wire["cpu_period"] = CPU_PERIOD_US
        else:
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"limit {key!r} is a whole number, not {value!r}")
            wire[key] = value
    return wire
