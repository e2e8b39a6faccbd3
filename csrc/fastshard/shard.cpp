#include "fastshard/shard.hpp"

#include <atomic>
#include <thread>

#if defined(__linux__)
#include <sched.h>
#endif

#include "fastshard/mix.hpp"
#include "fastshard/parallel.hpp"
#include "fastshard/torch_order.hpp"

namespace fastshard {

namespace {

// The CPUs this process may run on: on Linux its affinity mask (taskset, a container's or a
// batch scheduler's cpuset, a launcher binding ranks to cores), which hardware_concurrency()
// ignores; it counts every CPU of the machine, so 8 ranks on a 96-core node each started 96
// threads.
unsigned hardware_threads() noexcept {
#if defined(__linux__)
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        const int allowed = CPU_COUNT(&set);
        if (allowed > 0) return static_cast<unsigned>(allowed);
    }  // (more CPUs than a cpu_set_t holds: the call fails, and the machine's count is used)
#endif
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
