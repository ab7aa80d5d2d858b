// bench/tape.cpp — what the tape costs: nanoseconds to record one node of a
// tiny op, and to run one node's backward, on the CPU.
//
// The op is a 1-element mul, so kernel time is negligible and the numbers are
// the engine's own overhead (precision rule, node allocation, edges, saved
// tensors, the walk). Compared in the same run against the same op with
// recording off (NoGradGuard): the difference is the price of the tape.
#include <mixtape/mixtape.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

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

}  // namespace

int main() {
  mt::Tensor w = mt::full({1}, 1.0001).requires_grad_();
  mt::Tensor c = mt::full({1}, 0.9999);
  std::vector<double> plain, record, backward;
  for (int r = 0; r < kRepeats; ++r) {
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
  double p = median(plain), rec = median(record), b = median(backward);
  std::printf("tape cost on the CPU (1-element f32 mul, chain of %d nodes, median of %d runs)\n", kChain, kRepeats);
  std::printf("  op without recording (NoGradGuard): %8.0f ns/op\n", p);
  std::printf("  op with recording:                  %8.0f ns/op  (recording adds %.0f ns/node)\n", rec, rec - p);
  std::printf("  backward:                           %8.0f ns/node\n", b);
  return 0;
}
