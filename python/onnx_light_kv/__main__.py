"""Command line: ``python -m onnx_light_kv info|demo``."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence


def _info() -> int:
    from . import build_info

    info = build_info()
    width = max(len(k) for k in info)
    for k, v in info.items():
        if isinstance(v, list):
            v = " ".join(map(str, v))
        elif isinstance(v, dict):
            v = ", ".join(f"{a}={b:,}" if isinstance(b, int) else f"{a}={b}" for a, b in v.items())
        print(f"{k:<{width}}  {v}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``python -m onnx_light_kv`` and the ``onnx-light-kv`` script."""
    p = argparse.ArgumentParser(prog="python -m onnx_light_kv", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="version, Go version, CPU features and active kernel paths")
    d = sub.add_parser("demo", help="decode loop on synthetic data, with figures")
    from .demo import add_arguments

    add_arguments(d)
    args = p.parse_args(argv)
    if args.cmd == "info":
        return _info()
    from .demo import run

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
