"""The provenance summary (``gpu-admission.io/mutated`` and the "gpu-admission mutated" warning): what
changed, in the order it first changed, then the policies that changed it; remembered per sequence of
changes, within a bound, and the same text whether remembered or not."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from webhook.policy import engine
from webhook.policy.decision import Change


@pytest.fixture(autouse=True)
def _forgotten() -> Iterator[None]:
    """Each test starts with nothing remembered (and leaves nothing it made)."""
    engine._SUMMARIES.clear()
    yield
    engine._SUMMARIES.clear()


def _worked_out(changes: list[Change]) -> str:
    """The summary as the docs state it, independently of the engine's code."""
    whats = list(dict.fromkeys(what for _, _, what in changes))
    owners = list(dict.fromkeys(policy for policy, _, _ in changes))
    return f"{','.join(whats)}; policy={','.join(owners)}"


def test_a_summary_names_what_changed_then_who_changed_it_in_order() -> None:
    changes = [("gpu-defaults", "tolerations", "tolerations"), ("gpu-defaults", "shm", "shm"),
               ("training", "priority", "priorityClassName"), ("training", "more", "tolerations")]
    assert engine._summary(changes) == "tolerations,shm,priorityClassName; policy=gpu-defaults,training"
    assert engine._summary(changes) == "tolerations,shm,priorityClassName; policy=gpu-defaults,training"  # remembered
    # control: the same changes in another order are another summary, not the one remembered
    assert engine._summary(changes[::-1]) == "tolerations,priorityClassName,shm; policy=training,gpu-defaults"
    assert len(engine._SUMMARIES) == 2


_NAMES = st.sampled_from(["a", "b", "c", "gpu-defaults"])


@given(st.lists(st.lists(st.tuples(_NAMES, _NAMES, st.sampled_from(["tolerations", "shm", "runtimeClassName"])),
                         min_size=1, max_size=6), min_size=1, max_size=12))
def test_a_remembered_summary_is_the_one_worked_out(sequences: list[list[Change]]) -> None:
    for changes in sequences:  # sequences repeat, overlap and differ: each answered as if for the first time
        assert engine._summary(changes) == _worked_out(changes)
    for changes in sequences:
        assert engine._summary(list(changes)) == _worked_out(changes)


def test_summaries_are_remembered_within_their_bound() -> None:
    beyond = engine._SUMMARIES_SIZE + 50
    for n in range(beyond):
        changes = [(f"policy-{n}", "rule", "tolerations")]
        assert engine._summary(changes) == f"tolerations; policy=policy-{n}"
    assert len(engine._SUMMARIES) == engine._SUMMARIES_SIZE
    # past the bound, a summary is still right (worked out again, not remembered)
    assert engine._summary([(f"policy-{beyond - 1}", "rule", "shm")]) == f"shm; policy=policy-{beyond - 1}"
    assert len(engine._SUMMARIES) == engine._SUMMARIES_SIZE
