// C++ tests of the packed builder (torch-free; linked into the ctest executable, whose main() in
// test_tree_distance.cpp calls run_packed_builder_tests()): every sequence's block, depth and segment equal
// build_batch's on the same rows padded, for any thread count; offsets; cu_seqlens checks; error wording.
#include <algorithm>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_support.h"
#include "tree_distance.h"

namespace {

using syntaxkernels_test::Rows;

struct Packed {
  std::vector<int64_t> heads, cu{0}, offsets;
  std::vector<uint8_t> distance;
  std::vector<int32_t> depth, segment;
  int64_t S = 0;

  explicit Packed(const Rows& rows) : S(static_cast<int64_t>(rows.size())) {
    for (const auto& row : rows) {
      heads.insert(heads.end(), row.begin(), row.end());
      cu.push_back(static_cast<int64_t>(heads.size()));
    }
    offsets.assign(static_cast<size_t>(S + 1), -1);
    syntaxkernels::packed_offsets(cu.data(), S, offsets.data());
  }

  void build(int threads) {
    distance.assign(static_cast<size_t>(offsets[S]), 42);
    depth.assign(heads.size(), 42);
    segment.assign(heads.size(), 42);
    syntaxkernels::build_packed(heads.data(), cu.data(), S, offsets.data(), distance.data(), depth.data(),
                                segment.data(), threads);
  }
};

std::string error_of(Packed& packed, int threads) {
  try {
    packed.build(threads);
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "";
}

// A random forest of n tokens: each token's head is an earlier token, or -1 (a root) with probability 1/8.
std::vector<int64_t> random_forest(std::mt19937& rng, int64_t n) {
  std::vector<int64_t> heads(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) heads[i] = (i == 0 || rng() % 8 == 0) ? -1 : static_cast<int64_t>(rng() % i);
  std::vector<int64_t> perm(static_cast<size_t>(n));  // shuffled positions: heads after their dependents too
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[perm[i]] = heads[i] < 0 ? -1 : perm[heads[i]];
  return out;
}

void test_matches_padded_batch() {
  std::mt19937 rng(17);
  Rows rows;
  for (int s = 0; s < 40; ++s) rows.push_back(random_forest(rng, s % 7 == 3 ? 0 : 1 + rng() % 60));
  rows.push_back(random_forest(rng, 300));  // a long one: enough work for several threads
  Packed packed(rows);
  syntaxkernels_test::PaddedHeads padded(rows, 0, 7);
  const int64_t B = padded.B, N = padded.N;
  std::vector<uint8_t> distance(static_cast<size_t>(B * N * N));
  std::vector<int32_t> depth(static_cast<size_t>(B * N)), segment(static_cast<size_t>(B * N));
  syntaxkernels::build_batch(padded.heads.data(), padded.lengths.data(), B, N, distance.data(), depth.data(),
                             segment.data(), 1);
  int64_t expected_offset = 0;
  for (int64_t s = 0; s < packed.S; ++s) {
    EXPECT(packed.offsets[s] == expected_offset);
    expected_offset += padded.lengths[s] * padded.lengths[s];
  }
  EXPECT(packed.offsets[packed.S] == expected_offset);
  for (int threads : {1, 3, 8}) {
    packed.build(threads);
    int mismatches = 0;
    for (int64_t s = 0; s < packed.S; ++s) {
      const int64_t n = padded.lengths[s], start = packed.cu[s];
      for (int64_t i = 0; i < n; ++i) {
        mismatches += packed.depth[start + i] != depth[s * N + i];
        mismatches += packed.segment[start + i] != segment[s * N + i];
        for (int64_t j = 0; j < n; ++j)
          mismatches += packed.distance[packed.offsets[s] + i * n + j] != distance[(s * N + i) * N + j];
      }
    }
    EXPECT(mismatches == 0);
  }
}

void test_cu_seqlens_checks() {
  const std::vector<int64_t> good{0, 2, 2, 5}, first{1, 2, 5}, down{0, 3, 2, 5}, last{0, 2, 4};
  EXPECT(syntaxkernels::check_cu_seqlens(good.data(), 3, 5).empty());
  EXPECT(syntaxkernels::check_cu_seqlens(first.data(), 2, 5) == "cu_seqlens[0] = 1 (expected 0)");
  EXPECT(syntaxkernels::check_cu_seqlens(down.data(), 3, 5).rfind("sequence 1: cu_seqlens[2] = 2", 0) == 0);
  EXPECT(syntaxkernels::check_cu_seqlens(last.data(), 2, 5) ==
         "cu_seqlens[2] = 4 but there are 5 heads (the last entry must be the token count)");
}

void test_errors_name_the_lowest_bad_sequence() {
  std::mt19937 rng(3);
  Rows rows;
  for (int s = 0; s < 64; ++s) rows.push_back(random_forest(rng, 100));
  rows[50][4] = 4;     // a self-loop
  rows[21][7] = 100;   // out of range: the lowest bad sequence, whatever the threads
  Packed packed(rows);
  for (int threads : {1, 2, 8}) {
    EXPECT(error_of(packed, threads) ==
           "sequence 21, token 7: head 100 out of range (length 100; expected -1 for a root or 0..99)");
  }
  Packed empty(Rows(3));
  EXPECT(error_of(empty, 4).empty() && empty.offsets[3] == 0);
}

}  // namespace

int run_packed_builder_tests() {
  const int before = syntaxkernels_test::failures;
  test_matches_padded_batch();
  test_cu_seqlens_checks();
  test_errors_name_the_lowest_bad_sequence();
  return syntaxkernels_test::failures - before;
}
