// bench/mnist_cpu.cpp — one epoch of examples/mnist's MLP and CNN on the CPU, mixtape against LibTorch in the same
// run, and mixtape's GEMM throughput against cblas_sgemm alone.
//
// What is measured, per model (mlp, cnn) and precision (fp32, bf16): the seconds of one training epoch (468 steps
// of 128 shuffled samples, drop_last; AdamW lr 1e-3; bf16 by autocast, as examples/mnist trains), from the first
// batch to the last optimizer step, evaluation excluded; then the test accuracy, so that a fast run that did not
// train shows. Both sides use --threads threads (OpenMP and OpenBLAS) and libgomp's default wait policy (spin,
// then sleep): on a quiet machine it is 1.3-2x faster than passive for both. On a machine shared with other work,
// run it with OMP_WAIT_POLICY=passive (the LibTorch child inherits it): spinning threads then cost 10-20x.
//
// The one design idea: the two sides never share a process, and share everything else. The models are
// examples/mnist/models.h itself; this program seeds, builds each model once and writes its initial state_dict
// to a safetensors file, and writes the MNIST splits it loaded (u8 images, i64 labels) to another; the LibTorch
// side (bench_mnist_cpu_libtorch, the same models in torch::nn, parameters named alike) is a child process that
// reads both, so both start from the same parameters and train on the same bytes (each shuffles with its own
// generator), and answers one JSON line: seconds, steps, accuracy.
//
// The GEMM table counts the epoch's GEMM flops from the layer shapes: per step, each linear's forward and weight
// gradient, and its input gradient unless it is the first layer (whose input needs none, so no one computes it);
// a convolution counts as the GEMM over im2col columns with the batch folded in. Divided by mixtape's epoch time,
// that is compared with cblas_sgemm alone timed in this run on preallocated f32 buffers at the same shapes: the
// ceiling a framework could reach if everything but the GEMMs were free. bf16 rows are held against the same f32
// ceiling: above 100% means bf16 products (AVX512-BF16) beat what sgemm could do with those flops; so does a CNN
// whose 3x3 convolutions run by Winograd (a quarter of the im2col GEMM's multiplications, counted as im2col's).
//
// On a VM whose neighbours come and go, one run of each side says little: --repeat N alternates the sides N times
// and the table gives each side's median and every run's ratio. The LibTorch child reports the BLAS it loaded:
// Debian resolves libblas.so.3 through alternatives (the reference BLAS, or an OpenBLAS build), and LibTorch's f32
// GEMMs are that library's, so its fp32 times depend on it: --libtorch-blas reference, openblas-pthread or
// openblas-openmp puts that build first on the child's library path; the default is whatever the machine resolves.
//
//   bench_mnist_cpu                                  # both models, fp32 and bf16, full epochs
//   bench_mnist_cpu --models mlp --max-steps 100     # quicker: times scaled to a full epoch
//   bench_mnist_cpu --models cnn --repeat 5          # five alternating runs of each side, medians
//   bench_mnist_cpu --models cnn --epochs 2 --seed 1 # both sides' accuracy after two epochs from seed 1's weights
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <cblas.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <mixtape/mixtape.h>

#include "child_process.h"
#include "models.h"

extern "C" void openblas_set_num_threads(int) __attribute__((weak));

