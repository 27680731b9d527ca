"""Every code block of the README runs as written.

``python`` blocks are executed, each in a fresh interpreter started in an
empty folder (so they cannot lean on the source tree or on each other).
``bash`` blocks: every line must be a ``bash scripts/run.sh COMMAND`` the
script knows; the demo line is run (with this interpreter passed as
``PYTHON``, 5-20 seconds); the test line is what runs this test, so it is
only checked to be a known command.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import List, Tuple

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")


def blocks() -> List[Tuple[str, int, str]]:
    """(language, first line number, code) of every fenced block."""
    out = []
    lang, start, body = None, 0, []
    with open(README, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            m = re.match(r"^```(\w*)\s*$", line)
            if m and lang is None:
                lang, start, body = m.group(1), n + 1, []
            elif m and lang is not None:
                out.append((lang, start, "".join(body)))
                lang = None
            elif lang is not None:
                body.append(line)
    assert lang is None, "unterminated code block in README.md"
    return out


def test_readme_has_the_blocks_this_test_expects() -> None:
    langs = [b[0] for b in blocks()]
    assert langs.count("python") >= 2 and langs.count("bash") >= 1
    assert set(langs) <= {"python", "bash", ""}, f"a block of a language this test does not run: {langs}"


@pytest.mark.parametrize("line,code", [(b[1], b[2]) for b in blocks() if b[0] == "python"],
                         ids=lambda v: f"line{v}" if isinstance(v, int) else "")
def test_python_block_runs(line: int, code: str, tmp_path) -> None:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, f"README.md block at line {line} failed:\n{r.stderr[-3000:]}"


def _run_sh_commands() -> List[Tuple[int, str]]:
    cmds = []
    for lang, start, code in blocks():
        if lang != "bash":
            continue
        for i, raw in enumerate(code.splitlines()):
            line = raw.split("#", 1)[0].strip()
            if line:
                cmds.append((start + i, line))
    return cmds


def test_bash_blocks_are_known_commands() -> None:
    with open(os.path.join(ROOT, "scripts", "run.sh"), encoding="utf-8") as fh:
        script = fh.read()
    known = set(re.findall(r"^\s+(\w+)\)", script, flags=re.M))
    for n, line in _run_sh_commands():
        words = line.split()
        assert words[:2] == ["bash", "scripts/run.sh"], f"README.md line {n}: {line!r} is not a run.sh command"
        assert len(words) >= 3 and words[2] in known, f"README.md line {n}: unknown run.sh command {words[2:]}"


def test_bash_demo_command_runs() -> None:
    demo = [line for _, line in _run_sh_commands() if line.split()[2:3] == ["demo"]]
    assert demo, "the README names no demo command"
    env = dict(os.environ, PYTHON=sys.executable)
    r = subprocess.run(demo[0].split(), cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "check vs numpy reference" in r.stdout and "FAILED" not in r.stdout
