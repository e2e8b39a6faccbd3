// Large arrays that ask the kernel for huge pages.
//
// A fresh 4 KiB page costs a fault on first touch; on virtual machines that is tens of
// microseconds, so filling a new 800 MB table can cost seconds in faults alone. Where Linux
// has transparent huge pages in "madvise" mode, 2 MiB-aligned memory marked MADV_HUGEPAGE
// faults 512 times less often (NumPy does the same for its large arrays).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <limits>
#include <memory>
#include <new>
#include <type_traits>

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

}  // namespace fastshard
