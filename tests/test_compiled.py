"""The policy core runs compiled where the build compiled it, and the list of compiled modules stays whole."""

from __future__ import annotations

import os
import pkgutil

import pytest

import webhook.policy.rules
from webhook import compiled


def test_every_rule_module_is_listed_for_compiling() -> None:
    # a rule added without its line in MODULES would run interpreted in the image, unnoticed
    rules = {f"webhook.policy.rules.{m.name}" for m in pkgutil.iter_modules(webhook.policy.rules.__path__)}
    assert rules <= set(compiled.MODULES)


@pytest.mark.skipif(os.environ.get("GPU_ADMISSION_POLICY_CORE") != "compiled",
                    reason="interpreted run: `make test-compiled` runs the suite on the compiled core")
def test_the_compiled_run_runs_the_compiled_core() -> None:
    # `make test-compiled` sets GPU_ADMISSION_POLICY_CORE=compiled: the suite it runs must not fall back
    # to the interpreted modules (a stale or missing build, a source tree earlier on the path)
    assert compiled.policy_core() == "compiled", compiled.compiled_modules()


def test_an_interpreted_run_runs_no_compiled_module() -> None:
    # the source tree holds no compiled module to shadow an edit (the compiled build lives in a copy)
    if os.environ.get("GPU_ADMISSION_POLICY_CORE") == "compiled":
        pytest.skip("compiled run")
    assert compiled.policy_core() == "interpreted", compiled.compiled_modules()
