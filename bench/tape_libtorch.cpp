// bench/tape_libtorch.cpp — the LibTorch side of bench_tape: the same chain of 1-element f32 muls through
// LibTorch's C++ autograd, timed the same way (ns per op without recording, with recording, per backward node;
// median of the runs).
//
// The one design idea: a child process of bench_tape, never linked with mixtape (two OpenMP runtimes in one
// process would make both timings suspect). bench_tape passes the chain length and the run count, so both sides
// time the same graph; this program answers one JSON line on stdout.
//
//   bench_tape_libtorch 1000 51
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double ns_since(Clock::time_point t0, int n) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / n;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: bench_tape_libtorch CHAIN REPEATS\n";
    return 2;
  }
  const int chain = std::stoi(argv[1]), repeats = std::stoi(argv[2]);
  torch::Tensor w = torch::full({1}, 1.0001, torch::kFloat32).requires_grad_();
  const torch::Tensor c = torch::full({1}, 0.9999, torch::kFloat32);
  std::vector<double> plain, record, backward;
  for (int r = 0; r < repeats; ++r) {
    {
      torch::NoGradGuard ng;
      auto t0 = Clock::now();
      torch::Tensor h = w;
      for (int i = 0; i < chain; ++i) h = torch::mul(h, c);
      plain.push_back(ns_since(t0, chain));
    }
    auto t0 = Clock::now();
    torch::Tensor h = w;
    for (int i = 0; i < chain; ++i) h = torch::mul(h, c);
    record.push_back(ns_since(t0, chain));
    torch::Tensor loss = h.sum();
    auto t1 = Clock::now();
    loss.backward();
    backward.push_back(ns_since(t1, chain + 1));
    w.mutable_grad() = torch::Tensor();  // as mixtape's w.set_grad({}): the next backward allocates it again
  }
  const nlohmann::json result = {
      {"plain_ns", median(plain)}, {"record_ns", median(record)}, {"backward_ns", median(backward)}};
  std::printf("%s\n", result.dump().c_str());
  return 0;
}
