// Functions compiled for several instruction sets, one picked at load time: the portable wheel
// (no -march=native) keeps the speed of AVX2 and AVX-512 where the CPU has them.
#pragma once

// GCC/Clang ifuncs on x86-64 ELF, which glibc resolves (musl does not: CMake defines
// FASTSHARD_NO_CLONES there); AddressSanitizer's build uses none.
#if defined(__x86_64__) && defined(__ELF__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(FASTSHARD_NO_CLONES) && !defined(__SANITIZE_ADDRESS__)
// 32-bit lanes (the Feistel rounds): AVX-512F is enough.
#define FASTSHARD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#if !defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 12
// 64-bit multiplies (the lengths checksum): vpmullq needs AVX-512DQ, and on 256-bit vectors VL,
// which x86-64-v4 names together. GCC >= 12 takes an `arch=` clone; Clang gets one version.
#define FASTSHARD_CLONES_MUL64 __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#endif
#endif

#ifndef FASTSHARD_CLONES
#define FASTSHARD_CLONES
#endif
#ifndef FASTSHARD_CLONES_MUL64
#define FASTSHARD_CLONES_MUL64
#endif
