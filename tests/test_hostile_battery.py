"""The hostile battery (scripts/hostile_battery.py) as a test: over a thousand hostile calls on
every public entry point, in child interpreters with a per-call timeout and a memory watchdog;
every call must return, or raise a documented exception class without changing the cache it
was called on, and attention must equal the reference on every kernel path."""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_hostile_battery() -> None:
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "hostile_battery.py"), "--timeout", "60"],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    first = p.stdout.splitlines()[0]
    assert int(first.split()[0]) > 1000, first

