"""Configuration: every numeric field refuses NaN and infinities, zero where it means nothing."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import pytest

from bookkeeper_aio.config import BookieConfig, ClientConfig, MetadataConfig
from bookkeeper_aio.errors import ConfigError

CLASSES = (BookieConfig, ClientConfig, MetadataConfig)
FLOAT_FIELDS = [
    (cls, f.name)
    for cls in CLASSES
    for f in dataclasses.fields(cls)
    if isinstance(getattr(cls(), f.name), float)
]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize(("cls", "name"), FLOAT_FIELDS, ids=lambda x: getattr(x, "__name__", x))
def test_every_float_field_refuses_nan_and_infinities(cls, name, value):
    with pytest.raises(ConfigError, match=name):
        cls.from_mapping({name: value})
    with pytest.raises(ConfigError, match=name):
        cls().replace(**{name: value})


def test_the_integrity_check_interval_may_be_zero_meaning_at_boot_only():
    assert BookieConfig.from_mapping({"data_integrity_check_interval_s": 0}).validate() is None
    with pytest.raises(ConfigError, match="data_integrity_check_interval_s"):
        BookieConfig.from_mapping({"data_integrity_check_interval_s": -1})
    with pytest.raises(ConfigError, match="handshake_timeout_s"):
        BookieConfig.from_mapping({"handshake_timeout_s": 0})
    with pytest.raises(ConfigError, match="list_sync_timeout_s"):
        BookieConfig.from_mapping({"list_sync_timeout_s": 0})


def test_a_bookie_started_with_a_nan_timeout_exits_2_naming_the_key(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "bookkeeper_aio.bookie", "--journal-dir", str(tmp_path / "j"),
         "--ledger-dir", str(tmp_path / "l"), "--set", "handshake_timeout_s=nan"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "handshake_timeout_s" in result.stderr


def test_the_bookie_process_sets_its_gil_switch_interval_before_it_runs(tmp_path, monkeypatch):
    # The journal thread waits for the GIL after each of its syscalls for up to this long
    # while the event loop runs: the bookie's entry point sets it for the whole process.
    from bookkeeper_aio.bookie import __main__ as entry

    seen: list[float] = []

    def fake_run(coro) -> int:
        coro.close()
        seen.append(sys.getswitchinterval())
        return 0

    monkeypatch.setattr(entry.uvloop, "run", fake_run)
    before = sys.getswitchinterval()
    try:
        argv = ["--journal-dir", str(tmp_path / "j"), "--ledger-dir", str(tmp_path / "l")]
        assert entry.main([*argv, "--set", "gil_switch_interval_s=0.002"]) == 0
        assert entry.main(argv) == 0
    finally:
        sys.setswitchinterval(before)
    assert seen == [pytest.approx(0.002), pytest.approx(0.0005)]
    for bad in (0, -1, 2):
        with pytest.raises(ConfigError, match="gil_switch_interval_s"):
            BookieConfig.from_mapping({"gil_switch_interval_s": bad})
