// Shard::fill of rank 0 of 8 in pieces of the iterator's buffer, timed (issue 30). Build beside a
// pip build (the static core library), e.g.:
//   g++ -O2 -std=c++17 -Icsrc bench/fill_speed.cpp build/cp311-cp311-linux_x86_64/libfastshard_core.a -o /tmp/fill_speed -lpthread
//   /tmp/fill_speed N BUFFER REPS [IDENTITY]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include "fastshard/shard.hpp"
using namespace fastshard;
int main(int argc, char** argv) {
    const std::uint64_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 10000000;
    const std::uint64_t buf = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 256;
    const int reps = argc > 3 ? std::atoi(argv[3]) : 5;
    const int ident = argc > 4 ? std::atoi(argv[4]) : 0;
    Plan p = Plan::make(n, 8, 0, false, true, 0);
    auto s = make_shard(p, ident ? Order::identity : Order::feistel, 0, 0);
    std::vector<std::int64_t> b(buf);
    std::vector<double> ts; std::int64_t sink = 0;
    for (int r = 0; r < reps; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        for (std::uint64_t k = 0; k < p.num_samples; k += buf) {
            std::uint64_t c = std::min<std::uint64_t>(buf, p.num_samples - k);
            s->fill(k, c, b.data()); sink += b[0];
        }
        ts.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ts.begin(), ts.end());
    std::printf("n=%llu buf=%llu ident=%d: median %.2f ns/item min %.2f (sink %lld)\n", (unsigned long long)n,
                (unsigned long long)buf, ident, ts[ts.size()/2] / p.num_samples * 1e9, ts[0] / p.num_samples * 1e9, (long long)sink);
}
