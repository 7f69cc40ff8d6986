"""The real kube-scheduler and kube-controller-manager beside the suite's kube-apiserver (1.36.2).

Started for the placement tests only (tests/e2e/placement/), so that the
rest of the suite keeps a cluster where nothing schedules and no controller
acts. The scheduler has no ``default-scheduler`` profile, only the suite's
own (:data:`PACKING`, :data:`SPREADING`): it binds only pods that name one
of them in ``spec.schedulerName``. The controller-manager runs the
controllers that turn workloads into pods and claims (:data:`CONTROLLERS`),
never the node lifecycle controller (with no kubelet heartbeats it would
taint every node unreachable) nor the namespace controller.

Both run as apiserver.py's processes do: their own process group, a
parent-death signal, their logs in the run's folder, stopped at the end.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.apiserver import ADMIN_TOKEN, ApiServer, Unavailable, spawn, stop_process

#: NodeResourcesFit MostAllocated (GPU bin packing, GPUs weighed most), no system default spreading
PACKING = "e2e-packing"
#: the default scoring (LeastAllocated, PodTopologySpread's system defaults), GPUs weighed too
SPREADING = "e2e-spreading"
#: the only version whose scheduler and controller-manager install.sh ships
VERSION = "1.36.2"
CONTROLLERS = ("deployment-controller", "replicaset-controller", "job-controller", "daemonset-controller",
               "resourceclaim-controller", "garbage-collector-controller")
BINARIES = ("kube-scheduler", "kube-controller-manager")

#: what NodeResourcesFit scores, in both profiles: GPUs first, so one GPU decides between nodes
SCORED_RESOURCES = [{"name": "nvidia.com/gpu", "weight": 10}, {"name": "cpu", "weight": 1},
                    {"name": "memory", "weight": 1}]


def scheduler_configuration(kubeconfig: Path) -> dict[str, Any]:
    """A KubeSchedulerConfiguration with the suite's profiles and no default-scheduler."""
    def fit(strategy: str) -> dict[str, Any]:
        return {"name": "NodeResourcesFit",
                "args": {"scoringStrategy": {"type": strategy, "resources": SCORED_RESOURCES}}}

    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False},
        "clientConnection": {"kubeconfig": str(kubeconfig), "qps": 200, "burst": 400},
        # an unschedulable pod is tried again soon after the cluster changes (a relabelled node, a freed GPU)
        "podInitialBackoffSeconds": 1, "podMaxBackoffSeconds": 2,
        "profiles": [
            {"schedulerName": PACKING,
             # balanced allocation would pull towards the emptier node: packing means fullest first
             "plugins": {"score": {"disabled": [{"name": "NodeResourcesBalancedAllocation"}]}},
             "pluginConfig": [fit("MostAllocated"),
                              {"name": "PodTopologySpread",
                               "args": {"defaultingType": "List", "defaultConstraints": []}}]},
            {"schedulerName": SPREADING, "pluginConfig": [fit("LeastAllocated")]},
        ],
    }


def missing_binaries(folder: Path) -> list[str]:
    return [name for name in BINARIES if not (folder / name).is_file()]


@dataclass
class ControlPlane:
    """kube-scheduler and kube-controller-manager for ``apiserver``, in ``folder`` (config, logs)."""

    apiserver: ApiServer
    folder: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self) -> None:
        missing = missing_binaries(self.apiserver.assets.folder)
        if missing:
            raise Unavailable(f"{', '.join(missing)} missing beside kube-apiserver in {self.apiserver.assets.folder}")
        self.folder.mkdir(parents=True, exist_ok=True)
        kubeconfig = self.apiserver.kubeconfig(self.folder / "control-plane.kubeconfig", ADMIN_TOKEN)
        config = self.folder / "kube-scheduler.yaml"
        config.write_text(yaml.safe_dump(scheduler_configuration(kubeconfig)))
        assets = self.apiserver.assets.folder
        self.processes["kube-scheduler"] = spawn(
            [str(assets / "kube-scheduler"), f"--config={config}", "--secure-port=0", "-v=2"],
            self.folder / "kube-scheduler.log")
        self.processes["kube-controller-manager"] = spawn([
            str(assets / "kube-controller-manager"), f"--kubeconfig={kubeconfig}", "--leader-elect=false",
            "--secure-port=0", f"--controllers={','.join(CONTROLLERS)}",
            # a refused pod is retried soon: the tests wait for controllers to settle, not for back-off
            "--concurrent-deployment-syncs=5", "--concurrent-replicaset-syncs=5", "--concurrent-job-syncs=5",
            "-v=2",
        ], self.folder / "kube-controller-manager.log")
        self._wait_started()

    def _wait_started(self, timeout: float = 30.0) -> None:
        """Until both say they run their loops (their logs; neither serves a port here)."""
        marks = {"kube-scheduler": "Starting Kubernetes Scheduler",
                 "kube-controller-manager": "Controller starting..."}
        deadline = time.monotonic() + timeout
        pending = dict(marks)
        while pending:
            for name in list(pending):
                proc = self.processes[name]
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")
                if pending[name] in self._log(name):
                    del pending[name]
            if pending and time.monotonic() > deadline:
                raise RuntimeError(f"{', '.join(pending)} not started within {timeout:.0f}s:\n"
                                   + "\n".join(self.log_tail(n) for n in pending))
            time.sleep(0.2)

    def _log(self, name: str) -> str:
        path = self.folder / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def log_tail(self, name: str, lines: int = 30) -> str:
        return "\n".join(self._log(name).splitlines()[-lines:])

    def alive(self) -> dict[str, bool]:
        return {name: proc.poll() is None for name, proc in self.processes.items()}

    def stop(self) -> None:
        for proc in reversed(list(self.processes.values())):
            stop_process(proc)
        self.processes.clear()
