#include "fastshard/shard.hpp"

#include <atomic>
#include <thread>

#include "fastshard/mix.hpp"
#include "fastshard/parallel.hpp"
#include "fastshard/torch_order.hpp"

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
    parallel_for(count, threads, kMinPerThread, [&](unsigned, std::uint64_t begin, std::uint64_t len) {
        fill_range(k0 + begin, len, out + begin);
    });
}

std::shared_ptr<const Shard> make_shard(const Plan& plan, Order order, std::uint64_t seed,
                                        std::uint64_t epoch, TorchAlgorithm torch_shuffle) {
    switch (order) {
        case Order::identity:
            return std::make_shared<PermutationShard<Identity>>(plan, Identity{});
        case Order::torch:
            return std::make_shared<TorchShard>(plan, torch_seed(seed, epoch), torch_shuffle);
        case Order::feistel:
            break;
    }
    const std::uint64_t key = derive_key(kFeistelDomain, plan.n, seed, epoch);
    return std::make_shared<PermutationShard<Feistel>>(plan, Feistel(plan.n, key));
}

}  // namespace fastshard