namespace {

namespace mt = mixtape;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int64_t kBatch = 128;

/// The Debian BLAS builds --libtorch-blas can put first on the LibTorch child's library path, and where their
/// libblas.so.3 and liblapack.so.3 live (libblas3 + liblapack3, libopenblas0-pthread, libopenblas0-openmp).
const std::map<std::string, std::string> kBlasDirs = {
    {"reference", "/usr/lib/x86_64-linux-gnu/blas:/usr/lib/x86_64-linux-gnu/lapack"},
    {"openblas-pthread", "/usr/lib/x86_64-linux-gnu/openblas-pthread"},
    {"openblas-openmp", "/usr/lib/x86_64-linux-gnu/openblas-openmp"},
};

struct Options {
  std::vector<std::string> models = {"mlp", "cnn"};
  std::vector<std::string> precisions = {"fp32", "bf16"};
  int threads = 2;
  std::string data;
  double epoch_fraction = 1.0;
  int64_t max_steps = 0;  // 0: no bound
  int repeat = 1;         // runs of each side, alternating; medians reported
  int epochs = 1;         // epochs per run: times per epoch, accuracy after the last
  uint64_t seed = 0;      // the initial weights' seed and both sides' shuffling seed
  std::string libtorch_blas = "auto";  // auto: Debian's alternatives; else the directory of kBlasDirs to put first
};

/// One training run of --epochs epochs (or the first `steps` steps of each) on one side.
struct Run {
  double seconds = 0;  // training loop only, all epochs
  int64_t steps = 0;   // all epochs
  double accuracy = 0;  // test set, after the steps
  std::string blas;     // the LibTorch child's BLAS libraries
};

/// The median of `v` (the mean of the middle two for an even count).
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// ---- the mixtape side: examples/mnist/main.cpp's loop ---------------------------------------------------------------

std::optional<mt::DType> autocast_dtype(const std::string& precision) {
  return precision == "bf16" ? std::optional(mt::kBF16) : std::nullopt;
}

double evaluate(mnist::Model& model, const mt::data::MNIST& test, std::optional<mt::DType> autocast) {
  model.eval();
  mt::autograd::NoGradGuard no_grad;
  mt::data::DataLoader loader(test, {.batch_size = 1000});
  int64_t hits = 0;
  for (auto& [x, y] : loader) {
    mt::amp::Autocast ac(autocast.value_or(mt::kBF16), autocast.has_value());
    hits += static_cast<int64_t>(mt::sum(mt::eq(mt::argmax(model.forward(x), 1), y).to(mt::kF32)).item<float>());
  }
  model.train();
  return static_cast<double>(hits) / static_cast<double>(test.size());
}

Run train_mixtape(const std::string& name, const fs::path& weights, const std::string& precision,
                  const mt::data::MNIST& train, const mt::data::MNIST& test, int64_t steps, int epochs,
                  uint64_t seed) {
  std::unique_ptr<mnist::Model> model = mnist::make_model(name);
  model->load_state_dict(mt::data::load_safetensors(weights.string()).tensors);  // the bytes the child reads
  mt::optim::AdamW optimizer(model->parameters(), {.lr = 1e-3});
  const std::optional<mt::DType> autocast = autocast_dtype(precision);
  Run run;
  const auto start = Clock::now();
  mt::data::DataLoader loader(train, {.batch_size = kBatch, .shuffle = true, .drop_last = true, .seed = seed});
  for (int epoch = 0; epoch < epochs; ++epoch) {  // each begin() draws the next epoch's permutation
    int64_t taken = 0;
    for (auto& [x, y] : loader) {
      if (taken == steps) break;
      optimizer.zero_grad();
      mt::Tensor loss;
      {
        mt::amp::Autocast ac(autocast.value_or(mt::kBF16), autocast.has_value());
        loss = mt::cross_entropy(model->forward(x), y);
      }
      loss.backward();
      optimizer.step();
      ++taken;
    }
    run.steps += taken;
  }
  run.seconds = seconds_since(start);
  run.accuracy = evaluate(*model, test, autocast);
  return run;
}

// ---- the LibTorch side: a child process -----------------------------------------------------------------------------

#ifdef MIXTAPE_BENCH_LIBTORCH_PEER
Run train_libtorch(const std::string& name, const std::string& precision, const fs::path& weights,
                   const fs::path& data, int threads, int64_t steps, int epochs, uint64_t seed) {
  const std::string out = bench::run_child(
      {MIXTAPE_BENCH_LIBTORCH_PEER, "--model", name, "--precision", precision, "--threads", std::to_string(threads),
       "--weights", weights.string(), "--data", data.string(), "--max-steps", std::to_string(steps), "--batch-size",
       std::to_string(kBatch), "--seed", std::to_string(seed), "--epochs", std::to_string(epochs)});
  const auto j = nlohmann::json::parse(out);
  return {j.at("seconds").get<double>(), j.at("steps").get<int64_t>(), j.at("accuracy").get<double>(),
          j.value("blas", std::string("unknown"))};
}
#endif

// ---- GEMM flops and the cblas_sgemm ceiling -------------------------------------------------------------------------

/// C (m, n) = op(A) (m, k) · op(B) (k, n), row-major.
struct Gemm {
  int m, n, k;
  CBLAS_TRANSPOSE ta, tb;
  double flops() const { return 2.0 * m * n * k; }
};

/// A linear layer's GEMMs for a batch: y = x·Wᵀ, dW = dyᵀ·x, and dx = dy·W unless its input needs no gradient.
void add_linear(std::vector<Gemm>& g, const mt::nn::Linear& l, int64_t batch, bool input_grad) {
  const int b = static_cast<int>(batch), in = static_cast<int>(l.in_features), out = static_cast<int>(l.out_features);
  g.push_back({b, out, in, CblasNoTrans, CblasTrans});
  g.push_back({out, in, b, CblasTrans, CblasNoTrans});
  if (input_grad) g.push_back({b, in, out, CblasNoTrans, CblasNoTrans});
}

/// A convolution as a GEMM over im2col columns cols (C_in·kH·kW, B·L), L the output pixels of an (h, w) input:
/// y = W·cols, dW = dy·colsᵀ, dcols = Wᵀ·dy unless its input needs no gradient. Returns the output (h, w).
std::pair<int64_t, int64_t> add_conv(std::vector<Gemm>& g, const mt::nn::Conv2d& c, int64_t batch, int64_t h,
                                     int64_t w, bool input_grad) {
  const mt::nn::Conv2dOptions& o = c.options;
  auto out_size = [&](int64_t size, int a) {
    return (size + 2 * o.padding[a] - o.dilation[a] * (o.kernel_size[a] - 1) - 1) / o.stride[a] + 1;
  };
  const int64_t ho = out_size(h, 0), wo = out_size(w, 1);
  const int cols = static_cast<int>(batch * ho * wo), cout = static_cast<int>(o.out_channels),
            k = static_cast<int>(o.in_channels * o.kernel_size[0] * o.kernel_size[1]);
  g.push_back({cout, cols, k, CblasNoTrans, CblasNoTrans});
  g.push_back({cout, k, cols, CblasNoTrans, CblasTrans});
  if (input_grad) g.push_back({k, cols, cout, CblasTrans, CblasNoTrans});
  return {ho, wo};
}

/// The GEMMs of one training step of examples/mnist's models, read off the layers themselves.
std::vector<Gemm> step_gemms(mnist::Model& model, int64_t batch) {
  std::vector<Gemm> g;
  if (auto* mlp = dynamic_cast<mnist::Mlp*>(&model)) {
    add_linear(g, mlp->fc1, batch, false);
    add_linear(g, mlp->fc2, batch, true);
    add_linear(g, mlp->fc3, batch, true);
  } else if (auto* cnn = dynamic_cast<mnist::Cnn*>(&model)) {
    auto [h, w] = add_conv(g, cnn->conv1, batch, 28, 28, false);
    add_conv(g, cnn->conv2, batch, h, w, true);
    add_linear(g, cnn->fc1, batch, true);
    add_linear(g, cnn->fc2, batch, true);
  }
  return g;
}

/// Seconds of cblas_sgemm alone for one step's GEMMs: each shape's median of 7 calls after a warm-up, summed.
double sgemm_step_seconds(const std::vector<Gemm>& gemms) {
  size_t a_size = 0, b_size = 0, c_size = 0;
  for (const Gemm& g : gemms) {
    a_size = std::max(a_size, static_cast<size_t>(g.m) * g.k);
    b_size = std::max(b_size, static_cast<size_t>(g.k) * g.n);
    c_size = std::max(c_size, static_cast<size_t>(g.m) * g.n);
  }
  std::vector<float> a(a_size), b(b_size), c(c_size);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 17) * 0.01f - 0.08f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 13) * 0.01f - 0.06f;
  double total = 0;
  for (const Gemm& g : gemms) {
    const int lda = g.ta == CblasNoTrans ? g.k : g.m, ldb = g.tb == CblasNoTrans ? g.n : g.k;
    std::vector<double> t;
    for (int r = 0; r < 8; ++r) {
      const auto start = Clock::now();
      cblas_sgemm(CblasRowMajor, g.ta, g.tb, g.m, g.n, g.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), g.n);
      if (r > 0) t.push_back(seconds_since(start));
    }
    std::sort(t.begin(), t.end());
    total += t[t.size() / 2];
  }
  return total;
}

