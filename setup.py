"""Build: with GPU_ADMISSION_COMPILE=1 the policy core (webhook/compiled.py) is compiled by mypyc.

The image builds that way (Dockerfile); `make test` runs the whole suite on
both builds. Without it, and for editable installs, the package is plain
Python. Compiling needs mypy and a C compiler in the building environment.
"""

import os
import runpy

from setuptools import setup


def _ext_modules() -> list:
    if os.environ.get("GPU_ADMISSION_COMPILE", "") not in ("1", "true", "yes"):
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as exc:
        raise SystemExit(f"GPU_ADMISSION_COMPILE is set but mypyc cannot be imported ({exc}): install mypy") from exc
    modules = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "webhook", "compiled.py"))["MODULES"]
    return mypycify([name.replace(".", "/") + ".py" for name in modules], opt_level="3")


setup(ext_modules=_ext_modules())
