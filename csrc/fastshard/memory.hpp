// Large arrays that ask the kernel for huge pages.
//
// A fresh 4 KiB page costs a fault on first touch; on virtual machines that is tens of
// microseconds, so filling a new 800 MB table can cost seconds in faults alone. Where Linux
// has transparent huge pages in "madvise" mode, 2 MiB-aligned memory marked MADV_HUGEPAGE
// faults 512 times less often (NumPy does the same for its large arrays).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <new>
#include <type_traits>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace fastshard {

struct FreeDeleter {
    void operator()(void* p) const noexcept { std::free(p); }
};

template <class T>
using HugeArray = std::unique_ptr<T[], FreeDeleter>;

// Uninitialised storage for `count` objects of a trivial type T.
template <class T>
HugeArray<T> make_huge_array(std::size_t count) {
    static_assert(std::is_trivially_default_constructible<T>::value, "T must be trivial");
    constexpr std::size_t kHuge = std::size_t{2} << 20;
    if (count > std::numeric_limits<std::size_t>::max() / sizeof(T)) throw std::bad_alloc();
    std::size_t bytes = count * sizeof(T);
    if (bytes == 0) bytes = sizeof(T);
    void* p = nullptr;
#if defined(__linux__)
    if (bytes >= kHuge) {
        const std::size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
        p = std::aligned_alloc(kHuge, rounded);
        if (p != nullptr) madvise(p, rounded, MADV_HUGEPAGE);  // a hint: failure is harmless
    }
#endif
    if (p == nullptr) p = std::malloc(bytes);
    if (p == nullptr) throw std::bad_alloc();
    return HugeArray<T>(static_cast<T*>(p));
}

// Zeroed storage for `count` words of a table the caller adds into at random places: on Linux
// with 2 MiB pages where the kernel gives them, so that the adds do not also miss the TLB (a
// table of 31 MB in 4 KiB pages has 7,600 of them, several times what the TLB holds).
template <class T>
HugeArray<T> make_huge_zeros(std::size_t count) {
    HugeArray<T> a = make_huge_array<T>(count);
    for (std::size_t i = 0; i < count; ++i) a[i] = T{};
    return a;
}

// v.assign(count, T{}) where v's storage, if allocated here, is marked MADV_HUGEPAGE first (its
// 2 MiB-aligned interior: the hint applies to whole huge pages) and only then touched.
template <class T>
void assign_huge_zeros(std::vector<T>& v, std::size_t count) {
    v.clear();
#if defined(__linux__)
    constexpr std::size_t kHuge = std::size_t{2} << 20;
    if (count * sizeof(T) >= 2 * kHuge && v.capacity() < count) {
        std::vector<T>().swap(v);
        v.reserve(count);  // allocated, not yet touched
        const auto begin = reinterpret_cast<std::uintptr_t>(v.data());
        const std::uintptr_t lo = (begin + kHuge - 1) / kHuge * kHuge;
        const std::uintptr_t hi = (begin + count * sizeof(T)) / kHuge * kHuge;
        if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);  // a hint
    }
#endif
    v.assign(count, T{});
}

}  // namespace fastshard
