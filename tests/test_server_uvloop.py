"""The guarded listener's slow-client defences on uvloop (`serve`'s default loop where installed).

The same tests as tests/test_server_slow_clients.py, collected again here
with every event loop of this module made by uvloop: uvloop has its own TLS
transport, and each defence must hold on it as on asyncio's.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.test_server_slow_clients import *  # noqa: F403 (the tests themselves, run again below)

uvloop = pytest.importorskip("uvloop")

# pytest-asyncio's replacement (a loop-factories hook) applies to every test below a conftest;
# the fixture is per module. If it ever stops working, test_the_loop_is_uvloop fails.
pytestmark = pytest.mark.filterwarnings('ignore:Overriding the "event_loop_policy" fixture is deprecated')


@pytest.fixture(scope="session")
def event_loop_policy() -> asyncio.AbstractEventLoopPolicy:
    return uvloop.EventLoopPolicy()


async def test_the_loop_is_uvloop() -> None:
    assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")
