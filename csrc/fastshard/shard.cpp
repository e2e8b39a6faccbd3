#include "fastshard/shard.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>
#include <vector>

#include "fastshard/mix.hpp"

namespace fastshard {

namespace {

unsigned hardware_threads() noexcept {
    const unsigned h = std::thread::hardware_concurrency();
    return h == 0 ? 1 : h;
}

std::atomic<unsigned>& threads_setting() noexcept {
    static std::atomic<unsigned> value{hardware_threads()};
    return value;
}

// Below this many items per thread, starting a thread costs more than it saves.
constexpr std::uint64_t kMinPerThread = std::uint64_t{1} << 16;

}  // namespace

unsigned default_threads() noexcept { return threads_setting().load(); }

void set_default_threads(unsigned threads) noexcept {
    threads_setting().store(threads == 0 ? hardware_threads() : threads);
}

void Shard::fill_parallel(std::uint64_t k0, std::uint64_t count, std::int64_t* out,
                          unsigned threads) const {
    if (threads == 0) threads = default_threads();
    const std::uint64_t by_size = count / kMinPerThread;
    const unsigned t = static_cast<unsigned>(std::min<std::uint64_t>(threads, by_size));
    if (t <= 1) {
        fill_range(k0, count, out);
        return;
    }
    const std::uint64_t per = count / t;
    auto part = [&](unsigned i) {
        const std::uint64_t begin = i * per;
        const std::uint64_t len = i + 1 == t ? count - begin : per;
        fill_range(k0 + begin, len, out + begin);
    };
    std::vector<std::thread> pool;
    unsigned started = 1;
    try {
        pool.reserve(t - 1);
        for (; started < t; ++started) pool.emplace_back(part, started);
    } catch (const std::exception&) {
        // Out of threads or memory for them: the calling thread does the parts left over,
        // rather than letting the exception destroy joinable threads (std::terminate).
    }
    part(0);
    for (unsigned i = started; i < t; ++i) part(i);
    for (auto& th : pool) th.join();
}

std::shared_ptr<const Shard> make_shard(const Plan& plan, Order order, std::uint64_t seed,
                                        std::uint64_t epoch) {
    switch (order) {
        case Order::identity:
            return std::make_shared<PermutationShard<Identity>>(plan, Identity{});
        case Order::feistel:
            break;
    }
    const std::uint64_t key = derive_key(kFeistelDomain, plan.n, seed, epoch);
    return std::make_shared<PermutationShard<Feistel>>(plan, Feistel(plan.n, key));
}

}  // namespace fastshard
