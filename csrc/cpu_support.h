// Helpers shared by the CPU attention kernels (edge_attention.cpp, bias_attention.cpp): 32-byte vector types,
// the AVX2+FMA run-time dispatch, huge-page advice for large outputs, and the accumulation type of a dtype.
//
// Every kernel pass is a template `name_impl(P, begin, end)` built from always_inline helpers; SK_DEFINE_PASS(name)
// compiles it twice, for the baseline ISA and (x86, GCC/Clang) for AVX2+FMA, and SK_RUN_PASS(name, P, begin, end)
// calls the one the CPU supports (checked once).
#pragma once

#include <torch/extension.h>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include <cstdint>
#include <cstring>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define SK_X86_DISPATCH 1
#endif

#if defined(__GNUC__)
#define SK_INLINE inline __attribute__((always_inline))
#else
#define SK_INLINE inline
#endif

namespace syntaxkernels {
namespace cpu {

template <typename T>
struct AccOf {
  using type = float;
};
template <>
struct AccOf<double> {
  using type = double;
};

#if defined(__GNUC__)
// The 32-byte vectors below live only inside always_inline helpers (no ABI boundary): silence GCC's note that
// returning one by value from code compiled without AVX would change the calling convention.
#pragma GCC diagnostic ignored "-Wpsabi"
template <typename T>
struct Lanes;
template <>
struct Lanes<float> {
  typedef float Vec __attribute__((vector_size(32)));
  typedef int32_t Int __attribute__((vector_size(32)));
  static constexpr int64_t kWidth = 8;
};
template <>
struct Lanes<double> {
  typedef double Vec __attribute__((vector_size(32)));
  typedef int64_t Int __attribute__((vector_size(32)));
  static constexpr int64_t kWidth = 4;
};

template <typename V, typename T>
SK_INLINE V load_vec(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}

template <typename V, typename T>
SK_INLINE void store_vec(T* p, const V& v) {
  std::memcpy(p, &v, sizeof(V));
}
#endif

inline bool use_avx2() {
#ifdef SK_X86_DISPATCH
  static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return supported;
#else
  return false;
#endif
}

inline at::Tensor last_dim_contiguous(const at::Tensor& t) { return t.stride(-1) == 1 ? t : t.contiguous(); }

// A large output is usually fresh memory straight from mmap, and the first write to each 4 KiB page faults.
// Asking for transparent huge pages before that first write (honoured when THP is in "always" or "madvise" mode,
// as torch does for its own allocations under THP_MEM_ALLOC_ENABLE=1) leaves one fault per 2 MiB: measured 1.25x
// faster at N = 4096 (a 151 MB output). Advisory: memory already touched, or no THP, changes nothing.
inline void advise_huge_pages(const at::Tensor& t) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  if (!t.has_storage() || t.storage().nbytes() < 4 * kHuge) return;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(t.storage().data());
  const uintptr_t start = (begin + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t stop = (begin + t.storage().nbytes()) & ~(kHuge - 1);
  if (stop > start) (void)madvise(reinterpret_cast<void*>(start), stop - start, MADV_HUGEPAGE);
#else
  (void)t;
#endif
}

}  // namespace cpu
}  // namespace syntaxkernels

// Each pass is compiled twice: for the baseline ISA and, on x86 with GCC/Clang, for AVX2+FMA (chosen at run
// time). The helpers are always_inline, so the whole loop nest takes the caller's ISA.
#define SK_DEFINE_PASS(name)                                                                            \
  template <typename Problem_t>                                                                         \
  void name##_baseline(const Problem_t& P, int64_t begin, int64_t end) {                                \
    name##_impl(P, begin, end);                                                                         \
  }                                                                                                     \
  SK_DEFINE_PASS_AVX2(name)

#ifdef SK_X86_DISPATCH
#define SK_DEFINE_PASS_AVX2(name)                                                                       \
  template <typename Problem_t>                                                                         \
  __attribute__((target("avx2,fma"))) void name##_avx2(const Problem_t& P, int64_t begin, int64_t end) { \
    name##_impl(P, begin, end);                                                                         \
  }
#define SK_RUN_PASS(name, P, begin, end) \
  (::syntaxkernels::cpu::use_avx2() ? name##_avx2(P, begin, end) : name##_baseline(P, begin, end))
#else
#define SK_DEFINE_PASS_AVX2(name)
#define SK_RUN_PASS(name, P, begin, end) name##_baseline(P, begin, end)
#endif
