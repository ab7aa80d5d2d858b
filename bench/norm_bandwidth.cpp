// bench/norm_bandwidth.cpp — effective memory bandwidth of the row-wise kernels
// (softmax, log_softmax, layer_norm, cross_entropy), forward and backward, on
// the GPU, as a fraction of a device-to-device copy measured in the same run.
//
// The one design idea: these ops are bandwidth-bound, so each is scored by the
// fewest bytes it must move (every input read once, every output written once)
// over its time. 100 % of the copy is as fast as the memory allows; anything
// the kernels move beyond that minimum (a second sweep of a row, an f32
// intermediate, an extra kernel) shows up as a lower fraction. Minimum bytes,
// with E = rows·cols elements of b bytes:
//
//   softmax, log_softmax  fwd  x → y                                   2·E·b
//                         bwd  y, dy → dx                              3·E·b
//   layer_norm            fwd  x, weight, bias → y, mean, rstd (f32)   2·E·b + 2·cols·b + 8·rows
//                         bwd  dy, x, mean, rstd, weight → dx,         3·E·b + 3·cols·b + 8·rows
//                              dweight, dbias
//   (ln 2-pass: f32 layer_norm's backward with clusters off, on sm_90 at rows > 8192: the path of other devices
//   and of 16-bit rows)
//   cross_entropy (mean)  fwd  logits, target (i64) → loss             E·b + 8·rows + b
//                         bwd  logits, target, dloss → dlogits         2·E·b + 8·rows + b
//
// The kernels are called through their entry points (ops/backend/kernels.h:
// the device's table, after its invariants), never through the tape. cross_entropy is the sequence of
// kernels ops/loss.cpp issues for (N, C) logits (the fused cross_entropy
// kernel with its one-block sum of the rows, the cast of the mean to the
// logits' dtype; in the backward the fused cross_entropy_backward, which
// divides dy by the count itself), replayed here
// and checked once against mt::cross_entropy and its autograd gradient.
//
// Timing: CUDA events on the current stream (the one the kernels launch on),
// warm-up, then the median of kRuns runs queued back to back (so host time
// counts only where the host is slower than the GPU). Before each run a read
// of a buffer 4x the L2 size evicts the inputs from L2 (a read, not a write:
// dirty lines would be written back inside the next timed run). Outputs are
// allocated by each call through the caching allocator, a cache hit after the
// warm-up. Inputs are mixtape's randn (labels: randint). randn draws on the
// host (about 60 ns an element on one core), so each input is a draw of
// kDrawElems values repeated on the device to the largest shape, then cast;
// smaller shapes view a prefix. Repeats change no byte counts: every element
// is still read from its own address.
#include <mixtape/core/device_memory.h>
#include <mixtape/core/raw.h>
#include <mixtape/core/storage.h>
#include <mixtape/mixtape.h>
#include <mixtape/cuda/stream.h>
#include <mixtape/ops/backend/kernels.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace mt = mixtape;
namespace mk = mixtape::kernels;
using mt::DType;
using mt::Tensor;

namespace {

/// Every dim of `t`: the dims of a full reduction.
std::vector<int64_t> all_dims(const Tensor& t) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < t.dim(); ++d) dims.push_back(d);
  return dims;
}

constexpr int64_t kRows = 16384;
constexpr int64_t kCols[] = {1024, 4096, 32768};
constexpr DType kDtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
constexpr int kWarmup = 3;
constexpr int kRuns = 25;
constexpr int64_t kDrawElems = int64_t{1} << 25;  // randn values per input, repeated up to rows·max(cols)
constexpr int64_t kCopyBytes = int64_t{1} << 30;  // the copy baseline: 1 GiB read + 1 GiB written
constexpr double kEps = 1e-5;

const mt::Device kDev = mt::Device::cuda(0);

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// --once: every case runs once, untimed, so that a profiler (bench/gpu_session.sh profile: ncu) sees each kernel once.
bool g_once = false;

/// Times calls of `run` on the current stream with CUDA events; the median in microseconds. Throws (mixtape::Error)
/// when a launch or a kernel failed, so a failing kernel is reported, not timed.
class Timer {
 public:
  explicit Timer(Tensor flush) : m_flush(std::move(flush)) {}

