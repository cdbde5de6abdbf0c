// C++ tests of the torch-free core (run by ctest; no Python, no libtorch): the tree-distance builder here,
// the relation/window list builder in test_relation_lists.cpp and the packed builder in test_packed_builder.cpp
// (called from main()).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_support.h"
#include "tree_distance.h"

namespace {

using syntaxkernels_test::failures;

struct Batch : syntaxkernels_test::PaddedHeads {
  std::vector<uint8_t> distance;
  std::vector<int32_t> depth, segment;

  Batch(const syntaxkernels_test::Rows& rows, int64_t pad_to) : PaddedHeads(rows, pad_to, 7) {}

  void build(int threads = 1) {
    distance.assign(static_cast<size_t>(B * N * N), 42);
    depth.assign(static_cast<size_t>(B * N), 42);
    segment.assign(static_cast<size_t>(B * N), 42);
    syntaxkernels::build_batch(heads.data(), lengths.data(), B, N, distance.data(), depth.data(), segment.data(),
                               threads);
  }

  int d(int64_t b, int64_t i, int64_t j) const { return distance[(b * N + i) * N + j]; }
};

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "";
}

// Brute force: distance by walking both tokens to their lowest common ancestor.
int oracle(const std::vector<int64_t>& heads, int64_t i, int64_t j) {
  std::vector<int> depth_from_i(heads.size(), -1);
  int steps = 0;
  for (int64_t a = i; a >= 0; a = heads[a]) depth_from_i[a] = steps++;
  steps = 0;
  for (int64_t a = j; a >= 0; a = heads[a], ++steps) {
    if (depth_from_i[a] >= 0) return std::min(254, depth_from_i[a] + steps);
  }
  return 255;
}

void test_chain_star_single() {
  Batch batch({{-1, 0, 1, 2}, {-1, 0, 0, 0}, {-1}}, 0);
  batch.build();
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) EXPECT(batch.d(0, i, j) == std::abs(i - j));
  EXPECT(batch.depth[3] == 3 && batch.segment[3] == 0);
  EXPECT(batch.d(1, 1, 2) == 2 && batch.d(1, 0, 3) == 1 && batch.d(1, 3, 3) == 0);
  EXPECT(batch.d(2, 0, 0) == 0 && batch.d(2, 0, 1) == 255 && batch.d(2, 1, 1) == 255);
  EXPECT(batch.depth[2 * 4 + 0] == 0 && batch.depth[2 * 4 + 1] == -1 && batch.segment[2 * 4 + 3] == -1);
}

void test_forest_and_padding() {
  // Two trees: {0, 1, 2} rooted at 1 and {3, 4} rooted at 4; one padded token.
  Batch batch({{1, -1, 1, 4, -1}}, 6);
  batch.build();
  EXPECT(batch.d(0, 0, 2) == 2 && batch.d(0, 3, 4) == 1);
  EXPECT(batch.d(0, 0, 3) == 255 && batch.d(0, 4, 1) == 255);
  EXPECT(batch.segment[0] == 0 && batch.segment[3] == 1 && batch.segment[5] == -1);
  EXPECT(batch.depth[1] == 0 && batch.depth[3] == 1 && batch.depth[5] == -1);
  for (int j = 0; j < 6; ++j) EXPECT(batch.d(0, 5, j) == 255 && batch.d(0, j, 5) == 255);
}

void test_saturation() {
  std::vector<int64_t> chain(300);
  for (int i = 0; i < 300; ++i) chain[i] = i - 1;
  Batch batch({chain}, 0);
  batch.build();
  EXPECT(batch.d(0, 0, 254) == 254 && batch.d(0, 0, 299) == 254 && batch.d(0, 299, 0) == 254);
  EXPECT(batch.d(0, 10, 20) == 10 && batch.depth[299] == 299);
}

