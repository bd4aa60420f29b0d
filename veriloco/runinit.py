"""`veriloco run init`: write the commented example run config, so a pip-only user has one to edit.

The text is examples/run.toml. A wheel carries it as the package data `veriloco/examples/run.toml`
(setup.py maps examples/ onto veriloco.examples); a checkout reads examples/ itself.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from protocol.errors import VerilocoError

_PACKAGED = Path(__file__).resolve().parent / "examples"
EXAMPLES = _PACKAGED if (_PACKAGED / "run.toml").is_file() else Path(__file__).resolve().parents[1] / "examples"


class RunInitError(VerilocoError):
    """The config cannot be written where asked."""


def example_config() -> str:
    """The example run config's text (examples/run.toml)."""
    path = EXAMPLES / "run.toml"
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RunInitError(f"the example config {path} is missing ({exc.strerror}); reinstall veriloco") from None


def cmd_run_init(args: argparse.Namespace) -> int:
    text = example_config()
    if str(args.out) == "-":
        sys.stdout.write(text)
        return 0
    out: Path = args.out
    if out.is_dir():
        raise RunInitError(f"{out} is a folder; pass --out FILE")
    if out.exists() and not args.force:
        raise RunInitError(f"{out} already exists; pass --force to overwrite it, or --out another file")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)  # whole or not at all
    print(f"wrote {out}: a small run with every setting commented; edit it, then "
          f"`veriloco run create --config {out}` (missing keys take the defaults)")
    return 0


def register_init(rsub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`run init`, under the `run` command that veriloco/chaincmds.py registers."""
    i = rsub.add_parser("init", help="write the commented example run config (examples/run.toml) to edit")
    i.add_argument("--out", type=Path, default=Path("run.toml"), help="where to write it (default: run.toml; -: stdout)")
    i.add_argument("--force", action="store_true", help="overwrite an existing file")
    i.set_defaults(func=cmd_run_init)
