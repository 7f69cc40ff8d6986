"""The guarded listener's slow-client defences on uvloop (`serve`'s default loop where installed).

The same tests as tests/test_server_slow_clients.py, collected again here
with every event loop of this module made by uvloop (tests/conftest.py,
``pytest_asyncio_loop_factories``): uvloop has its own TLS transport, and
each defence must hold on it as on asyncio's.
"""

from __future__ import annotations

import asyncio
import sys

import pytest
import uvloop  # noqa: F401 (a runtime dependency on this platform: these tests run, never skip)

from tests.test_server_slow_clients import *  # noqa: F403 (the tests themselves, run again below)


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_serve_s_loop_is_made_by_a_factory_and_the_policy_is_left_alone() -> None:
    from webhook.server import loop

    policy = asyncio.get_event_loop_policy()
    assert loop.run(_loop_module(), loop.factory("auto")).startswith("uvloop")
    assert loop.run(_loop_module(), loop.factory("uvloop")).startswith("uvloop")
    assert loop.run(_loop_module(), loop.factory("asyncio")).startswith("asyncio")
    assert asyncio.get_event_loop_policy() is policy


def test_auto_falls_back_to_asyncio_when_uvloop_does_not_import(monkeypatch: pytest.MonkeyPatch) -> None:
    from webhook.errors import GpuAdmissionError
    from webhook.server import loop

    monkeypatch.setitem(sys.modules, "uvloop", None)  # what a broken or missing install gives: ImportError
    assert loop.run(_loop_module(), loop.factory("auto")).startswith("asyncio")
    with pytest.raises(GpuAdmissionError, match="uvloop is not installed"):
        loop.factory("uvloop")
