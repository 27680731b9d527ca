"""Command line: ``python -m onnx_light_kv info|demo|generate``."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence


def _info(bandwidth: bool) -> int:
    from . import build_info, read_bandwidth

    info = build_info()
    if bandwidth:
        info["read_bandwidth_GBps"] = {f"{t} thread{'s' if t > 1 else ''}": round(read_bandwidth(1024, t, 3), 1)
                                       for t in sorted({1, info["logical_cpus"]})}
    width = max(len(k) for k in info)
    for k, v in info.items():
        if isinstance(v, list):
            v = " ".join(map(str, v))
        elif isinstance(v, dict):
            v = ", ".join(f"{a}={b:,}" if isinstance(b, (int, float)) else f"{a}={b}" for a, b in v.items())
        print(f"{k:<{width}}  {v}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``python -m onnx_light_kv`` and the ``onnx-light-kv`` script."""
    p = argparse.ArgumentParser(prog="python -m onnx_light_kv", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("info", help="version, Go version, CPU features and active kernel paths")
    i.add_argument("--bandwidth", action="store_true", help="also measure the streaming-read bandwidth (1 GiB)")
    d = sub.add_parser("demo", help="decode loop on synthetic data, with figures")
    from .demo import add_arguments

    add_arguments(d)
    from .generation import cli as generate_cli

    generate_cli.add_arguments(sub.add_parser("generate", help="generate tokens with a decoder .onnx model"))
    args = p.parse_args(argv)
    if args.cmd == "info":
        return _info(args.bandwidth)
    if args.cmd == "generate":
        return generate_cli.run(args)
    from .demo import run

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
