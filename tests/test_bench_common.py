"""The benchmark helpers (benchmarks/_common.py) and smoke runs of bench_tensor_decode.py and bench_decode.py --quant."""

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
import bench_tensor_decode  # noqa: E402


def test_summarize_matches_numpy_percentiles() -> None:
    x = [5.0, 1.0, 3.0, 2.0, 4.0, 10.0, 7.0, 6.0, 9.0, 8.0]
    s = _common.summarize(x)
    assert s["median"] == 5.5 and s["n"] == 10 and s["min"] == 1.0 and s["max"] == 10.0
    assert s["p10"] == pytest.approx(np.percentile(x, 10)) and s["p90"] == pytest.approx(np.percentile(x, 90))
    assert _common.summarize([])["n"] == 0


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
    path = _common.write_json("unit", {"x": np.float32(1.5), "a": np.arange(3)}, str(tmp_path))
    assert os.path.basename(path).startswith("unit-") and path.endswith(".json")
    assert json.load(open(path)) == {"x": 1.5, "a": [0, 1, 2]}
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
    payload = {"args": {"quick": True, "results_dir": str(tmp_path)}, "rows": [1, 2]}
    path = _common.write_json("unit", payload, str(tmp_path))
    with open(path, encoding="utf-8") as f:
        got = json.load(f)
    assert got == {"args": {"quick": True}, "rows": [1, 2]}
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
