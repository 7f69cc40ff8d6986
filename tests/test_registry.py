"""The registry resolver against a real registry (Debian's docker-registry on 127.0.0.1).

Images are pushed by the OCI API with configs shaped like NVIDIA's CUDA base
images, as multi-arch indexes, and into registries behind htpasswd and
bearer tokens. Failing registries (stopped, answering 500, never answering)
are real local servers too. No test asserts a duration: "within the budget"
is shown by admission returning while the resolution is still running.
Without docker-registry only the tests that run one skip (or fail, where the
whole suite must run: tests.support.unavailable).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.registry_server import Pusher, Registry, run_registry
from tests.support import shipped_policies
from webhook.policy import engine
from webhook.policy.request import Request
from webhook.registry.client import RegistryClient
from webhook.registry.credentials import Credentials, parse_docker_config
from webhook.registry.resolver import Resolver, ResolverSettings, unknown_images
from webhook.registry.view import ResolvedView
from webhook.view.snapshot import SnapshotView

CUDA_12_4 = {  # as nvidia/cuda:12.4.1-base-ubuntu22.04 states it (brand=tesla alternatives kept)
    "PATH": "/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/bin",
    "NVARCH": "x86_64",
    "NVIDIA_REQUIRE_CUDA": "cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=geforce,driver>=470,driver<471 "
                           "brand=tesla,driver>=525,driver<526 brand=tesla,driver>=535,driver<536",
    "NV_CUDA_CUDART_VERSION": "12.4.127-1",
    "CUDA_VERSION": "12.4.1",
}
CUDA_12_8 = {"CUDA_VERSION": "12.8.1", "NVIDIA_REQUIRE_CUDA": "cuda>=12.8 brand=tesla,driver>=535,driver<536"}


@pytest.fixture(scope="module")
def registries(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Registry]]:
    started: dict[str, Registry] = {}
    contexts = []
    for auth in ("none", "htpasswd", "token"):
        context = run_registry(tmp_path_factory.mktemp(auth), auth)
        started[auth] = context.__enter__()
        contexts.append(context)
        push = Pusher(started[auth])
        push.image("team/serve", "v1", CUDA_12_4)
        push.index("team/multi", "v2", {"amd64": CUDA_12_8, "arm64": {"CUDA_VERSION": "12.2.0"}})
        push.image("team/tools", "v3", {"PATH": "/usr/bin"})
    try:
        yield started
    finally:
        for context in reversed(contexts):
            context.__exit__(None, None, None)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def _resolver(session: aiohttp.ClientSession, registry: Registry | None = None, **settings: Any) -> Resolver:
    creds = {registry.host: Credentials(*registry.user)} if registry is not None and registry.user else {}
    client = RegistryClient(session, credentials=creds, clock=time.monotonic)
    return Resolver(client, ResolverSettings(**settings))


@pytest.mark.parametrize("auth", ["none", "htpasswd", "token"])
async def test_every_pushed_image_resolves(registries: dict[str, Registry], session: aiohttp.ClientSession, auth: str) -> None:
    registry = registries[auth]
    resolver = _resolver(session, registry)
    refs = [f"{registry.host}/team/serve:v1", f"{registry.host}/team/multi:v2", f"{registry.host}/team/tools:v3"]
    await resolver.prefetch(refs, budget=30)
    serve, multi, tools = (resolver.image_config(r) for r in refs)
    assert serve is not None and serve.env == {k: CUDA_12_4[k] for k in ("CUDA_VERSION", "NVIDIA_REQUIRE_CUDA")}
    assert multi is not None and multi.env["CUDA_VERSION"] == "12.8.1"  # the linux/amd64 image of the index
    assert tools is not None and tools.env == {} and tools.inferred() is None


async def test_cache_hits_cost_no_request(registries: dict[str, Registry], session: aiohttp.ClientSession) -> None:
    registry = registries["token"]
    resolver = _resolver(session, registry)
    ref = f"{registry.host}/team/serve:v1"
    await resolver.prefetch([ref], budget=30)
    asked = resolver.client.requests
    config = resolver.image_config(ref)
    assert asked > 0 and config is not None
    await resolver.prefetch([ref, ref], budget=30)
    await resolver.prefetch([f"{registry.host}/team/serve@{config.digest}"], budget=30)  # known by digest
    assert resolver.client.requests == asked
    assert resolver.image_config(f"{registry.host}/team/serve@{config.digest}") == config


async def test_a_protected_registry_without_credentials_is_unknown_and_not_asked_again(
    registries: dict[str, Registry], session: aiohttp.ClientSession
) -> None:
    registry = registries["htpasswd"]
    resolver = _resolver(session)  # no credentials
    ref = f"{registry.host}/team/serve:v1"
    await resolver.prefetch([ref], budget=30)
    assert resolver.image_config(ref) is None
    asked = resolver.client.requests
    await resolver.prefetch([ref], budget=30)  # the failure is remembered for retry_after
    assert resolver.client.requests == asked


def _node(product: str, driver: str) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": "n", "labels": {"nvidia.com/gpu.product": product,
                                                                  "nvidia.com/cuda.driver-version.full": driver}},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}}}


def _pod(image: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"},
            "spec": {"containers": [{"name": "c", "image": image, "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}


async def test_the_image_config_decides_the_cuda_check(registries: dict[str, Registry], session: aiohttp.ClientSession) -> None:
    registry = registries["none"]
    resolver = _resolver(session, registry)
    image = f"{registry.host}/team/serve:v1"
    pod = _pod(image)
    await resolver.prefetch(unknown_images(pod), budget=30)

    def decide(product: str) -> Any:
        view = ResolvedView(SnapshotView.from_objects([_node(product, "535.104.05")]), resolver)
        return engine.evaluate(shipped_policies(), Request.for_object(pod), view, "validate")

    # CUDA 12.4.1 on R535: its cuda-compat (brand=tesla,driver>=535) runs it on a data-center GPU only
    assert decide("NVIDIA-A100-SXM4-80GB").allowed
    denied = decide("NVIDIA-GeForce-RTX-4090")
    assert not denied.allowed
    config = resolver.image_config(image)
    assert config is not None
    assert f"CUDA 12.4.1 (image config at {config.digest[:19]}) needs driver >= 550.54.15" in denied.message()
    assert "forward compatibility would run it on data-center GPUs with R470/R525/R535" in denied.message()


async def _unknown_finding(resolver: Resolver, image: str) -> Any:
    view = ResolvedView(SnapshotView.from_objects([_node("NVIDIA-A100-SXM4-80GB", "535.104.05")]), resolver)
    return engine.evaluate(shipped_policies(), Request.for_object(_pod(image)), view, "validate")


async def test_a_stopped_registry_is_an_unknown_image_not_a_denial(tmp_path: Path, session: aiohttp.ClientSession) -> None:
    with run_registry(tmp_path, "none") as registry:
        Pusher(registry).image("team/serve", "v1", CUDA_12_4)
    image = f"{registry.host}/team/serve:v1"  # the registry is gone now
    resolver = _resolver(session)
    await resolver.prefetch([image], budget=30)
    assert resolver.image_config(image) is None
    decision = await _unknown_finding(resolver, image)
    assert decision.allowed and "no CUDA version known for its image" in " ".join(decision.warnings)


async def test_a_registry_answering_500_is_an_unknown_image(aiohttp_server: Any, session: aiohttp.ClientSession) -> None:
    async def broken(request: web.Request) -> web.Response:
        return web.Response(status=500, text="storage backend down")

    app = web.Application()
    app.router.add_get("/{tail:.*}", broken)
    server = await aiohttp_server(app, host="127.0.0.1")
    image = f"127.0.0.1:{server.port}/team/serve:v1"
    resolver = _resolver(session)
    await resolver.prefetch([image], budget=30)
    assert resolver.image_config(image) is None
    assert (await _unknown_finding(resolver, image)).allowed


async def test_a_registry_that_never_answers_does_not_hold_admission(session: aiohttp.ClientSession) -> None:
    accepted = asyncio.Event()
    release = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set()
        await release.wait()
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    image = f"127.0.0.1:{port}/team/serve:v1"
    resolver = _resolver(session, budget=0.05)
    try:
        await resolver.prefetch([image])  # the default budget
        # admission went on while the resolution is still waiting for a registry that has not answered
        assert resolver.resolving(image) and not release.is_set()
        await asyncio.wait_for(accepted.wait(), 30)  # (the request reaches it, however loaded the machine)
        assert resolver.resolving(image)
        assert resolver.image_config(image) is None
        assert (await _unknown_finding(resolver, image)).allowed
    finally:
        release.set()
        await resolver.close()
        server.close()
        await server.wait_closed()


async def test_only_allowed_registries_are_contacted(registries: dict[str, Registry], session: aiohttp.ClientSession) -> None:
    registry = registries["none"]
    resolver = _resolver(session, registry, registries=("nvcr.io", "*.example.com"))
    image = f"{registry.host}/team/serve:v1"
    await resolver.prefetch([image], budget=30)
    assert resolver.client.requests == 0 and resolver.image_config(image) is None
    allowed = _resolver(session, registry, registries=("127.0.0.1:*",))
    await allowed.prefetch([image], budget=30)
    assert allowed.image_config(image) is not None


def test_unknown_images_are_the_ones_the_name_does_not_tell() -> None:
    job = {"kind": "Job", "spec": {"template": {"spec": {
        "initContainers": [{"name": "i", "image": "busybox"}],
        "containers": [{"name": "a", "image": "registry.example/team/app:1"},
                       {"name": "b", "image": "nvcr.io/nvidia/pytorch:24.05-py3"},
                       {"name": "c", "image": "registry.example/team/app:1"}]}}}}
    assert unknown_images(job) == ["registry.example/team/app:1"]


def test_docker_config_credentials_never_print() -> None:
    table = parse_docker_config({"auths": {"https://index.docker.io/v1/": {"auth": "dXNlcjpodW50ZXIy"},
                                           "registry.example:5000": {"username": "bot", "password": "pw-123"}}})
    assert table["registry.example:5000"] == Credentials("bot", "pw-123")
    assert "hunter2" not in repr(table) and "pw-123" not in repr(table)


def _review(image: str) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"},
                        "namespace": "ml", "operation": "CREATE", "userInfo": {"username": "tester"},
                        "object": _pod(image), "oldObject": None, "dryRun": False}}


async def _webhook(aiohttp_client: Any, budget: float) -> Any:
    from tests.support import POLICIES
    from webhook.server import keys
    from webhook.server.app import AppConfig, create_app

    view = SnapshotView.from_objects([_node("NVIDIA-GeForce-RTX-4090", "535.104.05")])
    app = create_app(AppConfig(policies=POLICIES), view=view, images=ResolverSettings(budget=budget))
    client = await aiohttp_client(app)
    return client, lambda: app[keys.RESOLVER]


async def test_the_server_resolves_within_its_budget_and_answers_from_the_cache(
    registries: dict[str, Registry], aiohttp_client: Any
) -> None:
    client, resolver = await _webhook(aiohttp_client, budget=30)
    image = f"{registries['none'].host}/team/serve:v1"
    first = await (await client.post("/validate", json=_review(image))).json()
    assert first["response"]["allowed"] is False
    assert "CUDA 12.4.1 (image config at sha256:" in first["response"]["status"]["message"]
    asked = resolver().client.requests
    second = await (await client.post("/validate", json=_review(image))).json()
    assert second["response"]["status"]["message"] == first["response"]["status"]["message"]
    assert resolver().client.requests == asked


async def test_the_server_does_not_wait_past_its_budget(aiohttp_client: Any) -> None:
    release = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await release.wait()
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    image = f"127.0.0.1:{server.sockets[0].getsockname()[1]}/team/serve:v1"
    client, resolver = await _webhook(aiohttp_client, budget=0.05)
    try:
        answer = await (await client.post("/validate", json=_review(image))).json()
        assert answer["response"]["allowed"] is True  # unknown, so a warning: never a denial by itself
        assert any("no CUDA version known" in w for w in answer["response"]["warnings"])
        assert resolver().resolving(image)  # still resolving in the background
    finally:
        release.set()
        server.close()
        await server.wait_closed()


def test_audit_resolve_images(registries: dict[str, Registry], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from tests.support import POLICIES
    from webhook import cli

    registry = registries["htpasswd"]
    config = tmp_path / "config.json"
    assert registry.user is not None
    user, password = registry.user
    config.write_text(json.dumps({"auths": {registry.host: {"username": user, "password": password}}}))
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump({"kind": "List", "items": [_node("Tesla-T4", "470.82.01")]}))
    (tmp_path / "pod.yaml").write_text(yaml.safe_dump(_pod(f"{registry.host}/team/multi:v2")))
    args = ["audit", "--policies", str(POLICIES), "--cluster-state", str(tmp_path / "nodes.yaml"), str(tmp_path / "pod.yaml")]
    assert cli.main(args) == 0
    assert "no CUDA version known" in capsys.readouterr().out
    assert cli.main([*args, "--resolve-images", "--registry-config", str(config)]) == 1
    out = capsys.readouterr().out
    assert "CUDA 12.8.1 (image config at sha256:" in out and "needs driver >= 570.124.06" in out
    assert "s3cret-pass" not in out
