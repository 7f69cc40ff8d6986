"""The overlays docs/deploy.md tells operators to write (client certificates for the server, the control
plane's CIDR in the network policy), built by kubectl's real kustomize against deploy/ as it is: what
they produce is what the server and the docs expect."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from deploy_tree import DEPLOY, REPO
from test_kustomize import _kubectl
from webhook import certs
from webhook.cli import _parser

DOCS = (REPO / "docs" / "deploy.md").read_text("utf-8")


def _overlay(tmp_path: Path, *, starts: str, holding: str = "") -> Path:
    """The one docs' YAML block that starts with ``# <starts>`` (and holds ``holding``), written where its
    relative paths reach deploy/."""
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", DOCS, re.S) if b.startswith(f"# {starts}\n") and holding in b]
    assert len(blocks) == 1, f"docs/deploy.md has {len(blocks)} such blocks starting with # {starts}"
    (tmp_path / "deploy").symlink_to(DEPLOY)  # (the overlays refer to ../../../deploy/…)
    folder = tmp_path / Path(starts).parent
    folder.mkdir(parents=True)
    (folder / "kustomization.yaml").write_text(blocks[0])
    return folder


def _build(folder: Path) -> dict[tuple[str, str], dict[str, Any]]:
    built = subprocess.run([_kubectl(), "kustomize", str(folder)], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    return {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(built.stdout) if o}


def test_the_client_certificate_overlay_gives_the_server_the_ca_and_the_names(tmp_path: Path) -> None:
    folder = _overlay(tmp_path, starts="clusters/prod/gpu-admission/kustomization.yaml", holding="--client-ca")
    ca = certs.generate_ca("webhook client CA")
    (folder / "webhook-client-ca.crt").write_bytes(ca.cert_pem)
    objects = _build(folder)
    pod = objects[("Deployment", "gpu-admission")]["spec"]["template"]["spec"]
    server = pod["containers"][0]
    args = _parser().parse_args(["serve", *server["args"]])  # the flags `serve` takes, as the image runs it
    assert args.client_ca == Path("/etc/gpu-admission/client-ca/ca.crt") and args.client_name
    assert args.metrics_port == 9090  # the probes need the plain port: the TLS port now wants a certificate
    assert all(server[p]["httpGet"]["port"] == "metrics" for p in ("startupProbe", "livenessProbe", "readinessProbe"))
    (mount,) = [m for m in server["volumeMounts"] if m["mountPath"] == str(args.client_ca.parent)]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    config_map = objects[("ConfigMap", volume["configMap"]["name"])]
    assert config_map["data"][args.client_ca.name] == ca.cert_pem.decode()


def test_the_network_policy_overlay_sets_the_control_planes_cidr(tmp_path: Path) -> None:
    folder = _overlay(tmp_path, starts="clusters/prod/gpu-admission-network/kustomization.yaml")
    policy = _build(folder)[("NetworkPolicy", "gpu-admission")]
    assert policy["spec"]["ingress"][0]["from"] == [{"ipBlock": {"cidr": "10.0.0.0/28"}}]
    assert policy["spec"]["ingress"][0]["ports"] == [{"port": 8443, "protocol": "TCP"}]
