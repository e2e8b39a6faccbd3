// Alias tables and weight summaries: hashes to compare two builds bit for bit, and phase timings
// (issue 30). Build it once per core (this tree's, and an older commit's from `git archive`):
//   g++ -O3 -DNDEBUG -std=c++17 -Icsrc bench/investigations/weighted_table.cpp csrc/fastshard/*.cpp -pthread -o /tmp/wt
//   /tmp/wt hash > new.txt            (12 sizes x 5 weight kinds x 1-3 threads x 3 segment sizes,
//                                     and invalid weights; diff against the other build's output)
//   /tmp/wt time N ROUNDS [THREADS]   (sum, summarize_weights, AliasTable, a fresh write of the
//                                     table's size: wall / CPU ms per round; SMAPS=1 prints the
//                                     table's AnonHugePages)
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>
#include <sys/resource.h>
#include "fastshard/weighted.hpp"
#include "fastshard/parallel.hpp"
#include "fastshard/mix.hpp"
using namespace fastshard;

static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
static double cpu() { rusage r; getrusage(RUSAGE_SELF, &r); return r.ru_utime.tv_sec + r.ru_stime.tv_sec + 1e-6 * (r.ru_utime.tv_usec + r.ru_stime.tv_usec); }

static std::uint64_t hash_bytes(const void* p, std::size_t size) {
    const unsigned char* b = static_cast<const unsigned char*>(p);
    std::uint64_t h = 0;
    std::size_t i = 0;
    for (; i + 8 <= size; i += 8) { std::uint64_t v; std::memcpy(&v, b + i, 8); h = mix64(h ^ v) + i; }
    for (; i < size; ++i) h = mix64(h ^ b[i]);
    return h;
}

static void fill_weights(std::vector<double>& w, int kind, std::uint64_t seed) {
    SplitMix64 r(seed);
    for (auto& x : w) {
        const double u = static_cast<double>(r.next() >> 11) * 0x1.0p-53;
        switch (kind) {
            case 0: x = u; break;                           // uniform
            case 1: x = u < 0.1 ? 0.0 : u * u * u * 100; break;  // zeros + skew
            case 2: x = std::ldexp(u + 0.5, int(r.next() % 80) - 40); break;  // wide range
            case 3: x = 1.0; break;                         // all equal
            case 4: x = std::ldexp(u, -1070); break;        // subnormal-ish: not as_is
        }
    }
}

int main(int argc, char** argv) {
    std::string mode = argc > 1 ? argv[1] : "time";
    if (mode == "hash") {
        // hash tables for several n, kinds, threads, segments
        const std::uint64_t ns[] = {1, 2, 63, 64, 65, 4095, 4096, 4097, 100003, 1000003, 5000000, 30000000};
        for (std::uint64_t n : ns) for (int kind = 0; kind < 5; ++kind) for (unsigned th : {1u, 2u, 3u}) {
            if (n >= 30000000 && (kind != 0 && kind != 2)) continue;
            std::vector<double> w(n);
            fill_weights(w, kind, n * 7 + kind);
            set_default_threads(th);
            WeightsSummary s = summarize_weights(w.data(), n, th);
            std::uint64_t segs[] = {4096, 65536, AliasTable::kSweepSegment};
            std::printf("n=%llu kind=%d th=%u sum=%a pos=%llu ck=%016llx max=%a min=%a inv=%lld",
                        (unsigned long long)n, kind, th, s.sum, (unsigned long long)s.positive,
                        (unsigned long long)s.checksum, s.max, s.min_positive, (long long)s.first_invalid);
            for (auto seg : segs) {
                if (s.positive == 0) continue;
                AliasTable t(w.data(), n, s, seg);
                std::printf(" t%llu=%016llx", (unsigned long long)seg, (unsigned long long)hash_bytes(t.data(), t.bytes()));
            }
            std::printf("\n");
        }
        // invalid values
        for (std::uint64_t n : {std::uint64_t{100}, std::uint64_t{5000}, std::uint64_t{1000003}}) for (std::uint64_t bad : {std::uint64_t{0}, std::uint64_t{37}, n - 1}) {
            std::vector<double> w(n); fill_weights(w, 0, n);
            w[bad] = -1.0; if (bad + 5000 < n) w[bad + 5000] = NAN;
            WeightsSummary s = summarize_weights(w.data(), n, 2);
            std::printf("bad n=%llu at=%llu inv=%lld ck=%016llx\n", (unsigned long long)n, (unsigned long long)bad, (long long)s.first_invalid, (unsigned long long)s.checksum);
        }
        return 0;
    }
    const std::uint64_t n = argc > 2 ? std::uint64_t(std::atof(argv[2])) : 100000000;
    const int rounds = argc > 3 ? std::atoi(argv[3]) : 5;
    const unsigned threads = argc > 4 ? unsigned(std::atoi(argv[4])) : 0;
    if (threads) set_default_threads(threads);
    std::vector<double> w(n);
    fill_weights(w, 0, 1);
    WeightsSummary s0 = summarize_weights(w.data(), n, 0);
    for (int r = 0; r < rounds; ++r) {
        double t0 = now(), c0 = cpu();
        double acc[8] = {0};
        for (std::uint64_t i = 0; i + 8 <= n; i += 8) for (int k = 0; k < 8; ++k) acc[k] += w[i + k];
        double sum = acc[0] + acc[1] + acc[2] + acc[3] + acc[4] + acc[5] + acc[6] + acc[7];
        double t1 = now(), c1 = cpu();
        WeightsSummary s = summarize_weights(w.data(), n, 0);
        double t2 = now(), c2 = cpu();
        std::uint64_t h;
        double t3, c3;
        {
            AliasTable t(w.data(), n, s0, AliasTable::kSweepSegment);
            t3 = now(); c3 = cpu();
            h = hash_bytes(t.data(), 64);
            if (std::getenv("SMAPS")) { FILE* f = std::fopen("/proc/self/smaps_rollup", "r"); char line[256]; while (std::fgets(line, sizeof line, f)) if (std::strstr(line, "AnonHuge") || std::strstr(line, "Rss:")) std::fputs(line, stdout); std::fclose(f); }
        }
        double t4 = now(), c4 = cpu();
        {
            HugeArray<std::uint64_t> a = make_huge_array<std::uint64_t>(n);
            for (std::uint64_t i = 0; i < n; ++i) a[i] = 1;
            h ^= a[n / 2];
        }
        double t5 = now(), c5 = cpu();
        std::printf("sum %.1f/%.1f  summary %.1f/%.1f  table %.1f/%.1f  write %.1f/%.1f ms (wall/cpu)  [%g %llx %llx]\n",
                    (t1 - t0) * 1e3, (c1 - c0) * 1e3, (t2 - t1) * 1e3, (c2 - c1) * 1e3, (t3 - t2) * 1e3,
                    (c3 - c2) * 1e3, (t5 - t4) * 1e3, (c5 - c4) * 1e3, sum, (unsigned long long)s.checksum,
                    (unsigned long long)h);
    }
}
