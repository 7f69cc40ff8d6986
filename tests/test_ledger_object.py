"""The GPUQuotaLedger objects: a charge's line read back as written, what a ledger's two parts hold together."""

from __future__ import annotations

from decimal import Decimal

from webhook.ledger import document
from webhook.ledger.document import RECENT, SETTLED, Entry
from webhook.policy.charges import Holding, LedgerKey

KEY = LedgerKey("team", "vision", "team", "nvidia.com/gpu.product")


def _entry(name: str, gpus: int = 1, **more: object) -> Entry:
    holding = Holding("ml-a", name, str(more.get("priority", "")), more.get("models"),  # type: ignore[arg-type]
                      (("nvidia.com/gpu", Decimal(gpus)),))
    return Entry(holding, 1700000000.125)


def test_a_charge_reads_back_as_it_was_written() -> None:
    entries = {
        "u1": Entry(Holding("ml-a", "p0", "gpu-training", frozenset({"NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"}),
                            (("nvidia.com/gpu", Decimal(2)), ("nvidia.com/mig-1g.10gb", Decimal(1)))), 1700000000.125),
        "u2": _entry("p1"),
        "u3": _entry("p2", models=frozenset()),  # a selector that names no model: not "any model"
    }
    obj = document.new_object(KEY, "gpu-admission", entries)
    assert obj["status"]["charges"].splitlines()[0] == (
        "u1 ml-a/p0 nvidia.com/gpu=2,nvidia.com/mig-1g.10gb=1 at=2023-11-14T22:13:20.125Z priority=gpu-training "
        "models=NVIDIA-A100-SXM4-80GB,NVIDIA-H100-80GB-HBM3")
    assert document.entries(obj) == entries


def test_a_line_that_does_not_read_charges_nothing() -> None:
    obj = document.new_object(KEY, "gpu-admission", {"u1": _entry("p0")})
    obj["status"]["charges"] += "garbage\nu2 ml-a/p1 nvidia.com/gpu=one at=2023-11-14T22:13:20Z\nu3 nowhere\n\n"
    assert set(document.entries(obj)) == {"u1"}


def test_an_object_is_ours_only_under_the_name_its_spec_gives() -> None:
    obj = document.new_object(KEY, "gpu-admission")
    assert document.key_of(obj) == KEY
    obj["metadata"]["name"] = "something-else"
    assert document.key_of(obj) is None and document.read(obj) is None


def test_a_ledger_holds_its_settled_part_less_what_was_released_plus_its_recent_charges() -> None:
    recent = document.new_object(KEY, "gpu-admission", {"new": _entry("new")})
    recent = document.replaced(recent, {"new": _entry("new")}, {"gone", "never-settled"}, generation=3)
    settled = document.replaced(document.new_object(KEY, "gpu-admission", part=SETTLED),
                                     {"kept": _entry("kept"), "gone": _entry("gone")}, generation=3, epoch=7)
    assert document.name_of(KEY, SETTLED) == document.name_of(KEY) + "-settled"
    parts = {p.part: p for p in map(document.read, [recent, settled]) if p is not None}
    assert parts[RECENT].released == {"gone", "never-settled"} and parts[RECENT].generation == 3
    assert parts[SETTLED].generation == 3 and parts[SETTLED].epoch == 7
    assert set(document.effective([recent, settled])[KEY]) == {"kept", "new"}


def test_charges_of_pods_not_listed_stand_for_pending_pods_in_an_audit() -> None:
    obj = document.new_object(KEY, "gpu-admission", {
        "stored": _entry("stored"), "coming": _entry("coming", 2, priority="high", models=frozenset({"Tesla-T4"}))})
    listed = [{"metadata": {"name": "stored", "namespace": "ml-a", "uid": "stored"}}]
    (pod,) = document.in_flight([obj], listed)
    assert pod["metadata"] == {"name": "coming", "namespace": "ml-a", "uid": "coming",
                               "annotations": {document.IN_FLIGHT: "true"}}
    assert pod["status"] == {"phase": "Pending"}
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert pod["spec"]["priorityClassName"] == "high"
    term = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term == [{"matchExpressions": [{"key": KEY.model_label, "operator": "In", "values": ["Tesla-T4"]}]}]
