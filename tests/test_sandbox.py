"""``python -m bookkeeper_aio.sandbox``: the local cluster stops, servers and all, on a signal."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.process
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue
            if f"\nPPid:\t{pid}\n" in status:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status  # a zombie has exited


def _wait_for(proc: subprocess.Popen[bytes], text: bytes) -> None:
    """Read the sandbox's output (unbuffered: select sees every byte) until ``text``."""
    assert proc.stdout is not None
    fd, seen = proc.stdout.fileno(), b""
    deadline = time.monotonic() + START_TIMEOUT_S
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if sel.select(timeout=1.0):
                chunk = os.read(fd, 4096)
                assert chunk, f"the sandbox exited before it was running: {seen!r}"
                seen += chunk
                if text in seen:
                    return
    raise AssertionError(f"no {text!r} within {START_TIMEOUT_S} s: {seen!r}")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_sandbox_and_its_servers(tmp_path: Path, signum: int) -> None:
    # As a shell's background job: SIGINT ignored (the sandbox must still stop on it).
    proc = subprocess.Popen(
        [sys.executable, "-m", "bookkeeper_aio.sandbox", "--bookies", "1", "--dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    servers: list[int] = []
    try:
        _wait_for(proc, b"running")
        servers = _children(proc.pid)
        assert len(servers) == 2  # etcd and the bookie
        proc.send_signal(signum)
        assert proc.wait(timeout=STOP_TIMEOUT_S) == 0
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while any(map(_alive, servers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in servers if _alive(pid)]
    finally:
        servers += _children(proc.pid)  # whatever it started, if it failed before
        proc.kill()
        proc.wait()
        for pid in servers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
