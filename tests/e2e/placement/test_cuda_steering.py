"""CUDA steering seen in where the scheduler puts pods.

An image whose CUDA is newer than some drivers of the pool is steered
(required node affinity) onto the nodes that run it: natively (a newer
driver) or through forward compatibility, which works on data-center GPUs
only (a GeForce fails with CUDA error 804; FACTS.md §1). Every case runs
under the packing profile with the GeForce node the fullest, so a pod that
may go there goes there: the control (the same pods not opted in,
tolerating the GPU taint by hand) lands on it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tests.e2e.fixtures import TOLERATE_GPU, deployment, gpu_container, gpu_node, pod
from tests.e2e.kube import Kube, Object, Refused
from tests.e2e.placement.pool import Pool, bound, driver_labels, landed_on, placements
from webhook.gpu import cuda, images, products
from webhook.gpu.image_table import RELEASES, Release

A100, GEFORCE, H100 = "NVIDIA-A100-SXM4-80GB", "NVIDIA-GeForce-RTX-4090", "NVIDIA-H100-80GB-HBM3"
CUDA_124 = "nvidia/cuda:12.4.1-runtime-ubuntu22.04"  # needs 550.54.15; cuda-compat on R535 data-center GPUs
TRITON = "nvcr.io/nvidia/tritonserver:24.01-py3"  # CUDA 12.3.2: needs 545.23.08; NGC 24.01 runs on R535 (forward)


def test_cuda_pods_and_a_deployment_never_land_on_the_geforce_of_an_old_driver(
    admin: Kube, pool: Pool, namespace: str, plain_namespace: str
) -> None:
    """The A100 and the GeForce share driver 535.104.05: only the A100 runs CUDA 12.4 / 12.3 (forward
    compatibility); the H100's 560.35.03 runs both natively."""
    pool.register(gpu_node("a100", "535.104.05", A100, gpus=32), gpu_node("geforce", "535.104.05", GEFORCE, gpus=32),
                  gpu_node("h100", "560.35.03", H100, gpus=32))
    # the GeForce half full (bound by hand): under packing, the node every pod goes to if it may
    admin.create(pod("filler", plain_namespace, gpu_container(gpus=16), tolerations=[TOLERATE_GPU],
                     nodeName=pool.node_name("geforce")))

    def workloads(ns: str, tolerations: list[Object]) -> dict[str, str | None]:
        """3 CUDA 12.4 pods and a Deployment of 4 Triton replicas in ``ns``: where the 7 pods land."""
        serving = deployment("triton", ns, gpu_container(name="triton", image=TRITON))
        serving["spec"]["replicas"] = 4
        serving["spec"]["template"]["spec"]["tolerations"] = tolerations
        made = pool.create([*(pod(f"cuda-{i}", ns, gpu_container(image=CUDA_124), tolerations=tolerations)
                              for i in range(3)), serving])
        assert not [r for r in made.values() if isinstance(r, Refused)], made
        landed = landed_on(placements(admin, ns, count=7 + (ns == plain_namespace)), pool)
        landed.pop("filler", None)
        assert len(landed) == 7, landed
        return landed

    # the control first: not opted in (tolerating the taint by hand), every pod goes to the GeForce
    control = workloads(plain_namespace, [TOLERATE_GPU])
    assert set(control.values()) == {"geforce"}, control
    # steered: never the GeForce, whose driver runs CUDA 12.3 and 12.4 only through forward compatibility
    steered = workloads(namespace, [])
    assert "geforce" not in steered.values() and None not in steered.values(), steered


# -- one pod per row of the shipped image → CUDA table


@dataclass(frozen=True)
class Row:
    image: str
    needs: cuda.DriverVersion
    inferred: images.Inferred


def _tag(release: Release) -> str | None:
    """A tag of the row's first release that the row's expression matches."""
    first = release.first
    candidates = [f"{first}-py3", f"{first}-gpu", first, f"v{first}", f"{first}-py311-gpu", "latest", "v0.1",
                  "2.4.1-gpu", "0.4.2"]
    for tag in candidates:
        found = re.fullmatch(release.tag, tag) if tag else None
        if found and (not first or not found.groups() or found[1] == first):
            return tag
    return None


def table_rows() -> list[Row]:
    index = cuda.strict_index()
    rows = []
    for release in RELEASES:
        tag = _tag(release)
        assert tag is not None, f"no tag found for {release}"
        image = f"{release.repositories[0]}:{tag}"
        found = images.infer("main", image, {})
        assert isinstance(found, images.Inferred) and found.version is not None, (image, found)
        assert cuda.CudaVersion.parse(release.cuda) == found.version, (image, found, release.cuda)
        needs = cuda.min_driver(found.version, "strict", index)
        assert needs is not None, image
        rows.append(Row(image, needs, found))
    return rows