  double median_us(const std::function<void()>& run) const {
    if (g_once) {  // for a profiler: one call, no timing
      run();
      mt::cuda::synchronize();
      return 0;
    }
    const mt::cuda::Stream stream = mt::cuda::current_stream();
    for (int i = 0; i < kWarmup; ++i) run();
    mt::cuda::synchronize();
    std::vector<mt::cuda::Event> start, stop;
    start.reserve(kRuns);
    stop.reserve(kRuns);
    for (int i = 0; i < kRuns; ++i) {
      flush_l2();
      start.emplace_back(true);
      start.back().record(stream);
      run();
      stop.emplace_back(true);
      stop.back().record(stream);
    }
    mt::cuda::synchronize();
    std::vector<double> us;
    for (int i = 0; i < kRuns; ++i) us.push_back(1e3 * start[i].elapsed_ms(stop[i]));
    return median(us);
  }

 private:
  void flush_l2() const { (void)mk::reduce(mk::ReduceOp::kSum, m_flush, all_dims(m_flush), false, m_flush.dtype()); }

  Tensor m_flush;  // (4·L2 bytes / 4) f32, read before every timed run
};

/// `numel` f32 values on the device: one randn draw of kDrawElems, repeated (numel a multiple of it, or smaller).
Tensor repeated_randn(int64_t numel) {
  const int64_t block = std::min(numel, kDrawElems);
  MT_CHECK(numel % block == 0, "repeated_randn: ", numel, " is not a multiple of ", block);
  const auto f32 = mt::TensorOptions(DType::kF32).device(kDev);
  const Tensor draw = mt::randn({1, block}, f32);
  const Tensor all = mt::empty({numel / block, block}, f32);
  mt::raw::copy_(all, draw);  // broadcast along dim 0
  return mt::raw::reshape(all, {numel});
}

/// Throws when `t` holds a NaN or an infinity (its f32 sum is then not finite).
void check_finite(const Tensor& t, const char* what) {
  const float s = mk::reduce(mk::ReduceOp::kSum, t, all_dims(t), false, DType::kF32).item<float>();
  MT_CHECK(std::isfinite(s), what, ": output of shape ", t.shape(), " (", t.dtype(), ") is not finite (sum ", s, ")");
}

// ---- cross_entropy: the kernels ops/loss.cpp issues (mean reduction, ignore_index -100, no smoothing) -----------

constexpr int64_t kIgnoreIndex = -100;

struct CrossEntropySaved {
  Tensor loss;    // 0-d, the logits' dtype
  Tensor logits;  // (N, C)
  Tensor target;  // (N) i64
  Tensor lse;     // (N) f32 log-sum-exp per row
  Tensor count;   // 0-d f32: rows counted by the mean
};

/// CrossEntropy::forward of ops/loss.cpp for logits (N, C) and target (N), without the tape.
CrossEntropySaved cross_entropy_forward(const Tensor& logits, const Tensor& target) {
  CrossEntropySaved s;
  const mk::CrossEntropyResult r = mk::cross_entropy(logits, target, kIgnoreIndex, 0.0);
  s.count = r.count;
  s.loss = mt::raw::to(r.mean, logits.dtype());
  s.logits = logits;
  s.target = target;
  s.lse = r.lse;
  return s;
}

/// CrossEntropy::backward of ops/loss.cpp: dlogits (N, C) in the logits' dtype from dloss (0-d).
Tensor cross_entropy_backward(const CrossEntropySaved& s, const Tensor& dloss) {
  return mk::cross_entropy_backward(s.logits, s.target, s.lse, dloss, kIgnoreIndex, 0.0, s.count);
}

/// Whether the replay above gives mt::cross_entropy's loss and gradient (the same kernels: equal bits); a line
/// saying how they differ otherwise. Outside the timing.
std::string check_cross_entropy_replay(const Tensor& logits, const Tensor& target) {
  Tensor leaf = mt::raw::clone(logits).requires_grad_();
  const Tensor loss = mt::cross_entropy(leaf, target);
  loss.backward();
  const CrossEntropySaved s = cross_entropy_forward(logits, target);
  const Tensor dx = cross_entropy_backward(s, mt::ones_like(s.loss));
  const float a = mt::raw::to(loss, DType::kF32).item<float>(), b = mt::raw::to(s.loss, DType::kF32).item<float>();
  const Tensor diff = mk::binary(mk::BinaryOp::kSub, mt::raw::to(leaf.grad(), DType::kF32), mt::raw::to(dx, DType::kF32));
  const float max_diff =
      mk::reduce(mk::ReduceOp::kMax, mk::unary(mk::UnaryOp::kAbs, diff), all_dims(diff), false, DType::kF32).item<float>();
  if (a == b && max_diff == 0) return {};
  char line[256];
  std::snprintf(line, sizeof line, "loss %.9g (replay) vs %.9g (mt::cross_entropy), max |dlogits difference| %.3g", b,
                a, max_diff);
  return line;
}

