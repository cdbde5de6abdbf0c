// Philox-4x32-7: the counter-based generator of attention dropout's keep mask (docs/semantics.md, "Attention
// dropout"). Bit-identical to syntaxkernels.reference.philox and Triton's tl.philox (7 rounds): uint32 arithmetic,
// round constants A = 0xD2511F53 and B = 0xCD9E8D57, key increments 0x9E3779B9 and 0xBB67AE85, key (seed mod 2^32,
// seed >> 32).
//
// The keep mask of pair (query i, key j) of head h of batch item b (H heads): word (j & 3) of
// philox(seed, (j >> 2, i, b * H + h, 0)) kept iff it is >= floor(p * 2^32) (dropout_threshold).
#pragma once

#include <cstdint>

namespace syntaxkernels {
namespace philox {

constexpr uint32_t kRoundA = 0xD2511F53u;
constexpr uint32_t kRoundB = 0xCD9E8D57u;
constexpr uint32_t kKeyA = 0x9E3779B9u;
constexpr uint32_t kKeyB = 0xBB67AE85u;
constexpr int kRounds = 7;
// The stream step of reference.stream_seed: stream s of a call with seed uses seed + s * kStreamStep (mod 2^64).
constexpr uint64_t kStreamStep = 0x9E3779B97F4A7C15ull;

struct Words {
  uint32_t w[4];
};

// The four output words of Philox-4x32-7 of counter (c0, c1, c2, c3) under the 64-bit key ``seed``.
inline Words philox4x32_7(uint64_t seed, uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3) {
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < kRounds; ++round) {
    const uint64_t pb = static_cast<uint64_t>(kRoundB) * c2;
    const uint64_t pa = static_cast<uint64_t>(kRoundA) * c0;
    const uint32_t n0 = static_cast<uint32_t>(pb >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(pa >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(pb);
    c3 = static_cast<uint32_t>(pa);
    c0 = n0;
    c2 = n2;
    k0 += kKeyA;
    k1 += kKeyB;
  }
  return Words{{c0, c1, c2, c3}};
}

// reference.stream_seed(seed, stream): seed + stream * kStreamStep in wrapping uint64 arithmetic.
inline uint64_t stream_seed(uint64_t seed, uint64_t stream) { return seed + stream * kStreamStep; }

// Whether pair (row, col) of row key bh = item * H + head is kept under ``seed`` and ``threshold``.
inline bool keep(uint64_t seed, uint32_t threshold, uint32_t bh, uint32_t row, uint32_t col) {
  return philox4x32_7(seed, col >> 2, row, bh, 0u).w[col & 3u] >= threshold;
}

}  // namespace philox
}  // namespace syntaxkernels
