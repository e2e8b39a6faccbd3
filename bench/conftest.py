"""fastshard's pytest-benchmark suite (not part of the default test run).

Run it from the repository root, against the installed package, with::

    pip install --no-build-isolation ".[bench]"
    pytest bench/ --benchmark-only

(`pytest`, not `python -m pytest`: the latter puts the source tree, which has no compiled
``_core``, first on sys.path.) Benchmarks are grouped by what they measure and n; sizes are
geometric; every benchmark checks the result it timed. Rank 0 of W=8 unless a name says otherwise.
Test modules cannot import this file (--import-mode=importlib), so helpers come as fixtures.
"""

import numpy as np
import pytest

import fastshard


def _check_rank_array(a, n, world, rank):
    """`a` is rank `rank`'s epoch of fastshard's default order: right length and values.

    Values are checked against random access (a separate code path) at 1000 random positions,
    and for distinctness over the whole array up to 2e7 items (else over its first 1e7).
    """
    sampler = fastshard.DistributedSampler(n, num_replicas=world, rank=rank)
    assert a.dtype == np.int64 and a.shape == (len(sampler),)
    assert a.min() >= 0 and a.max() < n
    ks = np.random.default_rng(n).integers(0, len(a), size=1000)
    assert all(a[k] == sampler[int(k)] for k in ks)
    head = a if len(a) <= 2 * 10**7 else a[: 10**7]
    assert len(np.unique(head)) == len(head)  # n % W == 0 here, so rank 0 has no padding


@pytest.fixture
def check_rank_array():
    return _check_rank_array
