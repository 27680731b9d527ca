"""The benchmark helpers (benchmarks/_common.py) and smoke runs of bench_tensor_decode.py, bench_decode.py --quant
and bench_memory.py."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import _common  # noqa: E402
import bench_decode  # noqa: E402
import bench_memory  # noqa: E402
import bench_tensor_decode  # noqa: E402


def test_summarize_matches_numpy_percentiles() -> None:
    x = [5.0, 1.0, 3.0, 2.0, 4.0, 10.0, 7.0, 6.0, 9.0, 8.0]
    s = _common.summarize(x)
    assert s["median"] == 5.5 and s["n"] == 10 and s["min"] == 1.0 and s["max"] == 10.0
    assert s["p10"] == pytest.approx(np.percentile(x, 10)) and s["p90"] == pytest.approx(np.percentile(x, 90))
    assert _common.summarize([])["n"] == 0


def test_blocked_refuses_nothing_to_time() -> None:
    with pytest.raises(ValueError, match="nothing to time"):
        _common.blocked({}, repeat=1)


@pytest.mark.parametrize("name, ok", [("run", True), ("tensor-decode.v2", True), ("sub/run", False),
                                      ("../x", False), ("", False), ("..", False)])
def test_name_arg_is_a_plain_file_name(name: str, ok: bool) -> None:
    import argparse

    if ok:
        assert _common.name_arg(name) == name
    else:
        with pytest.raises(argparse.ArgumentTypeError, match="not a plain file name"):
            _common.name_arg(name)


def test_quick_keeps_what_the_user_gave() -> None:
    """--quick's small model fills only the options left at their defaults: the rest are the
    user's, and checked as given (a --q-heads that is no multiple of --kv-heads is refused)."""
    a = bench_tensor_decode.parse_args(["--quick", "--head-dim", "32", "--contexts", "2048"])
    assert (a.head_dim, a.contexts, a.layers, a.q_heads) == (32, [2048], 2, 4)
    with pytest.raises(SystemExit):
        bench_tensor_decode.parse_args(["--quick", "--q-heads", "6", "--kv-heads", "4"])
    with pytest.raises(SystemExit):
        bench_tensor_decode.parse_args(["--quick", "--name", "sub/run"])


def test_interleaved_alternates_and_counts() -> None:
    order: list = []
    out = _common.interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, repeat=3, warmup=1)
    assert order == ["a", "b"] * 4
    assert len(out["a"]) == len(out["b"]) == 3 and all(v >= 0 for v in out["a"])


def test_blocked_settles_pauses_and_counts() -> None:
    order: list = []
    out = _common.blocked({"a": lambda: order.append("a"), "b": lambda: order.append("b")},
                          repeat=5, warmup=1, block=3, pause=0.0)
    # warm-up a b, then blocks of 3 (1 settling + 2 timed) until each side has 5 samples
    assert order == ["a", "b"] + (["a"] * 3 + ["b"] * 3) * 3
    assert len(out["a"]) == len(out["b"]) == 5 and all(v >= 0 for v in out["b"])
    with pytest.raises(ValueError):
        _common.blocked({"a": lambda: None}, repeat=1, block=1)


def test_table_json_and_plot(tmp_path: Any) -> None:
    table = _common.format_table([{"ctx": 128, "ms": 1.23456}, {"ctx": 4096, "ms": 10.0}])
    lines = table.splitlines()
    assert lines[0].split() == ["ctx", "ms"] and lines[2].split() == ["128", "1.235"] and len(lines) == 4
    path = _common.write_json("unit", {"environment": {}, "x": np.float32(1.5), "a": np.arange(3)}, str(tmp_path))
    assert os.path.basename(path).startswith("unit-") and path.endswith(".json")
    assert json.load(open(path)) == {"environment": {}, "x": 1.5, "a": [0, 1, 2]}
    png = _common.plot_series(str(tmp_path / "p.png"), {"s": {"x": [1, 2], "median": [1.0, 2.0], "p10": [0.5, 1.5], "p90": [1.5, 2.5]}},
                              "x", "y", ratio={"r": ([1, 2], [1.0, 0.9])})
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_environment_records_versions_without_paths() -> None:
    env = _common.environment(threads=2)
    for key in ("cpu_model", "cpu_flags", "logical_cpus", "versions", "git", "python", "threads"):
        assert key in env
    assert env["versions"]["numpy"] == np.__version__
    assert env["threads"] == 2
    text = json.dumps({k: v for k, v in env.items() if k != "onnx_light_kv_build"})
    assert os.path.expanduser("~") not in text and os.getcwd() not in text


