"""MixtureSampler.indices() beside the default order's, per draw, in one process (issue 30).

n = 1e8 split 6:3:1 at weights 0.5, 0.3, 0.2, rank 0 of W = 8, one thread, 2e6 draws a
round, the two sides alternating for 15 rounds; prints medians and the per-round ratio.

    python bench/mixture_gap.py
"""

import gc
import statistics
import time

import fastshard

N, W, M, ROUNDS = 10**8, 8, 2_000_000, 15


def main() -> None:
    fastshard.set_num_threads(1)
    sizes = [N * 6 // 10, N * 3 // 10, N - N * 6 // 10 - N * 3 // 10]
    mix = fastshard.MixtureSampler(sizes, weights=[0.5, 0.3, 0.2], num_replicas=W, rank=0)
    default = fastshard.DistributedSampler(N, num_replicas=W, rank=0)
    times: dict[str, list[float]] = {"mix": [], "default": []}
    gc.disable()
    for r in range(ROUNDS):
        for k in ("mix", "default") if r % 2 == 0 else ("default", "mix"):
            sampler = mix if k == "mix" else default
            t0 = time.perf_counter()
            sampler.indices(0, M)
            times[k].append(time.perf_counter() - t0)
    ratios = [a / b for a, b in zip(times["mix"], times["default"])]
    print(
        f"mixture {statistics.median(times['mix']) / M * 1e9:.2f} ns/draw, default "
        f"{statistics.median(times['default']) / M * 1e9:.2f} ns/index; ratio median "
        f"{statistics.median(ratios):.2f} [{min(ratios):.2f}, {max(ratios):.2f}]"
    )


if __name__ == "__main__":
    main()
