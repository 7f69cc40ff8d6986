"""MIG profiles: which ``nvidia.com/mig-<profile>`` resource names name a real device.

Source: FACTS.md §3 (NVIDIA MIG user guide, supported profiles). Under the
mixed strategy the device plugin advertises one resource per profile and
spells ``+me`` (media extensions) as ``.me``.
"""

from __future__ import annotations

import re

MIG_PREFIX = "nvidia.com/mig-"

#: GPU → its profiles with the most instances of each that fit on one GPU.
PROFILES: dict[str, dict[str, int]] = {
    "A100-40GB": {
        "1g.5gb": 7, "1g.5gb+me": 1, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1,
    },
    "A100-80GB, H100-80GB": {
        "1g.10gb": 7, "1g.10gb+me": 1, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1,
    },
    "H100-94GB / H100 NVL": {
        "1g.12gb": 7, "1g.12gb+me": 1, "1g.24gb": 4, "2g.24gb": 3, "3g.47gb": 2, "4g.47gb": 1, "7g.94gb": 1,
    },
    "H200-141GB": {
        "1g.18gb": 7, "1g.18gb+me": 1, "1g.35gb": 4, "2g.35gb": 3, "3g.71gb": 2, "4g.71gb": 1, "7g.141gb": 1,
    },
    # Beyond FACTS.md §3, from NVIDIA's MIG user guide (Supported MIG Profiles) and the
    # device-plugin resource lists of B200/B300 and RTX PRO 6000 systems
    "A30-24GB": {"1g.6gb": 4, "1g.6gb+me": 1, "2g.12gb": 2, "2g.12gb+me": 1, "4g.24gb": 1},
    "B200-180GB": {"1g.23gb": 7, "1g.45gb": 4, "2g.45gb": 3, "3g.90gb": 2, "4g.90gb": 1, "7g.180gb": 1},
    "B300-288GB": {"1g.34gb": 7, "1g.67gb": 4, "2g.67gb": 3, "3g.135gb": 2, "4g.135gb": 1, "7g.269gb": 1},
    "RTX-PRO-6000-96GB": {"1g.24gb": 4, "2g.48gb": 2, "4g.96gb": 1},
}

#: the shape of every profile name: <slices>g.<memory>gb, optionally .me
_WELL_FORMED = re.compile(r"^[1-8]g\.[0-9]+gb(\.me)?$")


#: what a policy's allowlist may name: the profile names NVIDIA's tools spell beyond the resources'
#: (compute instances "1c.2g.10gb", "+me.all", "+gfx"), each <slices>g.<memory>gb at its core
_PROFILE_LIKE = re.compile(r"^([0-9]+c\.)?[1-8]g\.[0-9]+gb([.+][a-z]+)*$")


def profile_like(profile: str) -> bool:
    """Spelt as some MIG profile NVIDIA names, at least (a policy's allowlist: ``1g.10gbb`` is none)."""
    return bool(_PROFILE_LIKE.match(profile))


def well_formed(profile: str) -> bool:
    """Spelt like a MIG profile, known or not (new GPUs bring new profiles)."""
    return bool(_WELL_FORMED.match(profile))


def resource_profile(profile: str) -> str:
    """The profile as the resource name spells it: ``1g.10gb+me`` → ``1g.10gb.me``."""
    return profile.replace("+me", ".me")


def valid_profiles() -> frozenset[str]:
    """Every known profile, spelt as in resource names."""
    return frozenset(resource_profile(p) for gpu in PROFILES.values() for p in gpu)


def profile_of(resource: str) -> str | None:
    """``nvidia.com/mig-1g.10gb`` → ``1g.10gb``; None for other resources."""
    if not resource.startswith(MIG_PREFIX):
        return None
    return resource[len(MIG_PREFIX):]
