"""Argument types for the CLI: malformed values are refused by the parser, before anything connects or publishes.

Each raises argparse.ArgumentTypeError with what was expected; the CLI's parser prints that as one
line and exits with status 2 (veriloco/cli.py).
"""

from __future__ import annotations

import argparse


def _int(text: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def run_id(text: str) -> int:
    """A run id: runs are numbered from 1 (see `veriloco runs`)."""
    n = _int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is not a run id; runs are numbered from 1 (list them with `veriloco runs`)")
    return n


def epoch(text: str) -> int:
    n = _int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"{n} is not an epoch; epochs are numbered from 0")
    return n


def positive(text: str) -> int:
    n = _int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} must be at least 1")
    return n


def non_negative(text: str) -> int:
    n = _int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"{n} must not be negative")
    return n


def tcp_port(text: str) -> int:
    n = _int(text)
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"{n} is not a TCP port (0 to 65535)")
    return n


def host(text: str) -> str:
    """An address of this machine to listen on: an IPv4 or IPv6 literal (0.0.0.0: every interface), or localhost."""
    import ipaddress

    if text == "localhost":
        return text
    try:
        return str(ipaddress.ip_address(text.strip("[]")))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an IP address to listen on (e.g. 127.0.0.1, the default; 0.0.0.0 for every interface)"
        ) from None


def is_loopback(host_: str) -> bool:
    """Whether listening on `host_` (a `host` value) keeps the port to this machine."""
    import ipaddress

    return host_ == "localhost" or ipaddress.ip_address(host_).is_loopback


def seconds(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not x > 0 or x == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a positive number of seconds")
    return x


def gibibytes(text: str) -> int:
    """A size in GiB (fractions allowed, 0 included), as bytes."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size in GiB (e.g. 4 or 0.5)") from None
    if not 0 <= x < 2**20:
        raise argparse.ArgumentTypeError(f"{text} must be a size in GiB from 0 to 1048575")
    return int(x * 2**30)


def device(text: str) -> str:
    """A torch device this machine can compute on: cpu, cuda or cuda:N (dilocox/device.py)."""
    if text == "cpu":  # the default, always there: a node's first line need not wait for torch (issue 32)
        return text
    from dilocox.device import resolve_device  # torch: only for the commands that take --device
    from dilocox.inner import TrainerError

    try:
        resolve_device(text)
    except TrainerError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def address(text: str) -> str:
    """A 20-byte Ethereum address (0x + 40 hex digits; a mixed-case one must carry a valid checksum)."""
    from eth_utils import is_address, to_checksum_address

    if not (text.startswith("0x") and is_address(text)):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an Ethereum address (0x followed by 40 hex digits, checksummed if mixed-case)"
        )
    return str(to_checksum_address(text))


def relay_url(text: str) -> str:
    """An http:// URL of a window relay (what the coordinator prints as `relay`)."""
    from urllib.parse import urlsplit

    try:
        u = urlsplit(text)
        ok = u.scheme == "http" and bool(u.hostname) and u.port is not None
    except ValueError:
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(f"{text!r} is not a relay URL: give http://HOST:PORT, as the coordinator "
                                         "prints it when it starts with --relay-port")
    return text