def test_bench_tensor_decode_smoke(tmp_path: Any, capsys: Any) -> None:
    """A tiny onnxruntime-only run writes JSON with raw samples and a PNG."""
    rc = bench_tensor_decode.main(["--quick", "--runtimes", "ort", "--contexts", "16", "32", "--threads", "1",
                                   "--samples", "3", "--warmup", "1", "--results-dir", str(tmp_path)])
    assert rc == 0
    files = sorted(os.listdir(tmp_path))
    assert any(f.endswith(".json") for f in files) and any(f.endswith(".png") for f in files)
    data = json.load(open(tmp_path / next(f for f in files if f.endswith(".json"))))
    assert [r["context"] for r in data["rows"]] == [16, 32]
    assert all(len(r["samples_ms"]) == 3 for r in data["raw"])
    assert "ort_median_ms" in capsys.readouterr().out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_bench_memory_smoke(tmp_path: Any) -> None:
    """A tiny run measures both runtimes on every model kind (the int4 conversion loads in
    onnxruntime too) and writes the figures."""
    rc = bench_memory.main(["--layers", "1", "--hidden", "64", "--vocab", "256", "--past", "4",
                            "--results-dir", str(tmp_path)])
    assert rc == 0
    data = json.load(open(tmp_path / os.listdir(tmp_path)[0]))
    assert [r["model"].split()[-1] for r in data["rows"]] == ["float32", "float16", "int4"]
    for row in data["rows"]:
        for rt in ("ours", "ort"):
            assert row[f"{rt}_peak_mb"] >= row[f"{rt}_session_mb"] - 1, row


def test_int4_model_quantizes_every_weight_matmul() -> None:
    """bench_memory.int4_model turns each constant-weight MatMul into a 4-bit MatMulNBits whose
    dequantized weight is within half a quantization step of the original (the MLP's down
    projection has K = 176: its last group is padded)."""
    from onnx import numpy_helper
    from onnx_light_kv import models

    m = models.build("llama", models.DecoderConfig(layers=1, hidden=64, vocab=256))
    weights = {n.input[1]: numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == n.input[1]))
               for n in m.graph.node if n.op_type == "MatMul" and any(t.name == n.input[1] for t in m.graph.initializer)}
    q = bench_memory.int4_model(m)
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    nodes = [n for n in q.graph.node if n.op_type == "MatMulNBits"]
    assert weights and len(nodes) == len(weights)
    assert not any(n.op_type == "MatMul" and n.input[1] in weights for n in q.graph.node)
    for n in nodes:
        w = weights[n.input[1][:-len("_q4")]]
        packed, scales = inits[n.input[1]], inits[n.input[2]].reshape(w.shape[1], -1, 1)
        vals = np.stack([packed & 15, packed >> 4], axis=-1).reshape(w.shape[1], -1, 32).astype(np.float32)
        deq = ((vals - 8) * scales).reshape(w.shape[1], -1)[:, :w.shape[0]].T
        assert np.all(np.abs(deq - w) <= scales.max() / 2 + 1e-6)


