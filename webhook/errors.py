"""The one exception hierarchy of gpu-admission."""

from __future__ import annotations


class GpuAdmissionError(Exception):
    """Base of every error this package raises on purpose."""


class PolicyError(GpuAdmissionError):
    """A policy file or directory is invalid."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems) if problems else "invalid policy")


class ReviewError(GpuAdmissionError):
    """A request body is not a usable AdmissionReview (answered with HTTP 400)."""


class UnreadableReview(ReviewError):
    """A well-formed AdmissionReview whose object gpu-admission cannot read (nested past the JSON
    reader's depth): refused in an answer of its own, which kube-apiserver shows its client, where a
    400 would make it say only that calling the webhook failed."""

    def __init__(self, message: str, api_version: str, uid: str) -> None:
        super().__init__(message)
        self.api_version, self.uid = api_version, uid


class CertificateError(GpuAdmissionError):
    """Certificates could not be created, read or loaded."""


class ManifestError(GpuAdmissionError):
    """A manifest given to the audit could not be read."""


class ClusterError(GpuAdmissionError):
    """The cluster could not be reached or configured."""


class RequestBodyError(GpuAdmissionError):
    """A request body could not be read within the limits (answered with a 4xx status)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        super().__init__(message)


class RegistryError(GpuAdmissionError):
    """A container registry could not tell an image's config (unreachable, refused, malformed)."""


class SuiteError(GpuAdmissionError):
    """A GPUAdmissionTest file is broken: unreadable, invalid, or naming what is not there (exit 2)."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems) if problems else "invalid test file")
