"""Policy files rewritten under the running server: never half-loaded, and a gauge says when they do not load."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import StartWebhook
from tests.support import POLICIES, corpus_reviews, file_reads, load_review
from webhook import cli
from webhook.errors import PolicyError
from webhook.policy import loader, offload
from webhook.server import keys
from webhook.server.policies import OFFLOAD_RECORD, PolicyStore


def fractional_gpu_review() -> dict[str, object]:
    sent = load_review(next(p for p in corpus_reviews() if "validate_create_pods" in p.name))
    container = sent["request"]["object"]["spec"]["containers"][0]
    container["resources"] = {"limits": {"nvidia.com/gpu": "0.5"}}
    return sent


async def test_a_file_rewritten_in_place_is_never_loaded_half_written(start_webhook: StartWebhook, policy_dir: Path) -> None:
    """The validations file rewritten slowly, in place: every prefix of it is on disk for a while
    (the empty file first). A fractional-GPU pod must be refused throughout."""
    hook = await start_webhook(reload_interval=0.05)
    store = hook.app[keys.STORE]
    target = policy_dir / "gpu-validations.yaml"
    text = target.read_text() + "# rewritten\n"
    sent = fractional_gpu_review()
    assert not (await hook.review("/validate", sent))["response"]["allowed"]

    def rewrite() -> None:
        with target.open("w") as f:
            for start in range(0, len(text), 200):
                f.write(text[start : start + 200])
                f.flush()
                time.sleep(0.03)  # shorter than a check interval: never stable half-way

    writer = asyncio.create_task(asyncio.to_thread(rewrite))
    verdicts = []
    while not writer.done():
        verdicts.append((await hook.review("/validate", sent))["response"]["allowed"])
    before = store.current
    for _ in range(100):
        if store.current is not before:
            break
        await asyncio.sleep(0.05)
    assert len(verdicts) > 10 and not any(verdicts), "a half-written policy file was in force"
    assert hook.app[keys.METRICS].reloads.labels("error")._value.get() == 0, "half-written states were never tried"
    assert hook.app[keys.METRICS].reloads.labels("success")._value.get() == 1, "the finished file is loaded once"


async def test_a_gauge_says_whether_the_files_on_disk_load(start_webhook: StartWebhook, policy_dir: Path) -> None:
    hook = await start_webhook(reload_interval=0.02)
    store = hook.app[keys.STORE]

    async def loadable() -> str:
        async with hook.session.get(hook.base + "/metrics") as resp:
            text = await resp.text()
        return next(line.split()[-1] for line in text.splitlines() if line.startswith("gpu_admission_policy_files_loadable "))

    good = store.current
    assert await loadable() == "1.0"
    (policy_dir / "broken.yaml").write_text("apiVersion: gpu-admission.io/v1alpha1\nkind: GPUPolicy\nspec: 7\n")
    for _ in range(200):
        if store.last_error:
            break
        await asyncio.sleep(0.02)
    assert "broken.yaml" in store.last_error and store.current is good
    assert await loadable() == "0.0"
    (policy_dir / "broken.yaml").unlink()
    for _ in range(200):
        if not store.last_error:
            break
        await asyncio.sleep(0.02)
    assert await loadable() == "1.0"


async def test_a_directory_left_without_a_policy_is_refused_and_the_last_good_set_stays(
    start_webhook: StartWebhook, policy_dir: Path,
) -> None:
    # an emptied ConfigMap, or a path into it that names no policy: the server would enforce nothing
    hook = await start_webhook(reload_interval=0.02)
    store = hook.app[keys.STORE]
    good = store.current
    for path in policy_dir.glob("gpu-*.yaml"):  # every GPUPolicy; the classes and kinds stay
        path.rename(path.with_suffix(".bak"))
    for _ in range(200):
        if store.last_error:
            break
        await asyncio.sleep(0.02)
    assert "no GPUPolicy found: the server would enforce nothing" in store.last_error and store.current is good
    assert not (await hook.review("/validate", fractional_gpu_review()))["response"]["allowed"]  # still enforced


def test_the_server_does_not_start_on_a_directory_without_a_policy(tmp_path: Path) -> None:
    (tmp_path / "classes.yaml").write_text((POLICIES / "workload-classes.yaml").read_text())
    with pytest.raises(PolicyError) as refused:
        PolicyStore(tmp_path)
    assert refused.value.problems == [f"{tmp_path}: no GPUPolicy found: the server would enforce nothing"]


def test_files_not_read_as_policies_are_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
) -> None:
    shutil.copytree(POLICIES, tmp_path / "p")
    (tmp_path / "p" / "extra-policy").write_text((POLICIES / "gpu-defaults.yaml").read_text())  # a key without .yaml
    with caplog.at_level(logging.WARNING, logger="webhook"):
        PolicyStore(tmp_path / "p")
    assert [r.getMessage() for r in caplog.records] == ["not read as policies (only .yaml and .yml files are): extra-policy"]
    assert cli.main(["policies", "check", str(tmp_path / "p")]) == 0
    assert "  not read (only .yaml and .yml files are): extra-policy" in capsys.readouterr().out.splitlines()


async def test_a_reload_reads_the_files_off_the_event_loop(
    start_webhook: StartWebhook, policy_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """The reload's listing, reads of the policy files and of the compiled record are no request's wait."""
    compiled = tmp_path / "compiled"
    compiled.mkdir()
    (compiled / OFFLOAD_RECORD).write_text(json.dumps(offload.record(loader.load_directory(policy_dir), (1, 36))))
    hook = await start_webhook(reload_interval=0.02, compiled=compiled)
    store, loop_thread = hook.app[keys.STORE], threading.get_ident()
    before, target = store.current, policy_dir / "gpu-validations.yaml"
    edited = target.read_text() + "# edited\n"
    with caplog.at_level(logging.INFO, logger="webhook"), file_reads(policy_dir, compiled) as reads:
        await asyncio.to_thread(target.write_text, edited)  # (not on the loop either: only the server's reads count)
        for _ in range(500):
            if store.current is not before:
                break
            await asyncio.sleep(0.02)
        assert store.current is not before, "the edit was never loaded"
    read = {path for path, _ in reads}
    assert {str(target), str(compiled / OFFLOAD_RECORD), str(policy_dir)} <= read, "the reads were not seen"
    assert sorted({path for path, thread in reads if thread == loop_thread}) == [], "read on the event loop"
    assert store.current.offload is not None and store.last_error == ""
    reloaded = [r.getMessage() for r in caplog.records if r.getMessage().startswith("policies reloaded: ")]
    assert reloaded == [f"policies reloaded: {len(store.current.policies)} policies ({store.current.fingerprint})"]
    assert hook.app[keys.METRICS].reloads.labels("success")._value.get() == 1


def test_a_reload_that_drops_policies_names_them_in_a_warning(policy_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A file emptied or cut short in place is valid YAML and loads: the policies it held are gone, which
    the log says at WARNING by name (an edit that keeps every policy does not)."""
    store = PolicyStore(policy_dir)
    target = policy_dir / "gpu-defaults.yaml"

    def reload() -> None:
        for _ in range(2):  # a change loads once it stayed put between two checks
            change = store.read_change()
        assert change is not None and store.use(change)

    with caplog.at_level(logging.INFO, logger="webhook"):
        target.write_text(target.read_text() + "# edited\n")  # control: every policy stays
        reload()
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.records
        target.write_text("")  # `: > gpu-defaults.yaml`
        reload()
    assert "gpu-defaults" not in {p.metadata.name for p in store.current.policies}
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning == "policies no longer in force: gpu-defaults (not in any policy file now)", warning
