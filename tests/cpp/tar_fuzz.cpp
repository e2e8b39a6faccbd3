// The tar scanner, skip and block cut of csrc/fastshard/tar.cpp on damaged archives, built with
// the sanitizers by tests/test_stream_readers.py: truncations and random byte changes of the
// archives named on the command line must end or throw the scanner's errors, never read outside
// the bytes they were given. Prints "ok RUNS" when every run did.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "fastshard/tar.hpp"

namespace {

std::size_t runs = 0;

void exercise(const std::vector<char>& data) {
    // An exact-size heap copy, so that a read one byte past the end is the sanitizer's to see.
    std::vector<char> bytes(data);
    const fastshard::ReadAt read = [&bytes](std::uint64_t off, char* out, std::size_t n) -> std::size_t {
        if (off >= bytes.size()) return 0;
        const std::size_t m = std::min<std::size_t>(n, bytes.size() - static_cast<std::size_t>(off));
        std::memcpy(out, bytes.data() + off, m);
        return m;
    };
    try {
        const auto s = fastshard::scan_tar(read, 3, "fuzz");
        if (s.offsets.size() != (s.samples + 2) / 3) std::abort();
    } catch (const fastshard::NotTarError&) {
    } catch (const fastshard::TarFormatError&) {
    }
    try {
        std::uint64_t found = 0;
        fastshard::skip_tar_samples(read, 0, 7, found, "fuzz");
    } catch (const fastshard::NotTarError&) {
    } catch (const fastshard::TarFormatError&) {
    }
    try {
        const auto samples = fastshard::parse_tar_block(bytes.data(), bytes.size(), "fuzz");
        for (const auto& s : samples)
            for (const auto& f : s.fields)
                if (f.data > bytes.size() || f.size > bytes.size() - f.data) std::abort();
    } catch (const fastshard::TarFormatError&) {
    }
    ++runs;
}

}  // namespace

int main(int argc, char** argv) {
    std::mt19937_64 rng(37);
    for (int a = 1; a < argc; ++a) {
        std::ifstream in(argv[a], std::ios::binary);
        const std::vector<char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        for (std::size_t cut = 0; cut <= data.size(); cut += 131)
            exercise(std::vector<char>(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(cut)));
        for (int k = 0; k < 400; ++k) {
            std::vector<char> d(data);
            const int flips = 1 + static_cast<int>(rng() % 16);
            for (int i = 0; i < flips && !d.empty(); ++i) {
                // Header bytes most of the time: the size, type and name fields matter most.
                std::size_t at = static_cast<std::size_t>(rng() % d.size());
                if (rng() % 4 != 0) at = at / 512 * 512 + static_cast<std::size_t>(rng() % 160);
                if (at < d.size()) d[at] = static_cast<char>(rng());
            }
            exercise(d);
        }
    }
    std::printf("ok %zu\n", runs);
    return 0;
}
