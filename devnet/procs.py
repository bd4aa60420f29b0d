"""Stopping a child process the way every launcher here does: a polite signal, then SIGKILL."""

from __future__ import annotations

import signal
import subprocess


def stop_process(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
    """Send `sig` if it still runs, wait `timeout` s, SIGKILL if it hangs; returns the exit code."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)
    return int(proc.returncode)
