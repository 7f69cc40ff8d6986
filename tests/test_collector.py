"""The collector's young threshold during serve and audit runs (webhook.collector)."""

from __future__ import annotations

import gc

import orjson

from tests.conftest import StartWebhook
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


def test_serves_threshold_holds_twenty_large_reviews_in_flight_without_a_young_collection() -> None:
    # what serve holds under load: a parsed review per connection waiting for its turn (20 connections
    # of the bench's 66 KB 20-container pod); at the default young threshold of runs, they are collected
    from bench.server import payloads
    from webhook import review

    body = orjson.dumps(payloads()["20-container pod"])
    collections: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 0:
            collections.append(1)

    def in_flight(young: int) -> int:
        gc.collect()
        collections.clear()
        gc.callbacks.append(count)
        try:
            with collector.fewer_collections(young):
                held = [review.parse_review(body) for _ in range(20)]
                del held
        finally:
            gc.callbacks.remove(count)
        return len(collections)

    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        assert in_flight(collector.YOUNG_THRESHOLD) > 0  # (what the test would see with too low a threshold)
        assert in_flight(collector.SERVE_YOUNG_THRESHOLD) == 0
    finally:
        gc.set_threshold(*saved)


async def test_serve_moves_what_is_alive_at_start_out_of_the_collectors_scans(start_webhook: StartWebhook) -> None:
    gc.unfreeze()
    try:
        await start_webhook(freeze_gc_after_sync=True)
        # the modules, policies and app: a full collection no longer walks them on every pass
        assert gc.get_freeze_count() > 10_000
    finally:
        gc.unfreeze()
