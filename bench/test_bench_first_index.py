"""Time to the first index: build the sampler, iter(), next().

Core target: fastshard at n=1e9 is >= 1000x faster than torch's DistributedSampler at n=1e7
(the groups "first index, n=1e9" and "first index, n=1e7").
"""

import pytest
import torch
from torch.utils.data import DistributedSampler as TorchSampler

import fastshard
from fastshard._sampler import ORDERS

W = 8


def sizes(*exps):
    return [pytest.param(10**e, id=f"1e{e}") for e in exps]


@pytest.mark.parametrize("n", sizes(6, 7, 8, 9))
def test_fastshard(benchmark, n):
    benchmark.group = f"first index, n=1e{len(str(n)) - 1}"

    def first():
        return next(iter(fastshard.DistributedSampler(n, num_replicas=W, rank=0)))

    got = benchmark(first)
    # The bulk fill is a separate code path from the iterator's.
    assert got == fastshard.DistributedSampler(n, num_replicas=W, rank=0).indices(0, 1)[0]


@pytest.mark.skipif("torch" not in ORDERS, reason="this fastshard has no order='torch'")
@pytest.mark.parametrize("n", sizes(5, 6, 7))
def test_fastshard_torch_order(benchmark, n):
    benchmark.group = f"first index, n=1e{len(str(n)) - 1}"

    def first():
        sampler = fastshard.DistributedSampler(n, num_replicas=W, rank=0, order="torch")
        return next(iter(sampler))

    got = benchmark.pedantic(first, rounds=3 if n >= 10**7 else 10, iterations=1)
    assert got == torch.randperm(n, generator=torch.Generator().manual_seed(0))[0].item()


@pytest.mark.parametrize("n", sizes(5, 6, 7))
def test_torch(benchmark, n):
    benchmark.group = f"first index, n=1e{len(str(n)) - 1}"

    def first():
        return next(iter(TorchSampler(range(n), num_replicas=W, rank=0, seed=0)))

    got = benchmark.pedantic(first, rounds=3 if n >= 10**7 else 10, iterations=1)
    # torch's rank 0 starts with the first item of randperm(n) under manual_seed(seed + epoch).
    assert got == torch.randperm(n, generator=torch.Generator().manual_seed(0))[0].item()
