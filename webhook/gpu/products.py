"""Whether a GPU product is a data-center GPU, read from the GPU Feature Discovery label.

CUDA forward compatibility works only on NVIDIA data-center GPUs (NVIDIA CUDA
Compatibility guide, "Forward Compatibility"); consumer (GeForce, TITAN) and
workstation (Quadro, RTX A-series, RTX Ada/PRO) GPUs fail with error 804.
GFD writes ``nvidia.com/gpu.product`` from the NVML name with spaces as
dashes (``NVIDIA-H100-80GB-HBM3``, ``Tesla-T4``), appending ``-MIG-<profile>``
under MIG and ``-SHARED`` under sharing (FACTS.md §2).

The data-center models below are NVIDIA's data-center lines (Tesla K/M/P/V/T,
A, H, L, B, GH/GB): every product whose NVML name starts with ``Tesla``, or
whose model token is one of them. Anything else (unknown included) is not
assumed to be a data-center GPU; a policy adds products with
``forwardCompat.dataCenterProducts``.
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase
from functools import lru_cache

#: the label GFD sets
PRODUCT_LABEL = "nvidia.com/gpu.product"


def label_value(name: str) -> str:
    """A GPU's NVML product name (as DRA drivers publish it: "NVIDIA A100-SXM4-80GB") as GFD writes it in its label."""
    return name.replace(" ", "-")


#: model tokens of NVIDIA data-center GPUs, as they appear in GFD product names
DATA_CENTER_MODELS = frozenset({
    "K10", "K20", "K20m", "K20X", "K40", "K40m", "K80", "M4", "M6", "M10", "M40", "M60",
    "P4", "P6", "P40", "P100", "V100", "V100S", "T4", "T4G",
    "A2", "A10", "A10G", "A10M", "A16", "A30", "A40", "A100", "A800", "A100X", "A30X",
    "H20", "H100", "H800", "H200", "H100L", "H100NVL", "GH200",
    "L4", "L20", "L40", "L40S", "L40G",
    "B100", "B200", "B300", "GB200", "GB300",
})

_CONSUMER_OR_WORKSTATION = re.compile(r"(?i)(^|-)(geforce|titan|quadro|rtx)(-|$)")


@lru_cache(maxsize=1024)  # asked per node group on every GPU admission; products are few
def is_data_center(product: str, extra: tuple[str, ...] = ()) -> bool:
    """True for a data-center GPU product such as ``NVIDIA-A100-SXM4-80GB-MIG-1g.10gb``."""
    if not product:
        return False
    if any(fnmatchcase(product, pattern) for pattern in extra):
        return True
    if _CONSUMER_OR_WORKSTATION.search(product):
        return False
    tokens = product.split("-")
    return tokens[0] == "Tesla" or any(token in DATA_CENTER_MODELS for token in tokens[:3])
