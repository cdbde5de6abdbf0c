// Shared by the C++ tests (one ctest executable): the failure count, EXPECT, and padded batches of head rows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace syntaxkernels_test {

// Failures of every test in the executable; main() reports them.
inline int failures = 0;

using Rows = std::vector<std::vector<int64_t>>;

// Head rows padded to max(pad_to, longest row) tokens with `fill` (the padding content must not matter).
struct PaddedHeads {
  int64_t B = 0, N = 0;
  std::vector<int64_t> heads, lengths;

  PaddedHeads(const Rows& rows, int64_t pad_to, int64_t fill) {
    B = static_cast<int64_t>(rows.size());
    N = pad_to;
    for (const auto& row : rows) N = std::max<int64_t>(N, static_cast<int64_t>(row.size()));
    heads.assign(static_cast<size_t>(B * N), fill);
    for (int64_t b = 0; b < B; ++b) {
      lengths.push_back(static_cast<int64_t>(rows[b].size()));
      std::copy(rows[b].begin(), rows[b].end(), heads.begin() + b * N);
    }
  }
};

}  // namespace syntaxkernels_test

#define EXPECT(condition)                                                                \
  do {                                                                                   \
    if (!(condition)) {                                                                  \
      std::fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #condition);      \
      ++syntaxkernels_test::failures;                                                    \
    }                                                                                    \
  } while (0)
