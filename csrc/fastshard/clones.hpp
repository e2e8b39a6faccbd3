// Functions compiled for several instruction sets, one picked at run time: the portable wheel
// (no -march=native) keeps the speed of AVX2 and AVX-512 where the CPU has them.
#pragma once

// x86-64 ELF with GCC or Clang; off glibc (musl) CMake defines FASTSHARD_NO_CLONES, and
// AddressSanitizer's build uses none.
#if defined(__x86_64__) && defined(__ELF__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(FASTSHARD_NO_CLONES) && !defined(__SANITIZE_ADDRESS__)
// 32-bit lanes (the Feistel rounds): one copy each for AVX-512F, AVX2 and the baseline, chosen
// by fastshard::simd_level() (cpuid), not by target_clones. target_clones' resolver reads
// __cpu_model, filled by __cpu_indicator_init from the compiler's runtime library, and zig's
// compiler_rt (the zig c++ wheel build) has only a stub that reports no feature at all: that
// wheel ran the SSE2 copy, 2x slower.
#define FASTSHARD_MULTIVERSION 1
#define FASTSHARD_TARGET_AVX512F __attribute__((target("avx512f")))
#define FASTSHARD_TARGET_AVX2 __attribute__((target("avx2")))
#if !defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 12
// 64-bit lanes (the lengths checksum's multiplies, read_into_windows's passes): vpmullq needs
// AVX-512DQ, and on 256-bit vectors VL, which x86-64-v4 names together. GCC >= 12 takes an
// `arch=` clone; Clang gets one version.
// (GCC only, so always resolved by libgcc's working __cpu_indicator_init.)
#define FASTSHARD_CLONES_MUL64 __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#endif
#endif

#ifndef FASTSHARD_CLONES_MUL64
#define FASTSHARD_CLONES_MUL64
#endif

#ifdef FASTSHARD_MULTIVERSION
namespace fastshard {

enum class SimdLevel : int { kBaseline = 0, kAvx2 = 1, kAvx512f = 2 };

// The best level this CPU and OS support (cpuid, and xgetbv for the register state the OS
// saves), computed once.
SimdLevel simd_level() noexcept;

}  // namespace fastshard
#endif
