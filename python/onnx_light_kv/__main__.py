"""Command line of onnx-light-kv.

  python -m onnx_light_kv info [--bandwidth]   build, CPU and kernel paths
  python -m onnx_light_kv demo [options]       generation and KV-cache demo
  python -m onnx_light_kv generate MODEL ...   generate tokens with a decoder .onnx model
  python -m onnx_light_kv serve MODEL ...      OpenAI-compatible HTTP server (extra 'serve')
  python -m onnx_light_kv --version

Also installed as the ``onnx-light-kv`` command.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

_DESCRIPTION = "CPU KV-cache runtime for autoregressive attention: build info, a demo, generation and an OpenAI-compatible server."


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Plain-text help that shows every option's default (once: a help text that already says
    its default in words keeps only those)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        return text if "(default:" in text else super()._get_help_string(action)


def _info(bandwidth: bool) -> int:
    from . import build_info, read_bandwidth
    from ._format import human_bytes

    info = build_info()
    if bandwidth:
        info["read_bandwidth_GBps"] = {f"{t} thread{'s' if t > 1 else ''}": round(read_bandwidth(1024, t, 3), 1)
                                       for t in sorted({1, info["logical_cpus"]})}
    width = max(len(k) for k in info)
    for k, v in info.items():
        if isinstance(v, list):
            v = " ".join(map(str, v))
        elif isinstance(v, dict) and k == "cache_bytes":
            v = ", ".join(f"{a}={human_bytes(b)}" for a, b in v.items())
        elif isinstance(v, dict):
            v = ", ".join(f"{a}={b:,}" if isinstance(b, (int, float)) else f"{a}={b}" for a, b in v.items())
        print(f"{k:<{width}}  {v}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the command line (subcommands ``info``, ``demo``, ``generate`` and ``serve``)."""
    from . import __version__

    p = argparse.ArgumentParser(prog="onnx-light-kv", description=_DESCRIPTION, formatter_class=HelpFormatter,
                                epilog="Run 'onnx-light-kv COMMAND --help' for a command's options.")
    p.add_argument("--version", action="version", version=f"onnx-light-kv {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    i = sub.add_parser("info", help="version, Go version, CPU features and active kernel paths",
                       description="Print the version, Go version, CPU features and the active kernel paths.",
                       formatter_class=HelpFormatter)
    i.add_argument("--bandwidth", action="store_true",
                   help="also measure the streaming-read bandwidth (1 GiB buffer, a few seconds)")
    d = sub.add_parser("demo", help="greedy generation and a KV-cache decode loop, with figures",
                       description="Greedy generation with a built-in decoder (compared with onnxruntime when "
                                   "installed), then a KV-cache decode loop checked against numpy.",
                       formatter_class=HelpFormatter)
    from .demo import add_arguments

    add_arguments(d)
    from .generation import cli as generate_cli

    generate_cli.add_arguments(sub.add_parser("generate", help="generate tokens with a decoder .onnx model",
                                              formatter_class=HelpFormatter))
    from .serve import http as serve_http

    serve_http.add_arguments(sub.add_parser("serve", help="OpenAI-compatible HTTP server with continuous batching",
                                            description="Serve a decoder .onnx model over an OpenAI-compatible "
                                                        "HTTP API (/v1/completions, /v1/chat/completions, "
                                                        "/v1/models, /health, /metrics).",
                                            formatter_class=HelpFormatter))
    return p


def _main(argv: Optional[Sequence[str]]) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd == "info":
        return _info(args.bandwidth)
    if args.cmd == "generate":
        from .generation import cli as generate_cli

        return generate_cli.run(args)
    if args.cmd == "serve":
        from .serve import http as serve_http

        return serve_http.run(args)
    from .demo import run

    return run(args)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``python -m onnx_light_kv`` and the ``onnx-light-kv`` command."""
    for name in ("stdout", "stderr"):  # a closed stream (`>&-`): the output goes nowhere, not to a traceback
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w"))
    try:
        code = _main(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # the reader went away (`onnx-light-kv info | head -3`): stop quietly;
        # point stdout at /dev/null so the interpreter's final flush cannot fail
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports it
    except KeyboardInterrupt:
        return 130
    except (ValueError, TypeError, OSError, NotImplementedError, MemoryError, ImportError) as e:
        # A user mistake (a bad argument, a missing or malformed file, a model or a size the
        # runtime refuses, an optional package not installed): one line and exit status 2, as
        # argparse reports its own errors.
        # OLKV_TRACEBACK=1 shows the traceback instead.
        if os.environ.get("OLKV_TRACEBACK", "") not in ("", "0"):
            raise
        name = type(e).__name__
        print(f"onnx-light-kv: error: {e} ({name})" if str(e) else f"onnx-light-kv: error: {name}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
