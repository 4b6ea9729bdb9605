"""Sizes and CPU shares read as the CLI reads them."""

from __future__ import annotations

import pytest

from agentos.limits import cpu_quota, parse_size, wire_limits


@pytest.mark.parametrize("text, size", [
    ("512", 512), ("64K", 64 << 10), ("64k", 64 << 10), ("50M", 50 << 20), ("2G", 2 << 30),
    ("1GiB", 1 << 30), ("1gb", 1 << 30), ("256MB", 256 << 20), (" 8M ", 8 << 20), ("0", 0),
])
def test_sizes_the_cli_accepts(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text, problem", [
    ("1.5G", "unknown unit"), ("1T", "unknown unit"), ("8 M", "unknown unit"),
    ("M", "not a size"), ("", "not a size"), ("-1M", "not a size"),
    ("99999999999999999999G", "too large"),
])
def test_sizes_the_cli_refuses(text, problem):
    with pytest.raises(ValueError, match=problem):
        parse_size(text)


def test_sizes_as_numbers():
    assert parse_size(1 << 20) == 1 << 20
    with pytest.raises(ValueError):
        parse_size(-1)
    for wrong in (1.5, True, None):
        with pytest.raises(TypeError):
            parse_size(wrong)  # type: ignore[arg-type]


def test_cpus_are_a_quota_over_a_100ms_period():
    assert cpu_quota(0.5) == 50_000
    assert cpu_quota(0.1) == 10_000
    assert cpu_quota(4) == 400_000
    for wrong in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="positive"):
            cpu_quota(wrong)


def test_wire_limits_pass_protocol_fields_through():
    assert wire_limits({"cpu_quota": 20_000, "cpu_period": 100_000, "max_pids": 4}) == {
        "cpu_quota": 20_000, "cpu_period": 100_000, "max_pids": 4}
    with pytest.raises(TypeError, match="max_pids"):
        wire_limits({"max_pids": "4"})
