"""Build glue: `pip install .` / `pip install -e .` compile the Go extension
with gopy (see scripts/build_native.py) and ship it inside the package."""

from __future__ import annotations

import fcntl
import glob
import os
import sys
import sysconfig

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(ROOT, "scripts"))


class BuildPyWithGo(build_py):
    """build_py that first builds the gopy extension into the source package."""

    def run(self) -> None:
        import build_native

        os.makedirs(os.path.join(ROOT, "build"), exist_ok=True)
        with open(os.path.join(ROOT, "build", ".native.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            build_native.build(sys.executable)
        super().run()
        # the source tree may hold other interpreters' extensions (their editable installs):
        # this build ships its own ABI's only
        own = sysconfig.get_config_var("EXT_SUFFIX")
        for f in glob.glob(os.path.join(self.build_lib, "onnx_light_kv", "_native", "_kvgo*.so")):
            if not f.endswith(own):
                os.remove(f)


class BinaryDistribution(Distribution):
    """The wheel holds a compiled extension: tag it for the platform."""

    def has_ext_modules(self) -> bool:
        return True


setup(cmdclass={"build_py": BuildPyWithGo}, distclass=BinaryDistribution)