// ---- the table ------------------------------------------------------------------------------------------------

struct Result {
  std::string op;
  DType dtype;
  int64_t cols;
  const char* direction;
  double bytes = 0;
  double us = 0;
  std::string error;  // non-empty: the case failed and was not timed
};

void print_table(const std::vector<Result>& results, double copy_gbps) {
  std::printf("\n%-14s %-5s %6s %-4s %11s %9s %8s\n", "op", "dtype", "cols", "dir", "time us", "GB/s", "% copy");
  for (const Result& r : results) {
    std::printf("%-14s %-5s %6lld %-4s ", r.op.c_str(), mt::dtype_name(r.dtype), static_cast<long long>(r.cols),
                r.direction);
    if (!r.error.empty()) {
      std::printf("FAILED: %s\n", r.error.c_str());
      continue;
    }
    const double gbps = r.bytes / (r.us * 1e-6) / 1e9;
    std::printf("%11.1f %9.1f %7.1f%%\n", r.us, gbps, 100.0 * gbps / copy_gbps);
  }
}

}  // namespace

int main(int argc, char** argv) {
  g_once = argc > 1 && std::string(argv[1]) == "--once";
  if (!mt::cuda::is_available()) {
    std::printf("bench_gpu_norms: no CUDA device (%s); nothing measured.\n", mt::cuda::unavailable_reason().c_str());
    return 0;
  }
  const auto wall0 = std::chrono::steady_clock::now();
  const mt::cuda::DeviceProperties props = mt::cuda::device_properties(0);
  mt::cuda::set_device(0);
  std::printf("bench_gpu_norms: %s, sm_%d%d, %d SMs, %.1f GiB, L2 %.0f MiB\n", props.name.c_str(), props.major,
              props.minor, props.multiprocessor_count, static_cast<double>(props.total_memory) / (1 << 30),
              static_cast<double>(props.l2_cache_bytes) / (1 << 20));
  std::printf("%lld rows; median of %d runs after %d warm-up, L2 flushed before each run\n",
              static_cast<long long>(kRows), kRuns, kWarmup);

  const int64_t flush_bytes = std::max<int64_t>(int64_t{4} * static_cast<int64_t>(props.l2_cache_bytes), 256 << 20);
  const Timer timer(mt::zeros({flush_bytes / 4}, mt::TensorOptions(DType::kF32).device(kDev)));

  // The copy baseline: cudaMemcpyAsync device to device (the CUDA backend's copy_bytes) on the current stream.
  double copy_gbps = 0;
  try {
    const Tensor src = mt::full({kCopyBytes / 4}, 1.0, mt::TensorOptions(DType::kF32).device(kDev));
    const Tensor dst = mt::empty({kCopyBytes / 4}, mt::TensorOptions(DType::kF32).device(kDev));
    mt::DeviceMemory& cuda = mt::device_memory(kDev);
    const double us = timer.median_us(
        [&] { cuda.copy_bytes(dst.data_ptr(), kDev, src.data_ptr(), kDev, static_cast<size_t>(kCopyBytes)); });
    copy_gbps = 2.0 * static_cast<double>(kCopyBytes) / (us * 1e-6) / 1e9;
    std::printf("copy: cudaMemcpyAsync D2D of %lld MiB in %.1f us: %.1f GB/s (read + written)\n",
                static_cast<long long>(kCopyBytes >> 20), us, copy_gbps);
  } catch (const std::exception& e) {
    std::printf("bench_gpu_norms: the copy baseline failed: %s\n", e.what());
    return 1;
  }
  mt::cuda::empty_cache();

  // Inputs of the largest shape; the smaller ones view a prefix.
  const int64_t max_cols = *std::max_element(std::begin(kCols), std::end(kCols));
  const Tensor x_all = repeated_randn(kRows * max_cols);
  const Tensor dy_all = repeated_randn(kRows * max_cols);
  std::printf("inputs drawn in %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count());

  std::vector<Result> results;
  auto measure = [&](const char* op, DType dtype, int64_t cols, const char* direction, double bytes,
                     const std::function<Tensor()>& call) {
    Result r{op, dtype, cols, direction, bytes, 0, {}};
    try {
      r.us = timer.median_us([&] { (void)call(); });
      check_finite(call(), op);
    } catch (const std::exception& e) {
      r.error = e.what();
      std::printf("  %s %s %lld %s FAILED: %s\n", op, mt::dtype_name(dtype), static_cast<long long>(cols), direction,
                  e.what());
    }
    results.push_back(std::move(r));
  };

  for (const int64_t C : kCols) {
    const int64_t E = kRows * C;
    const mt::Shape shape{kRows, C};
    const Tensor x32 = mt::raw::reshape(mt::raw::slice(x_all, 0, 0, E), shape);
    const Tensor dy32 = mt::raw::reshape(mt::raw::slice(dy_all, 0, 0, E), shape);
    const Tensor target = mt::randint(0, C, {kRows}, mt::TensorOptions(DType::kI64).device(kDev));
    for (const DType dt : kDtypes) {
      const auto opts = mt::TensorOptions(dt).device(kDev);
      const double b = static_cast<double>(mt::itemsize(dt)), e = static_cast<double>(E);
      const double n = static_cast<double>(kRows), c = static_cast<double>(C);
      try {
        const Tensor x = dt == DType::kF32 ? x32 : mt::raw::to(x32, dt);
        const Tensor dy = dt == DType::kF32 ? dy32 : mt::raw::to(dy32, dt);

        for (const bool log : {false, true}) {
          const char* op = log ? "log_softmax" : "softmax";
          measure(op, dt, C, "fwd", 2 * e * b, [&] { return mk::softmax(x, 1, log, x.dtype()); });
          const Tensor y = mk::softmax(x, 1, log, x.dtype());
          measure(op, dt, C, "bwd", 3 * e * b, [&] { return mk::softmax_backward(dy, y, 1, log); });
        }

        const Tensor weight = mt::randn({C}, opts), bias = mt::randn({C}, opts);
        measure("layer_norm", dt, C, "fwd", 2 * e * b + 2 * c * b + 8 * n,
                [&] { return mk::layer_norm(x, C, weight, bias, kEps).y; });
        {
          const mk::LayerNormResult r = mk::layer_norm(x, C, weight, bias, kEps);
          measure("layer_norm", dt, C, "bwd", 3 * e * b + 3 * c * b + 8 * n, [&] {
            return mk::layer_norm_backward(dy, x, r.mean, r.rstd, weight, /*bias_defined=*/true).dx;
          });
          if (dt == DType::kF32 && C > 8192 && props.major >= 9) {  // what the cluster kernel gains, same run
            mt::cuda::set_allow_clusters(false);
            measure("ln 2-pass", dt, C, "bwd", 3 * e * b + 3 * c * b + 8 * n, [&] {
              return mk::layer_norm_backward(dy, x, r.mean, r.rstd, weight, /*bias_defined=*/true).dx;
            });
            mt::cuda::set_allow_clusters(true);
          }
        }

        if (C == kCols[0]) {
          const std::string diff = check_cross_entropy_replay(x, target);
          std::printf("cross_entropy replay vs mt::cross_entropy (%s, %lld cols): %s\n", mt::dtype_name(dt),
                      static_cast<long long>(C), diff.empty() ? "loss and dlogits bit-equal" : diff.c_str());
          if (!diff.empty()) std::printf("  WARNING: update bench/norm_bandwidth.cpp to follow ops/loss.cpp\n");
        }
        measure("cross_entropy", dt, C, "fwd", e * b + 8 * n + b,
                [&] { return cross_entropy_forward(x, target).loss; });
        {
          const CrossEntropySaved s = cross_entropy_forward(x, target);
          const Tensor dloss = mt::ones_like(s.loss);
          measure("cross_entropy", dt, C, "bwd", 2 * e * b + 8 * n + b,
                  [&] { return cross_entropy_backward(s, dloss); });
        }
      } catch (const std::exception& ex) {  // inputs or a check outside `measure`
        results.push_back({"(setup)", dt, C, "-", 0, 0, ex.what()});
        std::printf("  %s %lld setup FAILED: %s\n", mt::dtype_name(dt), static_cast<long long>(C), ex.what());
      }
    }
    mt::cuda::empty_cache();
  }

  std::printf("\ncopy baseline: %.1f GB/s; GB/s = minimum bytes (see bench/norm_bandwidth.cpp) / median time\n",
              copy_gbps);
  print_table(results, copy_gbps);
  std::printf("\ntotal %.1f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count());
  const bool failed = std::any_of(results.begin(), results.end(), [](const Result& r) { return !r.error.empty(); });
  return failed ? 1 : 0;
}
