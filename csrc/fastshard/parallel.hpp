// Splitting a range over threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace fastshard {

// Threads used when a caller passes 0 (default: all cores; see shard.cpp).
unsigned default_threads() noexcept;
void set_default_threads(unsigned threads) noexcept;

// Calls fn(part, begin, length) for up to `threads` contiguous parts of [0, count), each of at
// least `min_per_thread` items, part 0 on the calling thread. Returns the number of parts.
template <class Fn>
unsigned parallel_for(std::uint64_t count, unsigned threads, std::uint64_t min_per_thread, Fn&& fn) {
    if (threads == 0) threads = default_threads();
    const std::uint64_t by_size = count / (min_per_thread == 0 ? 1 : min_per_thread);
    const unsigned t = static_cast<unsigned>(std::max<std::uint64_t>(1, std::min<std::uint64_t>(threads, by_size)));
    if (t == 1) {
        fn(0U, std::uint64_t{0}, count);
        return 1;
    }
    const std::uint64_t per = count / t;
    std::vector<std::thread> pool;
    pool.reserve(t - 1);
    for (unsigned i = 1; i < t; ++i) {
        const std::uint64_t begin = i * per;
        const std::uint64_t len = i + 1 == t ? count - begin : per;
        pool.emplace_back([&fn, i, begin, len] { fn(i, begin, len); });
    }
    fn(0U, std::uint64_t{0}, per);
    for (auto& th : pool) th.join();
    return t;
}

}  // namespace fastshard
