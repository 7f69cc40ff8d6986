"""Report: what the CUDA check knows about the corpus's GPU images, offline.

Audits ``../shared/corpus/manifests/`` against ``examples/cluster/`` with the
shipped policies, as ``gpu-admission audit`` does, and counts the
``cudaDriver`` findings by kind: "no CUDA version known", an image reference
that is a template placeholder, a CUDA outside the driver table. Prints the
unknown images, so a new table row can be sourced for the widely used ones.

    .venv/bin/python bench/cuda_images.py          # or: make bench-cuda-images
"""

from __future__ import annotations

import collections
import re
import sys
from pathlib import Path

from webhook.audit import inputs, snapshot
from webhook.audit.judge import judge
from webhook.policy import loader

REPO = Path(__file__).resolve().parents[1]
MANIFESTS = REPO.parent / "shared/corpus/manifests"
CLUSTER = REPO / "examples/cluster"
UNKNOWN = "no CUDA version known for its image"
PLACEHOLDER = "not a valid image reference"
_IMAGE = re.compile(r"\(image (.*)\); set annotation ")


def cuda_findings() -> dict[str, list[str]]:
    """cudaDriver finding kind → the image of each finding (or its message)."""
    policies = loader.load_directory(REPO / "policies")
    view = snapshot.load(sorted(CLUSTER.glob("*.yaml")))
    found: dict[str, list[str]] = collections.defaultdict(list)
    for document in inputs.stream(inputs.find_files([str(MANIFESTS)])):
        if not isinstance(document, inputs.Document):
            continue
        result = judge(policies, view, document)
        for finding in result.findings if result is not None else ():
            if finding.rule != "cudaDriver":
                continue
            image = _IMAGE.search(finding.message)
            kind = UNKNOWN if UNKNOWN in finding.message else PLACEHOLDER if PLACEHOLDER in finding.message else "other"
            found[kind].append(image[1] if image else finding.message)
    return found


def main() -> int:
    found = cuda_findings()
    for kind in (UNKNOWN, PLACEHOLDER, "other"):
        print(f"{len(found[kind]):3d}  {kind}")
    print("\nunknown images:")
    for image, count in collections.Counter(found[UNKNOWN]).most_common():
        print(f"{count:3d}  {image}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