// ---- the run --------------------------------------------------------------------------------------------------------

/// A directory under /tmp for the files the child reads, removed with everything in it.
struct TempDir {
  TempDir() {
    char name[] = "/tmp/bench_mnist_cpu-XXXXXX";
    MT_CHECK(mkdtemp(name) != nullptr, "bench_mnist_cpu: cannot create a temporary directory");
    path = name;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  fs::path path;
};

struct Row {
  std::string model, precision;
  Run mixtape;                  // seconds: the median over the runs
  std::optional<Run> libtorch;  // seconds: the median over the runs
  std::vector<double> ratios;   // each run's mixtape / LibTorch time (runs alternate between the sides)
  double gemm_flops_per_step = 0, sgemm_seconds_per_step = 0;
};

int run(const Options& opt) {
  if (opt.libtorch_blas != "auto") {
    // The child inherits the environment (bench/child_process.h); this process has loaded its libraries already.
    const char* old = std::getenv("LD_LIBRARY_PATH");
    std::string path = kBlasDirs.at(opt.libtorch_blas);
    if (old != nullptr && *old != '\0') path += std::string(":") + old;
    setenv("LD_LIBRARY_PATH", path.c_str(), 1);
  }
  omp_set_num_threads(opt.threads);
  if (openblas_set_num_threads != nullptr) openblas_set_num_threads(opt.threads);

  const mt::data::DatasetLocation location = mt::data::find_mnist(opt.data);
  const mt::data::MNIST train(location, mt::data::Split::kTrain);
  const mt::data::MNIST test(location, mt::data::Split::kTest);
  const int64_t epoch_steps = train.size() / kBatch;
  int64_t steps = std::max<int64_t>(1, static_cast<int64_t>(opt.epoch_fraction * static_cast<double>(epoch_steps)));
  if (opt.max_steps > 0) steps = std::min(steps, opt.max_steps);
  // A run's seconds cover opt.epochs epochs of `steps` steps: times this is one full epoch's.
  const double to_epoch = static_cast<double>(epoch_steps) / static_cast<double>(steps * opt.epochs);

  TempDir dir;
#ifdef MIXTAPE_BENCH_LIBTORCH_PEER
  const fs::path data_file = dir.path / "mnist.safetensors";
  {
    mt::StateDict splits;
    splits.insert("train.images", train.images());
    splits.insert("train.labels", train.labels());
    splits.insert("test.images", test.images());
    splits.insert("test.labels", test.labels());
    mt::data::save_safetensors(data_file.string(), splits);
  }
#endif

  std::printf("bench_mnist_cpu: %s, batch %lld, AdamW lr 1e-3, %d threads, seed %llu, %d epoch%s of %lld of %lld "
              "steps%s\n",
              train.name().c_str(), static_cast<long long>(kBatch), opt.threads,
              static_cast<unsigned long long>(opt.seed), opt.epochs, opt.epochs == 1 ? "" : "s",
              static_cast<long long>(steps), static_cast<long long>(epoch_steps),
              steps < epoch_steps ? " (times scaled to a full epoch)" : "");
  std::fflush(stdout);
  std::vector<Row> rows;
  for (const std::string& name : opt.models) {
    mt::manual_seed(opt.seed);
    std::unique_ptr<mnist::Model> model = mnist::make_model(name);
    const fs::path weights = dir.path / (name + ".safetensors");
    mt::data::save_safetensors(weights.string(), model->state_dict());
    const std::vector<Gemm> gemms = step_gemms(*model, kBatch);
    double flops = 0;
    for (const Gemm& g : gemms) flops += g.flops();
    const double sgemm_seconds = sgemm_step_seconds(gemms);
    for (const std::string& precision : opt.precisions) {
      Row row{name, precision, {}, {}, {}, flops, sgemm_seconds};
      std::vector<double> mt_seconds, lt_seconds;
      for (int r = 0; r < opt.repeat; ++r) {
        std::fprintf(stderr, "  %s %s, run %d of %d: mixtape...", name.c_str(), precision.c_str(), r + 1, opt.repeat);
        row.mixtape = train_mixtape(name, weights, precision, train, test, steps, opt.epochs, opt.seed);
        mt_seconds.push_back(row.mixtape.seconds);
#ifdef MIXTAPE_BENCH_LIBTORCH_PEER
        std::fprintf(stderr, " LibTorch...");
        row.libtorch = train_libtorch(name, precision, weights, data_file, opt.threads, steps, opt.epochs, opt.seed);
        lt_seconds.push_back(row.libtorch->seconds);
        row.ratios.push_back(row.mixtape.seconds / row.libtorch->seconds);
#endif
        std::fprintf(stderr, " done\n");
      }
      row.mixtape.seconds = median(mt_seconds);
      if (row.libtorch) row.libtorch->seconds = median(lt_seconds);
      rows.push_back(row);
    }
  }

  std::printf("\n| model | precision | mixtape s/epoch | samples/s | LibTorch s/epoch | samples/s | mixtape/LibTorch "
              "time | per-run ratios | accuracy mixtape | accuracy LibTorch |\n"
              "|---|---|---:|---:|---:|---:|---:|---|---:|---:|\n");
  for (const Row& r : rows) {
    const double mt_s = r.mixtape.seconds * to_epoch, mt_rate = r.mixtape.steps * kBatch / r.mixtape.seconds;
    std::printf("| %s | %s | %.2f | %.0f | ", r.model.c_str(), r.precision.c_str(), mt_s, mt_rate);
    if (r.libtorch) {
      const double lt_s = r.libtorch->seconds * to_epoch, lt_rate = r.libtorch->steps * kBatch / r.libtorch->seconds;
      std::string ratios;
      for (double q : r.ratios) ratios += (ratios.empty() ? "" : " ") + std::to_string(q).substr(0, 4);
      std::printf("%.2f | %.0f | %.2fx | %s | %.2f%% | %.2f%% |\n", lt_s, lt_rate, mt_s / lt_s, ratios.c_str(),
                  100 * r.mixtape.accuracy, 100 * r.libtorch->accuracy);
    } else {
      std::printf("— | — | — | — | %.2f%% | — |\n", 100 * r.mixtape.accuracy);
    }
  }
  if (!rows.empty() && rows.front().libtorch)
    std::printf("\nLibTorch's BLAS: %s\n", rows.front().libtorch->blas.c_str());
  std::printf("\n| model | precision | GEMM GFLOP/epoch | mixtape GEMM GFLOP/s | LibTorch GEMM GFLOP/s | cblas_sgemm "
              "alone GFLOP/s | mixtape / sgemm |\n|---|---|---:|---:|---:|---:|---:|\n");
  for (const Row& r : rows) {
    const double per_epoch = r.gemm_flops_per_step * static_cast<double>(epoch_steps);
    const double mt_rate = r.gemm_flops_per_step * r.mixtape.steps / r.mixtape.seconds;
    const double ceiling = r.gemm_flops_per_step / r.sgemm_seconds_per_step;
    std::printf("| %s | %s | %.1f | %.1f | ", r.model.c_str(), r.precision.c_str(), per_epoch * 1e-9, mt_rate * 1e-9);
    if (r.libtorch)
      std::printf("%.1f | ", r.gemm_flops_per_step * r.libtorch->steps / r.libtorch->seconds * 1e-9);
    else
      std::printf("— | ");
    std::printf("%.1f | %.0f%% |\n", ceiling * 1e-9, 100 * mt_rate / ceiling);
  }
#ifndef MIXTAPE_BENCH_LIBTORCH_PEER
  std::printf("\n(LibTorch was not found when this was configured: apt-get install libtorch-dev, then reconfigure.)\n");
#endif
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"One epoch of examples/mnist's models on the CPU: mixtape against LibTorch, GEMMs against sgemm.",
               "bench_mnist_cpu"};
  app.option_defaults()->always_capture_default();
  app.add_option("--models", opt.models, "models to train")->delimiter(',')->check(CLI::IsMember({"mlp", "cnn"}));
  app.add_option("--precisions", opt.precisions, "precisions")->delimiter(',')->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--threads", opt.threads, "CPU threads of both sides (OpenMP, OpenBLAS)")->check(CLI::PositiveNumber);
  app.add_option("--data", opt.data, "the MNIST directory [default: $MIXTAPE_MNIST_DIR, ./data/mnist, ...]");
  app.add_option("--epochs-fraction", opt.epoch_fraction, "train this fraction of an epoch")
      ->check(CLI::Range(1e-6, 1.0));
  app.add_option("--libtorch-blas", opt.libtorch_blas,
                 "the LibTorch child's BLAS: auto (libblas.so.3 as Debian's alternatives resolve it), or one build put "
                 "first on its LD_LIBRARY_PATH: reference, openblas-pthread, openblas-openmp (if installed)")
      ->check(CLI::IsMember({"auto", "reference", "openblas-pthread", "openblas-openmp"}));
  app.add_option("--repeat", opt.repeat, "runs of each side, alternating (the table shows medians)")
      ->check(CLI::PositiveNumber);
  app.add_option("--epochs", opt.epochs, "epochs per run (times per epoch; the accuracy after the last)")
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", opt.seed, "the initial weights' and the shuffling's seed (each side its own generator)");
  app.add_option("--max-steps", opt.max_steps, "train at most this many steps per epoch (0: no bound)")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    return run(opt);
  } catch (const std::exception& e) {
    std::cerr << "bench_mnist_cpu: error: " << e.what() << '\n';
    return 1;
  }
}
