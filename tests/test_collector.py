"""The collector's young threshold during serve and audit runs (webhook.collector)."""

from __future__ import annotations

import gc

from webhook import collector


def test_fewer_collections_raises_the_young_threshold_and_restores_it() -> None:
    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        with collector.fewer_collections():
            assert gc.get_threshold() == (collector.YOUNG_THRESHOLD, 10, 10)
            count = gc.get_count()[0]
            garbage: list[list[int]] = [[] for _ in range(1_000)]  # past the default threshold: no young collection yet
            assert gc.get_count()[0] >= count + 900, "the young generation was collected"
            del garbage
        assert gc.get_threshold() == (700, 10, 10)
        gc.set_threshold(50_000, 5, 5)  # a higher threshold set by the operator stays
        with collector.fewer_collections():
            assert gc.get_threshold() == (50_000, 5, 5)
    finally:
        gc.set_threshold(*saved)
