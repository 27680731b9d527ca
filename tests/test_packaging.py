"""The distributions: the sdist builds a wheel, and that wheel, installed
into a fresh virtual environment, works from another folder.

``scripts/build_wheel.sh`` builds sdist -> wheel -> manylinux wheel once for
the module (about 30 seconds with a warm Go build cache, a few minutes cold);
the install test adds a fresh venv and the download of numpy, ml_dtypes and
onnx from the package index. Marked ``slow``; ``OLKV_SKIP_SLOW=1`` skips them.
Needs Go, gcc and access to the package index.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from typing import Dict

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("OLKV_SKIP_SLOW", "") not in ("", "0"), reason="OLKV_SKIP_SLOW is set"),
    pytest.mark.skipif(shutil.which("go") is None or shutil.which("gcc") is None, reason="needs Go and gcc"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="manylinux wheels are Linux-only"),
]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, str]:
    out = tmp_path_factory.mktemp("dist")
    env = dict(os.environ, PYTHON=sys.executable, OLKV_DIST=str(out))
    r = subprocess.run(["bash", "scripts/build_wheel.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=1200)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    files = os.listdir(out)
    sdists = [f for f in files if f.endswith(".tar.gz")]
    wheels = [f for f in files if f.endswith(".whl")]
    assert len(sdists) == 1 and len(wheels) == 1, files
    return {"sdist": str(out / sdists[0]), "wheel": str(out / wheels[0])}


def test_sdist_has_the_sources_and_no_build_outputs(dist: Dict[str, str]) -> None:
    with tarfile.open(dist["sdist"]) as tf:
        names = [n.split("/", 1)[1] for n in tf.getnames() if "/" in n]
    for need in ("go.mod", "go.sum", "LICENSE", "setup.py", "pyproject.toml", "scripts/build_native.py",
                 "golib/kvgo/VERSION", "golib/kvgo/session_bind.go", "golib/cpu/kern_avx512_amd64.s",
                 "python/onnx_light_kv/py.typed", "python/onnx_light_kv/__init__.py",
                 "benchmarks/_common.py", "benchmarks/bench_decode.py"):  # (tests import them)
        assert need in names, need
    assert sum(n.endswith(".go") for n in names) > 100
    for bad in names:
        assert not bad.endswith((".so", ".pyc", ".test")) and "/_native/" not in bad and "_build/" not in bad, bad
        assert not bad.startswith("benchmarks/results/"), bad


def _elf_sections(path: str) -> set:
    from elftools.elf.elffile import ELFFile  # pyelftools: a dependency of auditwheel

    with open(path, "rb") as fh:
        return {s.name for s in ELFFile(fh).iter_sections()}


def test_wheel_from_sdist_is_manylinux_and_stripped(dist: Dict[str, str], tmp_path) -> None:
    name = os.path.basename(dist["wheel"])
    assert "manylinux" in name and name.endswith("_x86_64.whl"), name
    with zipfile.ZipFile(dist["wheel"]) as zf:
        names = zf.namelist()
        so = [n for n in names if n.endswith(".so")]
        assert len(so) == 1 and "onnx_light_kv/py.typed" in names
        assert any(n.endswith("licenses/LICENSE") for n in names)
        zf.extract(so[0], tmp_path)
    size = os.path.getsize(tmp_path / so[0])
    assert size < 8 << 20, f"extension is {size} bytes"
    sections = _elf_sections(str(tmp_path / so[0]))
    assert ".debug_info" not in sections and ".symtab" not in sections, sorted(sections)


SMOKE = textwrap.dedent("""
    import numpy as np, onnx_light_kv as olkv
    from onnx_light_kv import models
    assert "site-packages" in olkv.__file__, olkv.__file__
    rng = np.random.default_rng(0)
    c = olkv.KVCache(1, 2, 16, capacity=32)
    k, v = rng.standard_normal((2, 1, 2, 8, 16), dtype=np.float32)
    c.append(k, v)
    q = rng.standard_normal((1, 4, 1, 16), dtype=np.float32)
    out = olkv.attention(q, c)
    s = np.einsum("bhqd,bhkd->bhqk", q, np.repeat(k, 2, axis=1)) / 4.0
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(out, np.einsum("bhqk,bhkd->bhqd", p, np.repeat(v, 2, axis=1)), atol=1e-5)
    m = models.build("llama", models.DecoderConfig(layers=1, hidden=64, q_heads=4, kv_heads=2, head_dim=16,
                                                   vocab=50, max_positions=32))
    sess = olkv.InferenceSession(models.model_bytes(m), threads=1)
    r = models.greedy_generate(sess, m, prompt_ids=np.arange(5), steps=3)
    assert r.tokens.shape == (1, 4)
    out = olkv.generate(sess, np.arange(1, 6)[None], max_new_tokens=3)
    assert out.new_tokens.shape == (1, 3) and len(repr(out)) < 400
    print("ok", olkv.__version__)
""")


def test_wheel_installs_into_a_fresh_venv_and_runs_elsewhere(dist: Dict[str, str], tmp_path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = str(venv / "bin" / "python")
    r = subprocess.run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", dist["wheel"]],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OLKV_KERNEL")}
    r = subprocess.run([py, "-c", SMOKE], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stdout + r.stderr[-3000:]
    r = subprocess.run([str(venv / "bin" / "onnx-light-kv"), "--version"], cwd=elsewhere, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("onnx-light-kv "), r.stderr
    # the demo runs with the declared dependencies only (no onnxruntime: no comparison, and it says so)
    r = subprocess.run([str(venv / "bin" / "onnx-light-kv"), "demo", "--steps", "8", "--prompt", "16",
                        "--gen-steps", "2", "--gen-prompt", "4", "--threads", "1"], cwd=elsewhere, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "onnx-light-kv[ort]" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    # the documented optional features name their extra when missing
    r = subprocess.run([py, "-c", "from onnx_light_kv._optional import require; require('onnxruntime')"],
                       cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    assert "onnx-light-kv[ort]" in r.stderr