#: the pool of the generated case: a data-center GPU and a GeForce on each of two drivers
TABLE_NODES = {"a100-535": ("535.104.05", A100), "geforce-535": ("535.104.05", GEFORCE),
               "a100-550": ("550.54.15", A100), "geforce-550": ("550.54.15", GEFORCE)}


def runs(row: Row, node: str) -> bool:
    """Whether ``node`` of TABLE_NODES runs the row's image: its driver, or forward compatibility on a
    data-center GPU (FACTS.md §1; the branches of the NGC release notes and the image's NVIDIA_REQUIRE_CUDA)."""
    text, product = TABLE_NODES[node]
    driver = cuda.DriverVersion.parse(text)
    assert driver is not None
    if row.needs <= driver:
        return True
    return products.is_data_center(product) and any(b.admits(driver) for b in row.inferred.branches)


def test_no_image_of_the_table_lands_on_a_node_that_cannot_run_it(
    admin: Kube, pool: Pool, namespace: str, plain_namespace: str
) -> None:
    rows = table_rows()
    pool.register(*(gpu_node(name, driver, product, gpus=400, extra_capacity={"pods": "400"}) for name, (driver, product) in TABLE_NODES.items()))
    # the GeForce on 535 a quarter full (bound by hand): under packing, the node every pod goes to if it may
    admin.create(pod("filler", plain_namespace, gpu_container(gpus=100, memory="256Gi"), tolerations=[TOLERATE_GPU],
                     nodeName=pool.node_name("geforce-535")))

    def pods(ns: str, tolerations: list[Object]) -> list[Object]:
        return [pod(f"row-{i}", ns, gpu_container(name="main", image=row.image, memory="1Gi"), tolerations=tolerations)
                for i, row in enumerate(rows)]

    opted = pool.create(pods(namespace, []))
    control = pool.create(pods(plain_namespace, [TOLERATE_GPU]))
    admitted = {name for name, made in opted.items() if not isinstance(made, Refused)}
    refused = {name: made.message for name, made in opted.items() if isinstance(made, Refused)}
    by_name = {f"row-{i}": row for i, row in enumerate(rows)}
    # refused: exactly the images no node of the pool runs
    for name, message in refused.items():
        assert not any(runs(by_name[name], node) for node in TABLE_NODES), (by_name[name].image, message)
    assert len(admitted) > len(rows) // 2, refused
    landed = landed_on(placements(admin, namespace, admitted, timeout=90), pool)
    wrong = {by_name[name].image: node for name, node in landed.items() if node is None or not runs(by_name[name], node)}
    # the control: not opted in, every pod goes to the fullest node, the GeForce on 535, runnable or not
    placed = landed_on(placements(admin, plain_namespace, set(control) - {"filler"}, timeout=90), pool)
    assert set(placed.values()) == {"geforce-535"}, {n: p for n, p in placed.items() if p != "geforce-535"}
    assert any(not runs(by_name[name], "geforce-535") for name in admitted), "no admitted image needed steering"
    assert not wrong, f"{len(wrong)} of {len(admitted)} pods on a node that cannot run them: {wrong}"


def test_a_pending_steered_pod_schedules_once_a_node_driver_is_upgraded(
    admin: Kube, pool: Pool, namespace: str, plain_namespace: str
) -> None:
    """GeForce nodes: the one on 550.54.15 runs CUDA 12.4 but is full; the one on 535 does not. The steered
    pod waits, and lands on the 535 node once its driver is upgraded to 560.35.03 (GFD relabels it)."""
    pool.register(gpu_node("old", "535.104.05", GEFORCE, gpus=8), gpu_node("new", "550.54.15", GEFORCE, gpus=1))
    # what fills the capable node: bound by hand, not by the scheduler
    filler = pod("filler", plain_namespace, gpu_container(), tolerations=[TOLERATE_GPU],
                 nodeName=pool.node_name("new"))
    admin.create(filler)
    waiting = pod("cuda", namespace, gpu_container(image=CUDA_124))
    pool.create([waiting, pod("cuda", plain_namespace, gpu_container(image=CUDA_124), tolerations=[TOLERATE_GPU])])
    assert landed_on(placements(admin, namespace, ["cuda"]), pool) == {"cuda": None}
    # the control: without steering it would go to the old driver at once (and fail there)
    assert landed_on(placements(admin, plain_namespace, ["cuda"]), pool) == {"cuda": "old"}
    pool.relabel("old", driver_labels("560.35.03"))
    assert bound(admin, namespace, "cuda") == pool.node_name("old")