def test_kernel_paths_and_runs(capsys: Any) -> None:
    """``--kernel`` names resolve to the paths the CPU has ("auto": the best), once each;
    unavailable ones are reported and left out; the environment records the paths."""
    paths = _common.kernel_paths()
    avail = paths["available"]
    assert avail[0] == "go" and paths["active"] in avail
    want = [("auto", avail[-1])] + ([("go", "go")] if len(avail) > 1 else [])
    assert _common.kernel_runs(["auto", "go", avail[-1]]) == want
    missing = [k for k in ("avx2", "avx512") if k not in avail]
    if missing:
        assert _common.kernel_runs(missing) == []
        assert "not available" in capsys.readouterr().out
    assert _common.environment()["kernel_paths"] == paths
    assert "kernel paths: " + ", ".join(avail) in _common.isa_line()
    runtimes, kernel_of = bench_tensor_decode.expand_runtimes(["ours", "ort"], ["go", "auto"])
    assert runtimes == list(dict.fromkeys(["ours-go", f"ours-{avail[-1]}"])) + ["ort"]
    assert kernel_of["ours-go"] == "go"
    assert bench_tensor_decode.expand_runtimes(["ours", "ort"], ["auto"]) == (["ours", "ort"], {})


def test_bench_decode_quant_smoke(tmp_path: Any) -> None:
    """``bench_decode.py --quant`` on a tiny geometry: a row per cache with its bytes read (from the
    cache counters) and speed-up over fp16, onnxruntime's int8/int4 GroupQueryAttention timed beside
    them, JSON with raw samples. Our quantized caches' part skips while KVCache has no ``quant``."""
    rc = bench_decode.main(["--quant", "--quick", "--threads", "1", "--contexts", "256", "--heads", "4/2",
                            "--head-dims", "64", "--repeat", "3", "--warmup", "1", "--no-plot",
                            "--llc-mib", "0.125", "--results-dir", str(tmp_path)])
    assert rc == 0
    files = [f for f in os.listdir(tmp_path) if f.startswith("decode-quant-") and f.endswith(".json")]
    data = json.load(open(tmp_path / files[0]))
    rows = {r["cache"]: r for r in data["rows"]}
    # --llc-mib replaces the OS's L3 figure: 257 tokens of fp32 K+V (263 KB) are beyond 128 KiB
    assert data["llc_bytes"] == 128 << 10 and all(r["beyond_llc"] for r in rows.values())
    assert list(rows) == ["fp32", "fp16", "bf16", "int8 r0", "int8 r128", "int4 r0", "int4 r128"]
    assert all(r["context"] == 257 for r in rows.values())
    assert rows["fp16"]["vs_fp16"] == 1.0 and rows["fp32"]["kv_read_MB"] == 2 * rows["fp16"]["kv_read_MB"]
    assert rows["fp32"]["kv_read_MB"] * 1e6 == 2 * 257 * 2 * 64 * 4
    for name in ("int8 r0", "int4 r0"):
        assert rows[name]["ort_ms"] > 0 and rows[name]["ort_max_abs_diff_vs_fp32"] < 0.5
        assert len(data["results"][0]["samples"][f"ort {name.split()[0]}"]) == 3
    unavailable = [r["note"] for r in rows.values() if "unavailable" in r.get("note", "")]
    if unavailable:
        pytest.skip(f"our quantized caches are not available: {unavailable[0]}")
    # Bytes read per KV head with residual 0 (quantization group 32, d 64, 256 sealed rows = 8
    # chunks, one fp16 row after them): int8 rows + a float32 scale per K channel per chunk + one
    # per V group of each row; int4 half the rows + a scale and a zero for each.
    sealed, chunks, groups = 256, 8, 2
    native = 2 * 64 * 2
    int8 = 2 * sealed * 64 + chunks * 64 * 4 + sealed * groups * 4 + native
    int4 = 2 * sealed * 32 + chunks * 64 * 8 + sealed * groups * 8 + native
    assert rows["int8 r0"]["kv_read_MB"] * 1e6 == 2 * int8 and rows["int4 r0"]["kv_read_MB"] * 1e6 == 2 * int4
    assert rows["int8 r128"]["kv_read_MB"] > rows["int8 r0"]["kv_read_MB"]
    for name in ("int8 r0", "int8 r128", "int4 r0", "int4 r128"):
        assert rows[name]["speedup"] > 0 and rows[name]["max_abs_diff_vs_fp32"] < 0.5


