"""The command line: --version, plain-text help with a default on every
option, and a quiet exit when the reader of its output goes away."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

import pytest

import onnx_light_kv as olkv
from onnx_light_kv.__main__ import build_parser, main

CLI = [sys.executable, "-m", "onnx_light_kv"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)


def test_version() -> None:
    r = _run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"onnx-light-kv {olkv.__version__}"


@pytest.mark.parametrize("args", [["--help"], ["info", "--help"], ["demo", "--help"]])
def test_help_is_plain_text(args: list) -> None:
    r = _run(*args)
    assert r.returncode == 0 and r.stdout.startswith("usage: onnx-light-kv")
    for markup in ("``", ":func:", ":class:", ".. ", "|demo"):
        assert markup not in r.stdout, markup


def _subparsers(p: argparse.ArgumentParser) -> dict:
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    return {}


def test_every_option_has_help_and_shows_its_default() -> None:
    p = build_parser()
    for name, sp in _subparsers(p).items():
        text = sp.format_help()
        for a in sp._actions:
            if isinstance(a, argparse._HelpAction):
                continue
            assert a.help, f"{name} {a.option_strings}: no help text"
            if a.default is not None and a.default is not False:
                assert "(default:" in text, f"{name}: defaults are not shown"
        assert "(default: 256)" in _subparsers(p)["demo"].format_help()


def test_closed_pipe_exits_quietly() -> None:
    # the reading end is closed before the command writes its first line
    rfd, wfd = os.pipe()
    os.close(rfd)
    try:
        r = subprocess.run([*CLI, "info"], stdout=wfd, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(wfd)
    assert "Traceback" not in r.stderr and "BrokenPipeError" not in r.stderr, r.stderr
    assert r.returncode == 141


@pytest.mark.skipif(shutil.which("sh") is None or shutil.which("head") is None, reason="needs sh and head")
def test_info_into_head() -> None:
    cmd = f"'{sys.executable}' -m onnx_light_kv info | head -3"
    r = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 3 and r.stderr == "", r.stderr


def test_main_in_process(capsys: pytest.CaptureFixture) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "version" in out and olkv.__version__ in out and "KiB" in out


@pytest.mark.parametrize("args, message", [
    (["--batch", "0"], "--batch must be >= 1, got 0"),
    (["--q-heads", "30"], "--q-heads (30) must be a multiple of --kv-heads (8)"),
    (["--steps", "-1"], "--steps must be >= 1, got -1"),
    (["--threads", "5000"], "--threads must be in [0, 1024], got 5000"),
    (["--gen-prompt", "0"], "--gen-prompt must be >= 1, got 0"),
    (["--plot", "/nonexistent-folder/x.png"], "--plot '/nonexistent-folder/x.png': no folder '/nonexistent-folder'"),
    (["--plot", "x.txt"], "--plot 'x.txt': format 'txt' is not one matplotlib writes (.png, .pdf, .svg, ...)"),
])
def test_demo_checks_options_before_running(args: list, message: str, capsys: pytest.CaptureFixture) -> None:
    # a bad option of the second part is refused before the first part prints or runs anything
    assert main(["demo", *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == f"onnx-light-kv: error: {message} (ValueError)"


@pytest.mark.parametrize("var, value", [("OLKV_KERNEL", "bogus"), ("OLKV_GEMM", "zzz")])
def test_unknown_kernel_path_in_the_environment_warns(var: str, value: str) -> None:
    """An unknown kernel path in OLKV_KERNEL or OLKV_GEMM is named in a RuntimeWarning at import
    (OLKV_GEMM's was ignored silently) and the package still loads."""
    env = {k: v for k, v in os.environ.items() if k not in ("OLKV_KERNEL", "OLKV_GEMM")}
    env[var] = value
    r = subprocess.run([sys.executable, "-c", "import onnx_light_kv as o; print(o.build_info()['gemm_kernel'])"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"RuntimeWarning: {var}" in r.stderr and value in r.stderr and r.stdout.strip(), r.stderr


def test_closed_stdout_and_missing_extras_are_no_traceback(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture) -> None:
    """Output to a closed stdout (`>&-`) goes nowhere instead of raising; an optional package
    that is missing is one error line and status 2."""
    r = subprocess.run([sys.executable, "-m", "onnx_light_kv", "info"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True, timeout=120, close_fds=True,
                       preexec_fn=lambda: os.close(1))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr

    def missing(*a: object, **k: object) -> None:
        raise ImportError("the HTTP server needs the optional package 'uvicorn': pip install 'onnx-light-kv[serve]'")

    import onnx_light_kv.serve.http as serve_http

    monkeypatch.setattr(serve_http, "run", missing)
    assert main(["serve", "model.onnx", "--tokenizer", "tok.json"]) == 2
    assert "optional package 'uvicorn'" in capsys.readouterr().err
