// The torch order's shuffle alone, in C++: fastshard::torch_randperm against the plain loop
// torch.randperm runs (std::mt19937, one draw, one division and one swap per step), both on
// 32-bit items, CPU time of the calling thread (robust to other load on the machine), a
// fresh buffer each run; and TorchShard, the sampler's path (with its own buffer). Build and
// run from the repository root:
//
//   g++ -O3 -std=c++17 -Icsrc -o /tmp/tos bench/investigations/torch_order_shuffle.cpp csrc/fastshard/torch_order.cpp
//   /tmp/tos 20000000 100000000
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "fastshard/torch_order.hpp"

namespace {

double cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

void plain_fisher_yates(std::uint32_t* r, std::uint32_t n, std::uint32_t seed) {
    std::mt19937 g(seed);
    for (std::uint32_t i = 0; i < n; ++i) r[i] = i;
    for (std::uint32_t i = 0; i + 1 < n; ++i) std::swap(r[i], r[i + g() % (n - i)]);
}

template <class F>
void report(const char* name, std::uint32_t n, int runs, F shuffle) {
    std::vector<double> t;
    for (int k = 0; k < runs; ++k) {
        const double c = cpu_seconds();
        std::unique_ptr<std::uint32_t[]> r(new std::uint32_t[n]);
        shuffle(r.get(), static_cast<std::uint32_t>(k));
        t.push_back(cpu_seconds() - c);
    }
    std::sort(t.begin(), t.end());
    std::printf("n=%u %-22s CPU s: min %.3f median %.3f max %.3f (%.1f ns/item)\n", n, name, t[0],
                t[t.size() / 2], t.back(), 1e9 * t[0] / n);
}

}  // namespace

int main(int argc, char** argv) {
    // Same permutation from both, or the timings mean nothing.
    {
        const std::uint32_t n = 1000003;
        std::vector<std::uint32_t> a(n), b(n);
        plain_fisher_yates(a.data(), n, 7);
        fastshard::torch_randperm(b.data(), n, 7);
        if (a != b) {
            std::puts("MISMATCH");
            return 1;
        }
    }
    for (int i = 1; i < argc; ++i) {
        const auto n = static_cast<std::uint32_t>(std::strtoul(argv[i], nullptr, 10));
        if (n >= fastshard::kTorchInsideOutFrom) {
            std::printf("n=%u: only Fisher-Yates sizes (< %llu)\n", n,
                        static_cast<unsigned long long>(fastshard::kTorchInsideOutFrom));
            continue;
        }
        report("plain loop", n, 3,
               [n](std::uint32_t* r, std::uint32_t s) { plain_fisher_yates(r, n, s); });
        // torch_randperm allocates nothing itself; the buffer is new[]'d here like the plain
        // loop's, so huge pages do not apply: see fastshard_sampler in bench/torch_order.py.
        report("fastshard (4K pages)", n, 7,
               [n](std::uint32_t* r, std::uint32_t s) { fastshard::torch_randperm(r, n, s); });
        // The sampler's path: its own huge-page buffer, then rank 0 of 8 kept.
        report("fastshard TorchShard/8", n, 7, [n](std::uint32_t*, std::uint32_t s) {
            fastshard::TorchShard shard(fastshard::Plan::make(n, 8, 0, false, true), s);
        });
    }
}
