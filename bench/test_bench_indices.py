"""A whole rank epoch as an int64 array: fastshard's indices() beside np.arange of the same
length (the cost of writing that many int64, the floor for any fill).

Core target at n=1e9, W=8 (group "rank epoch as an array, n=1e9"): indices() <= 4x np.arange.
"""

import numpy as np
import pytest

import fastshard

W = 8


def sizes(*exps):
    return [pytest.param(10**e, id=f"1e{e}") for e in exps]


def rounds(n):
    return {"rounds": 3, "iterations": 1} if n >= 10**9 else {"rounds": 5, "iterations": 1}


@pytest.mark.parametrize("n", sizes(6, 7, 8, 9))
def test_fastshard_indices(benchmark, n, check_rank_array):
    benchmark.group = f"rank epoch as an array, n=1e{len(str(n)) - 1}"
    sampler = fastshard.DistributedSampler(n, num_replicas=W, rank=0)
    benchmark.extra_info["threads"] = fastshard.get_num_threads()
    a = benchmark.pedantic(sampler.indices, **rounds(n))
    check_rank_array(a, n, W, 0)


@pytest.mark.parametrize("n", sizes(6, 7, 8, 9))
def test_numpy_arange(benchmark, n):
    benchmark.group = f"rank epoch as an array, n=1e{len(str(n)) - 1}"
    a = benchmark.pedantic(np.arange, args=(n // W,), kwargs={"dtype": np.int64}, **rounds(n))
    assert a.dtype == np.int64 and len(a) == n // W and a[-1] == n // W - 1


def test_whole_epoch_is_a_permutation_across_ranks(benchmark):
    """At n=1e6, all W ranks' arrays together are exactly [0, n)."""
    n = 10**6
    benchmark.group = "rank epoch as an array, n=1e6"
    samplers = [fastshard.DistributedSampler(n, num_replicas=W, rank=r) for r in range(W)]

    def all_ranks():
        return [s.indices() for s in samplers]

    parts = benchmark(all_ranks)
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(n))
