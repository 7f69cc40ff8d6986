"""What the CUDA check knows about the corpus's GPU images, offline (bench/cuda_images.py).

Issue #17 measured 38 "no CUDA version known" findings auditing the corpus
against examples/cluster. The images left unknown are private builds, ``latest``
tags that move, and images whose CUDA no public source states per release;
the registry resolver reads those from the image itself. The bound below is a
ratchet: lower it when a sourced row lands.
"""

from __future__ import annotations

import subprocess
import sys
from fnmatch import fnmatchcase
from pathlib import Path

from webhook.gpu import image_table
from webhook.gpu.images import ImageRef

REPO = Path(__file__).resolve().parents[1]
UNKNOWN_AT_MOST = 8


def _report() -> tuple[dict[str, int], dict[str, int]]:
    """(finding kind → count, unknown image → count), as bench/cuda_images.py prints them."""
    out = subprocess.run([sys.executable, "bench/cuda_images.py"], cwd=REPO, capture_output=True, text=True,
                         timeout=600, check=True).stdout
    head, _, tail = out.partition("unknown images:")
    return _counts(head), _counts(tail)


def _counts(text: str) -> dict[str, int]:
    pairs = (line.strip().partition("  ") for line in text.splitlines() if line.strip())
    return {what.strip(): int(count) for count, _, what in pairs}


def test_unknown_cuda_findings_are_few_and_none_is_an_image_without_cuda() -> None:
    kinds, unknown = _report()
    assert kinds["no CUDA version known for its image"] <= UNKNOWN_AT_MOST, unknown
    assert kinds["no CUDA version known for its image"] == sum(unknown.values())
    for image in unknown:
        name = ImageRef.parse(image).name
        assert not any(fnmatchcase(name, p) for p in image_table.NO_CUDA), image
        assert not name.startswith(("docker.io/library/ubuntu", "docker.io/library/busybox")), image
    # "FILLED BY THE OPERATOR", ${IMAGE_URI}, gcr.io/<your_project>/…: said for what they are
    assert kinds["not a valid image reference"] == 4
