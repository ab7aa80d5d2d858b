// bench/tape.cpp — what the tape costs: nanoseconds to record one node of a
// tiny op, and to run one node's backward, on the CPU; against LibTorch's C++
// autograd in the same run.
//
// The op is a 1-element mul, so kernel time is negligible and the numbers are
// the engine's own overhead (precision rule, node allocation, edges, saved
// tensors, the walk). Compared in the same run against the same op with
// recording off (NoGradGuard): the difference is the price of the tape.
// LibTorch times the same chain the same way in a child process
// (bench_tape_libtorch, built when Torch is found: it never shares a process
// with mixtape); the target is mixtape's tape cost per op (recording
// plus backward) at most 0.5x LibTorch's. Last, the same chain inside an amp::Inspect scope (the numerics
// inspector's price when on; off, it is in the rows above).
#include <mixtape/mixtape.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "child_process.h"

namespace mt = mixtape;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kChain = 1000;  // nodes per graph
constexpr int kRepeats = 51;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double ns_since(Clock::time_point t0, int n) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / n;
}

/// Medians in ns: the op without recording, with recording (per op), backward (per node).
struct TapeCost {
  double plain, record, backward;
  double recording() const { return record - plain; }
  double tape() const { return recording() + backward; }  // what the tape adds to one op, both passes
};

/// `inspect`: the chain runs inside an amp::Inspect scope (two statistics kernels per op and node).
TapeCost measure_mixtape(bool inspect = false) {
  mt::Tensor w = mt::full({1}, 1.0001).requires_grad_();
  mt::Tensor c = mt::full({1}, 0.9999);
  std::vector<double> plain, record, backward;
  for (int r = 0; r < kRepeats; ++r) {
    std::optional<mt::amp::Inspect> inspecting;
    if (inspect) inspecting.emplace();
    {
      mt::autograd::NoGradGuard ng;
      auto t0 = Clock::now();
      mt::Tensor h = w;
      for (int i = 0; i < kChain; ++i) h = mt::mul(h, c);
      plain.push_back(ns_since(t0, kChain));
    }
    auto t0 = Clock::now();
    mt::Tensor h = w;
    for (int i = 0; i < kChain; ++i) h = mt::mul(h, c);
    record.push_back(ns_since(t0, kChain));
    mt::Tensor loss = mt::sum(h);
    auto t1 = Clock::now();
    loss.backward();
    backward.push_back(ns_since(t1, kChain + 1));
    w.set_grad({});
  }
  return {median(plain), median(record), median(backward)};
}

std::optional<TapeCost> measure_libtorch() {
#ifdef MIXTAPE_BENCH_LIBTORCH_PEER
  const auto j = nlohmann::json::parse(
      bench::run_child({MIXTAPE_BENCH_LIBTORCH_PEER, std::to_string(kChain), std::to_string(kRepeats)}));
  return TapeCost{j.at("plain_ns").get<double>(), j.at("record_ns").get<double>(), j.at("backward_ns").get<double>()};
#else
  return std::nullopt;
#endif
}

}  // namespace

int main() {
  try {
    const TapeCost m = measure_mixtape();
    const std::optional<TapeCost> t = measure_libtorch();
    const TapeCost inspected = measure_mixtape(/*inspect=*/true);
    // One row: a quantity of both sides, and their ratio.
    auto row = [&](const char* what, auto value) {
      if (t)
        std::printf("| %s | %.0f | %.0f | %.2fx |\n", what, value(m), value(*t), value(m) / value(*t));
      else
        std::printf("| %s | %.0f | — | — |\n", what, value(m));
    };
    std::printf("tape cost on the CPU (1-element f32 mul, chain of %d nodes, median of %d runs)\n\n", kChain,
                kRepeats);
    std::printf("| ns | mixtape | LibTorch | mixtape/LibTorch |\n|---|---:|---:|---:|\n");
    row("op without recording (NoGradGuard), per op", [](const TapeCost& c) { return c.plain; });
    row("op with recording, per op", [](const TapeCost& c) { return c.record; });
    row("recording adds, per node", [](const TapeCost& c) { return c.recording(); });
    row("backward, per node", [](const TapeCost& c) { return c.backward; });
    row("tape cost per op: recording + backward (target <= 0.5x)", [](const TapeCost& c) { return c.tape(); });
    row("op with recording + backward, per op", [](const TapeCost& c) { return c.record + c.backward; });
    if (!t) std::printf("\n(LibTorch was not found when this was configured: apt-get install libtorch-dev.)\n");
    // The numerics inspector costs nothing when no amp::Inspect is alive (the rows above); inside one, each op and
    // node also launches its statistics kernels.
    std::printf("\ninside an amp::Inspect scope (mixtape): op with recording %.0f ns, backward %.0f ns per node\n",
                inspected.record, inspected.backward);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tape: error: %s\n", e.what());
    return 1;
  }
}
