"""Which shuffle torch.randperm uses from n = 214,748,364 on, read from torch's version.

Below that length every torch since 1.x shuffles with Fisher-Yates over 32-bit mt19937 draws.
From it on, torch 2.6 switched to the inside-out shuffle over 64-bit draws (pytorch #143682,
landed on main as #143875 and in release/2.6 as #144735); torch <= 2.5 keeps Fisher-Yates.
order="torch" must pick the one the installed torch uses, or it silently gives another order
than torch's sampler for large datasets.

How a version is read (PEP 440 segments): the release number decides; a local segment
(``+cu124``, ``+cpu``, ``+git1a2b3c``) is ignored; a pre-release or development release
(``2.6.0a0``, ``2.6.0rc1``, ``2.6.0.dev20241201``) is read as the release before it, because
such builds (nightlies, NVIDIA's containers) are cut from main before the release's last
changes. The environment variable ``FASTSHARD_TORCH_SHUFFLE`` (``fisher_yates`` or
``inside_out``) overrides the choice for a build that this rule reads wrongly.
"""

from __future__ import annotations

import os
import re

# UINT32_MAX // 20: torch's own threshold, in every version that has the second shuffle.
INSIDE_OUT_FROM = 214_748_364
INSIDE_OUT_SINCE = (2, 6)
ENV = "FASTSHARD_TORCH_SHUFFLE"
SHUFFLES = ("fisher_yates", "inside_out")

_VERSION = re.compile(
    r"""\s*v?(?P<major>\d+)\.(?P<minor>\d+)(?:\.\d+)*   # release
    (?P<pre>[-_.]?(?:a|b|c|rc|alpha|beta|pre|preview)[-_.]?\d*)?
    (?P<post>[-_.]?(?:post|rev|r)[-_.]?\d*)?
    (?P<dev>[-_.]?dev[-_.]?\d*)?
    (?:\+[a-z0-9._-]*)?\s*$""",
    re.VERBOSE | re.IGNORECASE,
)


def release(version: str) -> tuple[int, int, bool]:
    """(major, minor, final) of a torch version string; ``final`` is False for a pre-release or
    development release. ValueError for a string that is not a PEP 440 version."""
    m = _VERSION.match(str(version))
    if m is None:
        raise ValueError(f"cannot read torch version {version!r}")
    return int(m["major"]), int(m["minor"]), not (m["pre"] or m["dev"])


def shuffle_for(version: str) -> str:
    """``"fisher_yates"`` or ``"inside_out"``: the shuffle torch ``version`` uses for
    ``n >= INSIDE_OUT_FROM`` (see the module's docstring for pre-releases and local builds)."""
    major, minor, final = release(version)
    since = (major, minor) >= INSIDE_OUT_SINCE
    if (major, minor) == INSIDE_OUT_SINCE and not final:
        since = False  # 2.6.0a0, 2.6.0rc1, 2.6.0.devYYYYMMDD: read as 2.5
    return "inside_out" if since else "fisher_yates"


def installed_shuffle() -> str:
    """The shuffle the installed torch uses for large n, or the override in ``ENV``."""
    override = os.environ.get(ENV)
    if override:
        if override not in SHUFFLES:
            raise ValueError(f"{ENV} must be 'fisher_yates' or 'inside_out', got {override!r}")
        return override
    import torch

    return shuffle_for(torch.__version__)


def shard_argument() -> str:
    """``_core.Shard``'s ``torch_shuffle`` for the installed torch: ``"auto"`` (torch >= 2.6:
    Fisher-Yates below ``INSIDE_OUT_FROM``, inside-out from it) or ``"fisher_yates"`` (torch <=
    2.5: at every n)."""
    return "auto" if installed_shuffle() == "inside_out" else "fisher_yates"
