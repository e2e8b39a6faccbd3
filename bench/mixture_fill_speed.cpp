// MixtureSampler's fill beside the default order's, rank 0 of 8, n split 6:3:1 (issue 30). Build
// like bench/fill_speed.cpp; run under valgrind --tool=callgrind for instruction counts:
//   g++ -O2 -std=c++17 -Icsrc bench/mixture_fill_speed.cpp build/cp311-cp311-linux_x86_64/libfastshard_core.a -o /tmp/mix_speed -lpthread
//   /tmp/mix_speed N REPS
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>
#include <algorithm>
#include "fastshard/shard.hpp"
#include "fastshard/mixture.hpp"
using namespace fastshard;
int main(int argc, char** argv) {
    const std::uint64_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 100000000;
    const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
    std::uint64_t a = n * 6 / 10, b = n * 3 / 10, c = n - a - b;
    auto spec = std::make_shared<const MixtureSpec>(std::vector<std::uint64_t>{a, b, c}, std::vector<std::uint64_t>{5, 3, 2}, n, 0);
    Plan p = Plan::make(n, 8, 0, false, true, 0);
    auto mix = make_mixture_shard(p, spec, 0, 0);
    auto def = make_shard(p, Order::feistel, 0, 0);
    const std::uint64_t m = std::min<std::uint64_t>(p.num_samples, 2000000);
    std::vector<std::int64_t> out(m);
    std::vector<double> tm, td; std::int64_t sink = 0;
    for (int r = 0; r < reps; ++r) {
        auto t0 = std::chrono::steady_clock::now(); mix->fill(0, m, out.data()); sink += out[m-1];
        auto t1 = std::chrono::steady_clock::now(); def->fill(0, m, out.data()); sink += out[m-1];
        auto t2 = std::chrono::steady_clock::now();
        tm.push_back(std::chrono::duration<double>(t1 - t0).count()); td.push_back(std::chrono::duration<double>(t2 - t1).count());
    }
    std::vector<double> ratio; for (int r = 0; r < reps; ++r) ratio.push_back(tm[r] / td[r]);
    std::sort(tm.begin(), tm.end()); std::sort(td.begin(), td.end()); std::sort(ratio.begin(), ratio.end());
    std::printf("mix %.2f ns/draw, default %.2f ns/index (medians), ratio median %.2f [%.2f, %.2f] sink %lld\n", tm[reps/2]/m*1e9, td[reps/2]/m*1e9, ratio[reps/2], ratio[0], ratio[reps-1], (long long)sink);
}
