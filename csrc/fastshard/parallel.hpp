// Splitting a range over threads.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

namespace fastshard {

// Threads used when a caller passes 0 (default: all cores; see shard.cpp).
unsigned default_threads() noexcept;
void set_default_threads(unsigned threads) noexcept;

// Calls fn(part, begin, length) for up to `threads` contiguous parts of [0, count), each of at
// least `min_per_thread` items, part 0 on the calling thread (and any part no thread could be
// started for). Returns the number of parts. An exception from any part, on any thread, is
// caught there; every thread is joined, then the exception of the lowest part that threw is
// rethrown on the calling thread (never std::terminate: fn may allocate, and a bad_alloc must
// reach the caller as an error it can report).
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
    // One slot per part, each written by its own thread only; read after the joins.
    std::vector<std::exception_ptr> errors(t);
    auto part = [&fn, &errors, per, count, t](unsigned i) noexcept {
        try {
            const std::uint64_t begin = i * per;
            fn(i, begin, i + 1 == t ? count - begin : per);
        } catch (...) {
            errors[i] = std::current_exception();
        }
    };
    std::vector<std::thread> pool;
    unsigned started = 1;
    try {
        pool.reserve(t - 1);
        for (; started < t; ++started) pool.emplace_back(part, started);
    } catch (const std::exception&) {
        // Out of threads (or memory for them): the calling thread does the parts left over,
        // rather than letting the exception destroy joinable threads (std::terminate).
    }
    part(0);
    for (unsigned i = started; i < t; ++i) part(i);
    for (auto& th : pool) th.join();
    for (const auto& e : errors)
        if (e) std::rethrow_exception(e);
    return t;
}

// Calls start(part) once for each of up to `threads` parts, then fn(part, begin, length) for
// chunks of `chunk` items of [0, count) (the last one shorter), which the parts claim one at a
// time, in increasing order, as they finish the one before: a part that another process slows
// down takes fewer chunks, instead of the others waiting for it at the end. The chunks a part
// gets come to it in increasing order. Returns the number of parts; exceptions as parallel_for.
template <class Start, class Fn>
unsigned parallel_chunks(std::uint64_t count, unsigned threads, std::uint64_t chunk, Start&& start, Fn&& fn) {
    if (chunk == 0) chunk = 1;
    const std::uint64_t chunks = count / chunk + (count % chunk != 0 ? 1 : 0);
    std::atomic<std::uint64_t> next{0};
    return parallel_for(chunks, threads, 1, [&](unsigned part, std::uint64_t, std::uint64_t) {
        start(part);
        for (std::uint64_t c = next.fetch_add(1, std::memory_order_relaxed); c < chunks;
             c = next.fetch_add(1, std::memory_order_relaxed))
            fn(part, c * chunk, std::min(chunk, count - c * chunk));
    });
}

}  // namespace fastshard
