"""Peak memory growth while iterating a whole epoch of 2.5e7 indices (n=2.5e7, W=1).

Each run is a fresh process (fastshard._bench.run_case) that reads its VmHWM after its imports
and after the epoch; the growth is in extra_info["peak_growth_MiB"]. The benchmark's own time is
that of the whole child process, start-up included; the epoch's time is extra_info["epoch_s"].

Core target: fastshard's growth is at most 64 MiB. torch is measured beside it for contrast.
"""

import pytest

from fastshard import _bench

N = 25_000_000
LIMIT = 64 * 2**20


@pytest.mark.parametrize("sampler", ["fastshard", "torch"])
def test_peak_memory_growth(benchmark, sampler):
    benchmark.group = "peak memory iterating an epoch of 2.5e7 indices"
    spec = {"sampler": sampler, "mode": "iter", "n": N, "world": 1, "rank": 0, "repeat": 1}
    result = benchmark.pedantic(
        _bench.run_case, args=(spec, 600, 6 * 2**30), rounds=1, iterations=1
    )
    assert result["ok"], result.get("error")
    assert result["length"] == result["count"] == N and not result["prefix"]
    assert result["baseline_bytes"] > 0 and result["peak_bytes"] >= result["baseline_bytes"]
    growth = result["growth_bytes"]
    benchmark.extra_info["peak_growth_MiB"] = round(growth / 2**20, 2)
    benchmark.extra_info["epoch_s"] = round(min(result["total_s"]), 3)
    if sampler == "fastshard":
        assert growth <= LIMIT, f"peak grew by {growth / 2**20:.1f} MiB"
    else:
        # torch holds the permutation (int64) and a list of Python ints: well over 8 bytes each.
        assert growth > 8 * N
