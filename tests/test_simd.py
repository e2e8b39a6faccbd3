"""Every copy of the Feistel kernel gives the same orders.

The network and the cycle walk's pooling are compiled for AVX-512F, AVX2 and the baseline, one
picked by cpuid at run time (csrc/fastshard/feistel.cpp). FASTSHARD_SIMD caps that choice, so one
machine can run each copy: here in fresh processes (the level is read once per process), over
orders that walk cycles (n just above powers of two), decrypt (PackedSampler's window sums) and
mix (MixtureSampler's two networks). On a CPU without AVX-512 two of the runs share a copy; off
x86-64 all three do, and the test still checks that the variable changes nothing it should not.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

DIGEST = r"""
import hashlib
import numpy as np
import fastshard

h = hashlib.sha256()
for n in (1025, 2049, 3000, 65536, 65537, 1_000_003, 4_194_305):
    for seed in (0, 7):
        s = fastshard.DistributedSampler(n, num_replicas=3, rank=1, seed=seed)
        s.set_epoch(seed)
        h.update(s.indices().tobytes())
lengths = (np.arange(300_007, dtype=np.uint64) * 7919 % 1000 + 1).astype(np.uint32)
for overlap in (False, True):
    p = fastshard.PackedSampler(lengths, 512, overlap=overlap, num_replicas=2, rank=1, seed=5)
    for i in range(0, len(p), 997):
        h.update(np.ascontiguousarray(p[i]).tobytes())
m = fastshard.MixtureSampler([70_001, 30_011, 5], [0.5, 0.3, 0.2], num_replicas=2, rank=0, seed=3)
h.update(m.indices(0, 200_000).tobytes())
print(h.hexdigest())
"""


def digest(simd: str | None) -> str:
    env = dict(os.environ)
    env.pop("FASTSHARD_SIMD", None)
    if simd is not None:
        env["FASTSHARD_SIMD"] = simd
    out = subprocess.run(
        [sys.executable, "-c", DIGEST],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tempfile.gettempdir(),  # never import fastshard from the source tree
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize("simd", ["baseline", "avx2"])
def test_kernel_copies_give_the_same_orders(simd: str) -> None:
    assert digest(simd) == digest(None)
