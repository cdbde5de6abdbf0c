// C++ tests of the relation/window list builder (torch-free; linked into the ctest executable, whose main()
// in test_tree_distance.cpp calls run_relation_list_tests()).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "relation_lists.h"
#include "test_support.h"

int run_relation_list_tests();

namespace {

using syntaxkernels::RelationKind;
using syntaxkernels_test::failures;
using syntaxkernels_test::Rows;

struct Padded : syntaxkernels_test::PaddedHeads {
  Padded(const Rows& rows, int64_t pad_to) : PaddedHeads(rows, pad_to, 3) {}
  syntaxkernels::EdgeLists build(const syntaxkernels::ListSpec& spec, int threads = 1) const {
    return syntaxkernels::build_edge_lists(heads.data(), lengths.data(), B, N, spec, threads);
  }
};

// The chain i, head(i), ..., root.
std::vector<int64_t> chain(const std::vector<int64_t>& heads, int64_t i) {
  std::vector<int64_t> out{i};
  while (heads[out.back()] >= 0) out.push_back(heads[out.back()]);
  return out;
}

int64_t position(const std::vector<int64_t>& values, int64_t x) {
  auto it = std::find(values.begin(), values.end(), x);
  return it == values.end() ? -1 : it - values.begin();
}

// The first relation of `kind` in the spec's order (its position times D), or -1 when it is not listed.
int64_t offset_of(const syntaxkernels::ListSpec& spec, RelationKind kind) {
  const auto it = std::find(spec.relations.begin(), spec.relations.end(), kind);
  return it == spec.relations.end() ? -1 : (it - spec.relations.begin()) * spec.max_distance;
}

// Brute-force relation index of the pair (i, j), or -1 (the definitions of docs/semantics.md, from the head chains).
int64_t relation_of(const std::vector<int64_t>& heads, int64_t i, int64_t j, const syntaxkernels::ListSpec& spec) {
  const auto ci = chain(heads, i), cj = chain(heads, j);
  if (spec.window >= 0) {
    if (ci.back() != cj.back()) return -1;
    for (size_t u = 0; u < ci.size(); ++u) {
      const int64_t k = position(cj, ci[u]);
      if (k >= 0) return std::min<int64_t>(254, static_cast<int64_t>(u) + k) <= spec.window ? 0 : -1;
    }
    return -1;
  }
  const int64_t D = spec.max_distance;
  const int64_t parent = offset_of(spec, RelationKind::kParent), child = offset_of(spec, RelationKind::kChild),
                sibling = offset_of(spec, RelationKind::kSibling);
  const int64_t up = position(cj, i);  // i is an ancestor of j at distance up
  if (parent >= 0 && up >= 1 && up <= D) return parent + up - 1;
  const int64_t down = position(ci, j);  // j is an ancestor of i
  if (child >= 0 && down >= 1 && down <= D) return child + down - 1;
  if (sibling >= 0 && up < 0 && down < 0 && ci.back() == cj.back()) {
    for (size_t u = 0; u < ci.size(); ++u) {
      const int64_t k = position(cj, ci[u]);
      if (k >= 0) {
        const int64_t d = static_cast<int64_t>(u) + k;
        return d >= 2 && d <= D + 1 ? sibling + d - 2 : -1;
      }
    }
  }
  return -1;
}

// Every list of `lists` against the brute force, and the transposed lists against the lists.
void expect_matches_brute_force(const Rows& rows, const Padded& batch, const syntaxkernels::EdgeLists& lists,
                                const syntaxkernels::ListSpec& spec) {
  const int64_t R = spec.num_relations(), N = batch.N;
  EXPECT(lists.R == R && lists.row_ptr.size() == static_cast<size_t>(batch.B * N * R + 1));
  EXPECT(lists.col.size() == lists.t_col.size() && lists.rel.size() == lists.col.size());
  for (int64_t b = 0; b < batch.B; ++b) {
    const int64_t length = batch.lengths[b];
    for (int64_t i = 0; i < N; ++i) {
      for (int64_t r = 0; r < R; ++r) {
        std::vector<int32_t> want, got, got_t, want_t;
        for (int64_t j = 0; j < length && i < length; ++j) {
          if (relation_of(rows[b], i, j, spec) == r) want.push_back(static_cast<int32_t>(j));
          if (relation_of(rows[b], j, i, spec) == r) want_t.push_back(static_cast<int32_t>(j));
        }
        const int64_t row = (b * N + i) * R + r;
        for (int32_t e = lists.row_ptr[row]; e < lists.row_ptr[row + 1]; ++e) {
          got.push_back(lists.col[e]);
          EXPECT(lists.rel[e] == r);
        }
        for (int32_t e = lists.t_ptr[row]; e < lists.t_ptr[row + 1]; ++e) {
          got_t.push_back(lists.t_col[e]);
          EXPECT(lists.t_rel[e] == r);
        }
        if (got != want || got_t != want_t) {
          std::fprintf(stderr, "item %ld row %ld relation %ld: %zu keys (want %zu), %zu queries (want %zu)\n",
                       static_cast<long>(b), static_cast<long>(i), static_cast<long>(r), got.size(), want.size(),
                       got_t.size(), want_t.size());
          ++failures;
          return;
        }
      }
    }
  }
}

// The kinds in the order of syntaxkernels.specs.RELATIONS, as MaskSpec.relation_kinds gives them.
syntaxkernels::ListSpec relations(int32_t D, bool parent = true, bool child = true, bool sibling = true) {
  syntaxkernels::ListSpec spec;
  spec.max_distance = D;
  if (parent) spec.relations.push_back(RelationKind::kParent);
  if (child) spec.relations.push_back(RelationKind::kChild);
  if (sibling) spec.relations.push_back(RelationKind::kSibling);
  return spec;
}

syntaxkernels::ListSpec in_order(int32_t D, std::vector<RelationKind> kinds) {
  syntaxkernels::ListSpec spec;
  spec.max_distance = D;
  spec.relations = std::move(kinds);
  return spec;
}

syntaxkernels::ListSpec window(int32_t w) {
  syntaxkernels::ListSpec spec;
  spec.window = w;
  return spec;
}

std::string error_of(const Padded& batch, const syntaxkernels::ListSpec& spec, int threads = 1) {
  try {
    batch.build(spec, threads);
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "";
}

void test_hand_made() {
  // 0 <- 1 -> 2 -> 3, 1 -> 4 (root 1), then a second tree {5} and padding.
  const Rows rows{{1, -1, 1, 2, 1, -1}};
  const Padded batch(rows, 7);
  const auto lists = batch.build(relations(2));
  const int64_t R = 6, N = 7;
  auto keys = [&](int64_t i, int64_t r) {
    std::vector<int32_t> out;
    const int64_t row = i * R + r;
    for (int32_t e = lists.row_ptr[row]; e < lists.row_ptr[row + 1]; ++e) out.push_back(lists.col[e]);
    return out;
  };
  EXPECT((keys(1, 0) == std::vector<int32_t>{0, 2, 4}));  // parent_1 of the root
  EXPECT((keys(1, 1) == std::vector<int32_t>{3}));        // parent_2
  EXPECT((keys(3, 2) == std::vector<int32_t>{2}));        // child_1
  EXPECT((keys(3, 3) == std::vector<int32_t>{1}));        // child_2
  EXPECT((keys(0, 4) == std::vector<int32_t>{2, 4}));     // sibling_2
  EXPECT((keys(0, 5) == std::vector<int32_t>{3}));        // sibling_3
  EXPECT(keys(5, 0).empty() && keys(5, 4).empty() && keys(6, 0).empty());
  EXPECT(lists.row_ptr[N * R] == static_cast<int32_t>(lists.col.size()));
  expect_matches_brute_force(rows, batch, lists, relations(2));
  const auto w = batch.build(window(1));
  std::vector<int32_t> near;
  for (int32_t e = w.row_ptr[1]; e < w.row_ptr[2]; ++e) near.push_back(w.col[e]);
  EXPECT((near == std::vector<int32_t>{0, 1, 2, 4}));  // the root, itself included
}

void test_random_against_brute_force() {
  std::mt19937 rng(11);
  for (int threads : {1, 3}) {
    Rows rows;
    for (int b = 0; b < 24; ++b) {
      const int length = static_cast<int>(rng() % 40);
      std::vector<int64_t> perm(length), heads(length);
      for (int i = 0; i < length; ++i) perm[i] = i;
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int k = 0; k < length; ++k) heads[perm[k]] = (k == 0 || rng() % 7 == 0) ? -1 : perm[rng() % k];
      rows.push_back(heads);
    }
    // A star and a chain.
    rows.push_back(std::vector<int64_t>(30, 0));
    rows.back()[0] = -1;
    std::vector<int64_t> line(30);
    for (int i = 0; i < 30; ++i) line[i] = i - 1;
    rows.push_back(line);
    const Padded batch(rows, 41);
    for (const auto& spec : {relations(3), relations(1), relations(4, true, false, true),
                             relations(2, false, true, false), relations(3, false, false, true), window(0), window(2),
                             window(4), window(254),
                             // The builder follows the order it is given.
                             in_order(2, {RelationKind::kSibling, RelationKind::kParent}),
                             in_order(3, {RelationKind::kChild, RelationKind::kSibling, RelationKind::kParent})}) {
      expect_matches_brute_force(rows, batch, batch.build(spec, threads), spec);
    }
  }
}

void test_long_chain_window_saturates() {
  // Distances saturate at 254: window 254 pairs every token of the tree, window 253 does not.
  std::vector<int64_t> line(300);
  for (int i = 0; i < 300; ++i) line[i] = i - 1;
  const Padded batch({line}, 0);
  const auto all = batch.build(window(254));
  EXPECT(all.col.size() == 300u * 300u);
  const auto most = batch.build(window(253));
  EXPECT(most.row_ptr[1] - most.row_ptr[0] == 254);
}

void test_errors() {
  const Padded cycle({{-1, 0}, {-1, 2, 3, 1}}, 0);
  const std::string cycle_error = "batch item 1, token 1: on a cycle (1 -> 2 -> 3 -> 1) that never reaches a root";
  EXPECT(error_of(cycle, relations(3)) == cycle_error);
  EXPECT(error_of(cycle, window(2), 2) == cycle_error);
  const Padded out_of_range({{-1, 0, 3}}, 0);
  EXPECT(error_of(out_of_range, relations(1)) ==
        "batch item 0, token 2: head 3 out of range (length 3; expected -1 for a root or 0..2)");
  Padded bad_length({{-1}, {-1}}, 0);
  bad_length.lengths[1] = 2;
  EXPECT(error_of(bad_length, relations(1)) == "batch item 1: lengths[1] = 2 is larger than N = 1");
  const Padded fine({{-1, 0}}, 0);
  EXPECT(error_of(fine, relations(0)) == "max_distance must be in 1..64, got 0");
  EXPECT(error_of(fine, relations(2, false, false, false)) ==
        "no relation enabled (parent, child and sibling are all off)");
  EXPECT(error_of(fine, window(255)) == "window must be in 0..254 (or -1 for the relation lists), got 255");
  EXPECT(error_of(fine, in_order(2, {RelationKind::kChild, RelationKind::kChild})) ==
         "relation kind 'child' listed twice");
  std::vector<RelationKind> kinds;
  EXPECT(syntaxkernels::relation_kinds_of({"sibling", "parent"}, kinds).empty() &&
         (kinds == std::vector<RelationKind>{RelationKind::kSibling, RelationKind::kParent}));
  EXPECT(syntaxkernels::relation_kinds_of({"parent", "uncle"}, kinds) ==
         "unknown relation kind 'uncle' (the builder walks parent, child and sibling)");
  EXPECT(std::string(syntaxkernels::relation_kind_name(RelationKind::kSibling)) == "sibling");
  // The lowest bad item is reported whatever the thread count.
  Rows many(100, std::vector<int64_t>(50, 0));
  for (auto& row : many) row[0] = -1;
  many[70][4] = 4;
  many[20][9] = 90;
  const Padded batch(many, 0);
  for (int threads : {1, 2, 5}) {
    EXPECT(error_of(batch, relations(3), threads) ==
          "batch item 20, token 9: head 90 out of range (length 50; expected -1 for a root or 0..49)");
  }
}

void test_empty() {
  const Padded none(Rows{}, 0);
  const auto lists = none.build(relations(3), 4);
  EXPECT(lists.row_ptr.size() == 1 && lists.row_ptr[0] == 0 && lists.col.empty());
  const Padded padding(Rows(2), 3);
  const auto padded = padding.build(window(3));
  EXPECT(padded.row_ptr.size() == 7 && padded.col.empty());
}

}  // namespace

int run_relation_list_tests() {
  const int before = failures;
  test_hand_made();
  test_random_against_brute_force();
  test_long_chain_window_saturates();
  test_errors();
  test_empty();
  if (failures == before) std::printf("all relation-list tests passed\n");
  return failures - before;
}
