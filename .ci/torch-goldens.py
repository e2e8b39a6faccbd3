"""Record the golden vectors of tests/test_torch_versions.py from a real torch.

    python .ci/torch-goldens.py > goldens-<torch version>.json

Needs only torch and numpy (not fastshard). For each case it shuffles exactly as
torch.utils.data.distributed.DistributedSampler does (a generator seeded with seed + epoch, then
torch.randperm(n, generator=g)) and keeps rank 0 of W = 8, positions 0, 8, 16, ... of the padded
epoch; it prints the first and last HEAD of them and the SHA-256 of all of them as little-endian
int64. torch's sampler itself would turn the permutation into a list of Python ints (tens of GB
at these n), so the permutation is taken from randperm directly: the same values.
Each case needs about 8 bytes per item (1.7-2 GB) and 20-90 s of CPU.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time

import numpy as np
import torch

N = (214_748_364, 250_000_001)  # torch's switch (UINT32_MAX // 20) and one larger n
SEEDS = (0, 12345)
W, RANK, HEAD = 8, 0, 64


def rank_share(n: int, seed: int) -> np.ndarray:
    g = torch.Generator()
    g.manual_seed(seed)
    perm = torch.randperm(n, generator=g).numpy()
    total = -(-n // W) * W
    return perm[np.arange(RANK, total, W) % n]


cases = []
for n in N:
    for seed in SEEDS:
        t0 = time.perf_counter()
        share = rank_share(n, seed)
        digest = hashlib.sha256(share.astype("<i8").tobytes()).hexdigest()
        cases.append(
            {
                "n": n,
                "seed": seed,
                "head": share[:HEAD].tolist(),
                "tail": share[-HEAD:].tolist(),
                "sha256": digest,
            }
        )
        print(f"n={n} seed={seed}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        del share
json.dump(
    {"torch": torch.__version__, "numpy": np.__version__, "W": W, "rank": RANK, "cases": cases},
    sys.stdout,
)
print()
