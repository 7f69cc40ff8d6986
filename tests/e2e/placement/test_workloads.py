"""Workloads through the real controllers under a team cap of 8 GPUs (e2e-placement-cap).

The ReplicaSet and Job controllers create pods one request at a time and
retry what is refused: the cap must hold against their retries, and what
they report (a ``FailedCreate`` event on the ReplicaSet or Job) must carry
our refusal, which is all a user of ``kubectl describe`` sees.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tests.e2e.fixtures import PLACEMENT_CAP, TOLERATE_GPU, deployment, gpu_container, gpu_node, job
from tests.e2e.kube import Kube, Object, eventually
from tests.e2e.placement.pool import Pool, landed_on, placements

DENIED = 'admission webhook "validate.gpu-admission.io" denied the request'


def failed_creates(admin: Kube, namespace: str, kind: str) -> list[str]:
    """The messages of the FailedCreate events the controllers reported on objects of ``kind``."""
    return [str(e.get("message", "")) for e in admin.list("v1", "Event", namespace)
            if e.get("reason") == "FailedCreate" and (e.get("involvedObject") or {}).get("kind") == kind]


def live_pods(admin: Kube, namespace: str) -> list[Object]:
    return [p for p in admin.list("v1", "Pod", namespace) if not p["metadata"].get("deletionTimestamp")]


def stays(check: Callable[[], bool], seconds: float, what: str) -> None:
    """``check`` holds at every look for ``seconds`` (the controllers keep retrying meanwhile)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert check(), what
        time.sleep(0.25)


def test_a_deployment_scaled_to_24_and_a_job_of_16_stop_at_the_team_cap(
    admin: Kube, pool: Pool, capped_namespaces: Callable[[int], list[str]], plain_namespace: str
) -> None:
    serving, batch = capped_namespaces(2)  # a team each
    pool.register(gpu_node("a100", "535.104.05", gpus=64))
    web = pool.workload(deployment("llm", serving, gpu_container(name="llm")))
    web["spec"]["replicas"] = 0
    stored = admin.create(web)
    # the control: the same Deployment where no cap applies (the toleration by hand) gets all 24
    uncapped = pool.workload(deployment("llm", plain_namespace, gpu_container(name="llm")))
    uncapped["spec"]["template"]["spec"]["tolerations"] = [TOLERATE_GPU]
    uncapped["spec"]["replicas"] = 0
    uncapped = admin.create(uncapped)
    admin.patch(uncapped, {"spec": {"replicas": 24}})
    work = pool.workload(job("sweep", batch, gpu_container(name="sweep")))
    work["spec"].update({"parallelism": 16, "completions": 16, "backoffLimit": 0})
    admin.create(work)
    admin.patch(stored, {"spec": {"replicas": 24}})

    for namespace, kind in ((serving, "ReplicaSet"), (batch, "Job")):
        refusals = eventually(lambda: failed_creates(admin, namespace, kind), timeout=60,  # noqa: B023
                              what=f"a FailedCreate event on the {kind} in {namespace}")
        assert all(DENIED in m and f"uses {PLACEMENT_CAP} of {PLACEMENT_CAP} nvidia.com/gpu" in m for m in refusals), refusals
        eventually(lambda: len(live_pods(admin, namespace)) == PLACEMENT_CAP, timeout=60,  # noqa: B023
                   what=f"{PLACEMENT_CAP} pods in {namespace}")
    # the controllers retry the refused pods: the cap holds while they do
    stays(lambda: [len(live_pods(admin, ns)) for ns in (serving, batch)] == [PLACEMENT_CAP] * 2, 5,
          f"exactly {PLACEMENT_CAP} pods in each namespace")
    # and the 8 that exist are scheduled (the pool has room for all 40)
    for namespace in (serving, batch):
        landed = landed_on(placements(admin, namespace, count=PLACEMENT_CAP), pool)
        assert list(landed.values()) == ["a100"] * PLACEMENT_CAP, landed
    assert admin.get("apps/v1", "Deployment", "llm", serving)["spec"]["replicas"] == 24
    assert len(placements(admin, plain_namespace, count=24)) == 24