def test_bench_decode_rejects_a_bad_llc_size() -> None:
    """``--llc-mib`` must be a positive size: argparse's usage error (exit status 2)."""
    for bad in ("0", "-4", "nan"):
        with pytest.raises(SystemExit) as e:
            bench_decode.main(["--llc-mib", bad])
        assert e.value.code == 2


def test_write_json_leaves_out_the_results_dir(tmp_path) -> None:
    """The JSON records what was measured, not where this machine keeps the files."""
    payload = {"environment": {}, "args": {"quick": True, "results_dir": str(tmp_path)}, "rows": [1, 2]}
    path = _common.write_json("unit", payload, str(tmp_path))
    with open(path, encoding="utf-8") as f:
        got = json.load(f)
    assert got == {"environment": {}, "args": {"quick": True}, "rows": [1, 2]}
    assert payload["args"]["results_dir"] == str(tmp_path)  # the caller's dict is untouched


def test_bench_decode_quant_groups() -> None:
    """``--quant-group 32 64``: a row set per group (group 64 labelled ``... g64``), the target
    check kept apart per group."""
    names = [v.name for v in bench_decode.quant_variants([32, 64], "channel", "float16")]
    assert names == ["fp32", "fp16", "bf16", "int8 r0", "int8 r128", "int4 r0", "int4 r128",
                     "int8 r0 g64", "int8 r128 g64", "int4 r0 g64", "int4 r128 g64"]
    rows = [{"cache": c, "kernel": "avx512", "context": 32769, "ours_ms": 1.0, "beyond_llc": True, "vs_fp16": x}
            for c, x in (("int8 r128", 1.2), ("int8 r128 g64", 1.8), ("int4 r128", 1.1), ("int4 r128 g64", 2.9))]
    lines = bench_decode.quant_target_lines(rows)
    assert [ln.split(":")[0] for ln in lines] == ["avx512 int8", "avx512 int4", "avx512 int8 g64", "avx512 int4 g64"]
    assert lines[0].endswith("NOT met") and lines[2].endswith("-> met") and lines[3].endswith("-> met")


# ---------------------------------------------------------------- argument checks, strict JSON

import argparse  # noqa: E402
import math  # noqa: E402
import subprocess  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("fn, good, bad", [
    (_common.positive_int, {"1": 1, "7": 7, " 12 ": 12, "100000": 100000}, ["0", "-1", "abc", "1.5", "", "nan"]),
    (_common.nonneg_int, {"0": 0, "1": 1, "42": 42}, ["-1", "-100", "x", "2.0"]),
    (_common.threads_arg, {"1": 1, "2": 2, "1024": 1024}, ["0", "-1", "1025", "two"]),
    (_common.int_range(2), {"2": 2, "9": 9}, ["1", "0", "-3", "b"]),
    (_common.int_range(0, 3), {"0": 0, "3": 3}, ["-1", "4"]),
])
def test_int_argument_types(fn: Any, good: dict, bad: list) -> None:
    """Integer ``type=`` helpers: values in range (boundaries included) come back as ints; values
    out of range or not integers raise ArgumentTypeError naming the bound."""
    for text, want in good.items():
        assert fn(text) == want and type(fn(text)) is int
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError):
            fn(text)
    with pytest.raises(argparse.ArgumentTypeError, match=">= 1"):
        _common.positive_int("0")
    with pytest.raises(argparse.ArgumentTypeError, match="1..1024"):
        _common.threads_arg("-1")