void test_random_against_oracle() {
  std::mt19937 rng(7);
  for (int threads : {1, 3}) {
    std::vector<std::vector<int64_t>> rows;
    for (int b = 0; b < 40; ++b) {
      const int length = static_cast<int>(rng() % 60);
      std::vector<int64_t> heads(length);
      // Random forest over a random permutation (heads point left or right in position order).
      std::vector<int64_t> perm(length);
      for (int i = 0; i < length; ++i) perm[i] = i;
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int k = 0; k < length; ++k) heads[perm[k]] = (k == 0 || rng() % 8 == 0) ? -1 : perm[rng() % k];
      rows.push_back(heads);
    }
    Batch batch(rows, 64);
    batch.build(threads);
    for (int64_t b = 0; b < batch.B; ++b) {
      const int64_t length = batch.lengths[b];
      for (int64_t i = 0; i < batch.N; ++i)
        for (int64_t j = 0; j < batch.N; ++j) {
          const int expected = (i < length && j < length) ? oracle(rows[b], i, j) : 255;
          if (batch.d(b, i, j) != expected) {
            std::fprintf(stderr, "item %ld (%ld, %ld): %d != %d\n", static_cast<long>(b), static_cast<long>(i),
                         static_cast<long>(j), batch.d(b, i, j), expected);
            ++failures;
            return;
          }
        }
    }
  }
}

void test_errors() {
  Batch cycle({{-1, 0}, {-1, 2, 3, 1}}, 0);
  EXPECT(error_of([&] { cycle.build(); }) ==
         "batch item 1, token 1: on a cycle (1 -> 2 -> 3 -> 1) that never reaches a root");
  Batch self_loop({{-1, 1}}, 0);
  EXPECT(error_of([&] { self_loop.build(); }) ==
         "batch item 0, token 1: self-loop (its head is itself; use -1 for a root)");
  Batch out_of_range({{-1, 0, 3}}, 0);
  EXPECT(error_of([&] { out_of_range.build(); }) ==
         "batch item 0, token 2: head 3 out of range (length 3; expected -1 for a root or 0..2)");
  Batch negative({{-1, -2}}, 0);
  EXPECT(error_of([&] { negative.build(); }) ==
         "batch item 0, token 1: head -2 out of range (length 2; expected -1 for a root or 0..1)");
  Batch bad_length({{-1}, {-1}}, 0);
  bad_length.lengths[1] = 2;
  EXPECT(error_of([&] { bad_length.build(); }) == "batch item 1: lengths[1] = 2 is larger than N = 1");
  bad_length.lengths[1] = -1;
  EXPECT(error_of([&] { bad_length.build(); }) == "batch item 1: lengths[1] = -1 is negative");
  // A tail hanging off a cycle: the smallest token on the cycle is named, not the tail.
  Batch tail({{3, 0, 1, 2}}, 0);
  EXPECT(error_of([&] { tail.build(); }) ==
         "batch item 0, token 0: on a cycle (0 -> 3 -> 2 -> 1 -> 0) that never reaches a root");
  Batch tail2({{-1, 3, 1, 4, 3}}, 0);
  EXPECT(error_of([&] { tail2.build(); }) ==
         "batch item 0, token 3: on a cycle (3 -> 4 -> 3) that never reaches a root");
}

void test_lowest_bad_item_with_threads() {
  std::vector<std::vector<int64_t>> rows(200, std::vector<int64_t>(120, 0));
  for (auto& row : rows) {
    row[0] = -1;
  }
  rows[150][5] = 5;
  rows[37][9] = 500;
  rows[90][2] = 2;
  Batch batch(rows, 0);
  for (int threads : {1, 2, 4, 8}) {
    EXPECT(error_of([&] { batch.build(threads); }) ==
           "batch item 37, token 9: head 500 out of range (length 120; expected -1 for a root or 0..119)");
  }
}

void test_empty() {
  Batch none(std::vector<std::vector<int64_t>>{}, 0);
  none.build(4);
  Batch zero(std::vector<std::vector<int64_t>>(2), 0);
  zero.build(4);
  EXPECT(zero.N == 0);
  Batch all_padding(std::vector<std::vector<int64_t>>(2), 3);
  all_padding.build(2);
  for (uint8_t value : all_padding.distance) EXPECT(value == 255);
  for (int32_t value : all_padding.depth) EXPECT(value == -1);
}

}  // namespace

// csrc/tests/test_relation_lists.cpp and test_packed_builder.cpp (the same executable): return their numbers of
// failures.
int run_relation_list_tests();
int run_packed_builder_tests();

int main() {
  test_chain_star_single();
  test_forest_and_padding();
  test_saturation();
  test_random_against_oracle();
  test_errors();
  test_lowest_bad_item_with_threads();
  test_empty();
  run_relation_list_tests();  // counts into the same failures
  run_packed_builder_tests();
  if (failures) {
    std::fprintf(stderr, "%d failure(s)\n", failures);
    return 1;
  }
  std::printf("all tree-distance tests passed\n");
  return 0;
}
