// Runs one function per batch item on a few threads, reporting the lowest bad item's error.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace syntaxkernels {

// Runs item(b, workspace) for every b in [0, B) on up to `threads` threads, each with its own default-built
// Workspace. item returns "" or an error message. Items are claimed in increasing order and a worker stops at
// its first bad item or once it claims an item past the lowest bad one found so far, so every item below the
// lowest bad one is done and the error thrown (std::invalid_argument) is the lowest bad item's, whatever the
// interleaving. An exception thrown by item stops every worker and is rethrown.
template <typename Workspace>
void for_each_item(int64_t B, int64_t threads, const std::function<std::string(int64_t, Workspace&)>& item) {
  if (threads <= 1) {
    Workspace workspace;
    for (int64_t b = 0; b < B; ++b) {
      std::string message = item(b, workspace);
      if (!message.empty()) throw std::invalid_argument(message);
    }
    return;
  }
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> first_bad{B};
  struct Outcome {
    int64_t b = -1;
    std::string message;
    std::exception_ptr exception;
  };
  std::vector<Outcome> outcomes(static_cast<size_t>(threads));
  auto worker = [&](Outcome& outcome) {
    try {
      Workspace workspace;
      for (;;) {
        const int64_t b = next.fetch_add(1);
        if (b >= B || b > first_bad.load()) return;
        std::string message = item(b, workspace);
        if (!message.empty()) {
          outcome.b = b;
          outcome.message = std::move(message);
          int64_t seen = first_bad.load();
          while (b < seen && !first_bad.compare_exchange_weak(seen, b)) {
          }
          return;
        }
      }
    } catch (...) {
      outcome.exception = std::current_exception();
      first_bad.store(-1);  // stop everyone
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads - 1));
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(worker, std::ref(outcomes[static_cast<size_t>(t)]));
  worker(outcomes[0]);
  for (auto& thread : pool) thread.join();

  const Outcome* lowest = nullptr;
  for (const Outcome& outcome : outcomes) {
    if (outcome.exception) std::rethrow_exception(outcome.exception);
    if (outcome.b >= 0 && (lowest == nullptr || outcome.b < lowest->b)) lowest = &outcome;
  }
  if (lowest != nullptr) throw std::invalid_argument(lowest->message);
}

}  // namespace syntaxkernels