def test_float_heads_and_regex_argument_types() -> None:
    assert _common.positive_float("8") == 8.0 and _common.positive_float("0.125") == 0.125
    assert _common.positive_float("1e-9") == 1e-9
    for bad in ("0", "-1", "-0.5", "nan", "inf", "-inf", "abc", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            _common.positive_float(bad)
    assert _common.heads("32/8") == (32, 8) and _common.heads("8/8") == (8, 8) and _common.heads("1/1") == (1, 1)
    assert _common.heads("32/1") == (32, 1)
    for bad in ("32/7", "3/2", "abc", "32", "8/0", "0/8", "-8/-4", "a/b", "32/8/2", "/8"):
        with pytest.raises(argparse.ArgumentTypeError):
            _common.heads(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="multiple"):
        _common.heads("32/7")
    assert _common.regex("llama.*dynamo") == "llama.*dynamo"
    for bad in ("(", "[a-", "*x"):
        with pytest.raises(argparse.ArgumentTypeError, match="regular expression"):
            _common.regex(bad)


def test_argument_types_give_argparse_errors(capsys: Any) -> None:
    """Through argparse: a bad value is the usage line plus 'error: argument --x: ...', exit 2."""
    p = argparse.ArgumentParser(prog="bench")
    p.add_argument("--threads", type=_common.threads_arg, nargs="+", default=[1])
    p.add_argument("--heads", type=_common.heads, nargs="+")
    assert p.parse_args(["--threads", "1", "2", "--heads", "32/8"]).heads == [(32, 8)]
    for argv in (["--threads", "-1"], ["--heads", "32/7"]):
        with pytest.raises(SystemExit) as e:
            p.parse_args(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("usage: bench") and f"error: argument {argv[0]}: " in err


def test_write_json_needs_the_environment(tmp_path: Any) -> None:
    """A result without the environment it was measured in is refused, and nothing is written."""
    with pytest.raises(ValueError, match="'unit' has no 'environment'"):
        _common.write_json("unit", {"env": {}, "rows": []}, str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_write_json_is_strict_json(tmp_path: Any) -> None:
    """NaN and infinities (Python or numpy, at any depth) are written as null: strict JSON."""
    nan, inf = float("nan"), float("inf")
    payload = {"a": nan, "b": [1.0, inf, -inf, {"c": np.float32("nan")}], "d": (np.float64(inf), 2),
               "e": np.array([1.0, np.nan]), "f": np.int64(3), "g": 0.5, "h": "nan", "i": None, "j": True, "environment": {}}
    path = _common.write_json("strict", payload, str(tmp_path))
    text = open(path, encoding="utf-8").read()

    def reject(name: str) -> Any:
        raise ValueError(f"non-standard JSON constant {name}")

    got = json.loads(text, parse_constant=reject)
    assert got == {"a": None, "b": [1.0, None, None, {"c": None}], "d": [None, 2], "e": [1.0, None], "f": 3,
                   "g": 0.5, "h": "nan", "i": None, "j": True, "environment": {}}
    assert payload["a"] != payload["a"] and isinstance(payload["d"], tuple)  # the caller's payload is untouched
    assert _common.json_safe({"x": [math.nan]}) == {"x": [None]}


def test_format_table_na_labels_and_width() -> None:
    """A NaN cell (a figure not measured) shows as n/a; labels change headings only; min_width
    pads every column."""
    lines = _common.format_table([{"side": "genai", "tok/s": float("nan")}, {"side": "ours", "tok/s": 2.0}],
                                 labels={"tok/s": "tok/s ms"}).splitlines()
    assert lines[0].split() == ["side", "tok/s", "ms"] and lines[2].split() == ["genai", "n/a"]
    assert "nan" not in "\n".join(lines)
    assert all(len(c) >= 9 for c in _common.format_table([{"a": 1}], min_width=9).splitlines())


def test_kernel_runs_required_exits_2(capsys: Any) -> None:
    avail = _common.kernel_paths().get("available", [])
    assert _common.kernel_runs(["auto"], required=True) == [("auto", avail[-1])]
    missing = [k for k in ("avx2", "avx512") if k not in avail]
    if not missing:
        pytest.skip("every kernel path is available on this CPU")
    with pytest.raises(SystemExit) as e:
        _common.kernel_runs(missing, required=True)
    assert e.value.code == 2 and "none of the requested kernel paths" in capsys.readouterr().err


def test_tensor_decode_runtimes_are_choices() -> None:
    assert bench_tensor_decode.parse_args(["--runtimes", "ort", "ours", "ort"]).runtimes == ["ort", "ours"]
    assert bench_tensor_decode.parse_args([]).runtimes == ["ours", "ort"]
    with pytest.raises(SystemExit) as e:
        bench_tensor_decode.parse_args(["--runtimes", "foo"])
    assert e.value.code == 2


@pytest.mark.parametrize("script, args", [
    ("bench_decode", ["--heads", "32/7"]),
    ("bench_decode", ["--repeat", "0"]),
    ("bench_decode", ["--contexts", "-5"]),
    ("bench_decode", ["--block-size", "24"]),
    ("bench_cache_path", ["--block", "1"]),
    ("bench_cache_path", ["--max-gib", "-1"]),
    ("bench_tensor_decode", ["--runtimes", "foo"]),
    ("bench_tensor_decode", ["--q-heads", "3", "--kv-heads", "2"]),
    ("bench_generate", ["--beam-prompts", "-3"]),
    ("bench_gqa_op", ["--repeat", "0"]),
    ("bench_matmul", ["--threads", "-1"]),
    ("bench_matmul", ["--weights", "int4", "--block-size", "24"]),
    ("bench_models", ["--models", "("]),
    ("bench_models", ["--models", "nosuchmodel"]),
    ("bench_overhead", ["--contexts", "0"]),
    ("bench_quant_quality", ["--models", "builtin-foo"]),
    ("bench_quant_quality", ["--prompts", "-1"]),
    ("bench_paged", ["--block-size", "7"]),
    ("bench_paged", ["--repeat", "0"]),
    ("bench_serve", ["--concurrency", "0"]),
    ("bench_serve", ["--prompt-min", "50", "--prompt-max", "10"]),
])
def test_bad_arguments_exit_2_without_traceback(script: str, args: list) -> None:
    """Each benchmark rejects a bad value at argument parsing: argparse's usage error, exit status
    2, no traceback (nothing is measured, so these are fast)."""
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", f"{script}.py"), *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert "error:" in proc.stderr and "usage:" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_run_main_turns_refused_sizes_into_one_error_line(capsys: Any) -> None:
    """A size numpy or the library refuses ends a benchmark with one ``error:`` line and status
    2 (it was a traceback), Ctrl-C with 130; a bug keeps its traceback."""
    def refuse(exc: BaseException) -> Any:
        def main() -> None:
            raise exc
        return main

    for exc in (MemoryError("Unable to allocate 7.28 TiB"), ValueError("Maximum allowed size exceeded"),
                OverflowError("int too large")):
        assert _common.run_main(refuse(exc)) == 2
        err = capsys.readouterr().err.strip()
        assert err.endswith(f"error: {exc} ({type(exc).__name__})") and "\n" not in err
    assert _common.run_main(refuse(KeyboardInterrupt())) == 130
    assert _common.run_main(lambda: None) == 0 and _common.run_main(lambda: 3) == 3
    with pytest.raises(KeyError):
        _common.run_main(refuse(KeyError("a bug")))


def test_results_dir_is_checked_before_the_run(tmp_path: Any) -> None:
    """--results-dir that cannot hold results is an argparse error before anything runs."""
    import argparse

    p = argparse.ArgumentParser()
    _common.add_results_dir(p)
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(SystemExit):
        p.parse_args(["--results-dir", str(tmp_path / "a_file")])
    assert p.parse_args(["--results-dir", str(tmp_path / "new")]).results_dir == str(tmp_path / "new")
    assert (tmp_path / "new").is_dir()


@pytest.mark.parametrize("argv, message", [(["--quick", "--target"], "give one"),
                                           (["--variants", "fp32"], "--variants only takes effect with --quant"),
                                           (["--k-axis", "token"], "--k-axis only takes effect with --quant")])
def test_bench_decode_refuses_options_without_effect(argv: list, message: str, capsys: Any) -> None:
    with pytest.raises(SystemExit):
        bench_decode.main(argv)
    assert message in capsys.readouterr().err
