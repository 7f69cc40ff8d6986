"""Build: with GPU_ADMISSION_COMPILE=1 the policy core (webhook/compiled.py) is compiled by mypyc,
and its C modules (``NATIVE``) are built beside it.

The image builds that way (Dockerfile); `make test` runs the whole suite on
both builds. Without it, and for editable installs, the package is plain
Python. Compiling needs mypy and a C compiler in the building environment.
"""

import os
import runpy

from setuptools import Extension, setup


def _ext_modules() -> list:
    if os.environ.get("GPU_ADMISSION_COMPILE", "") not in ("1", "true", "yes"):
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as exc:
        raise SystemExit(f"GPU_ADMISSION_COMPILE is set but mypyc cannot be imported ({exc}): install mypy") from exc
    listed = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "webhook", "compiled.py"))
    native = [Extension(name, [name.replace(".", "/") + ".c"], extra_compile_args=["-O2"]) for name in listed["NATIVE"]]
    return mypycify([name.replace(".", "/") + ".py" for name in listed["MODULES"]], opt_level="3") + native


setup(ext_modules=_ext_modules())
