"""gpu-admission: a Kubernetes admission webhook policy engine for GPU workloads."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
