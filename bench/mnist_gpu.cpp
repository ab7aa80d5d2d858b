// bench/mnist_gpu.cpp — mixtape's side of bench/mnist_gpu.py: examples/mnist's MLP or CNN trained on one device
// with the whole dataset resident there, timed the way the PyTorch side is timed, answered as one JSON line.
//
// What is measured, for one model and precision (fp32; fp16 by autocast and the GradScaler; bf16 by autocast):
// --epochs epochs of batch --batch-size, AdamW lr 1e-3, drop_last. The training set is normalised once and lives
// on the device as one (60000, 1, 28, 28) f32 tensor; each epoch draws its permutation there (mixtape::randperm)
// and each step gathers its batch with index_select there, as examples/mnist does on a GPU, so a step reads
// nothing from the host (under fp16 the GradScaler's skip is decided on the device: step_on_device).
//   step_ms      the steady-state step: the device synchronised after --warmup steps of the first epoch and after
//                its last step, the steps between averaged (no synchronisation in between)
//   epoch_s      the mean wall time of an epoch, the first (warm-up) epoch included
//   peak_mib     the most bytes tensors asked for at once during training, less the dataset's (mixtape::cuda's
//                requested_bytes: the model's footprint whatever the allocator; PyTorch's requested_bytes)
//   held_mib     what tensors still ask for after the last step, less the dataset's: the parameters, gradients and
//                optimizer and scaler states; peak_mib − held_mib is what a step's activations and temporaries added
//   kept_mib     what the forward (under autocast) leaves for backward: the tensors alive after it less those
//                alive before it, in the second step (eager, a warm-up one unless --warmup < 2): the activations
//                and whatever else the tape saved
//   alloc_peak_mib, reserved_peak_mib  the same peak in the caching allocator's blocks (size classes) and in what
//                it took from cudaMalloc, less the dataset's (cuda/runtime.h, MemoryStats)
//   accuracy     the test set's after the last epoch (batches of 1000 under the same autocast)
//   graph_nodes  with --cuda-graph, the kernels and copies of the captured step (null without): the launches an
//                eager step makes, over which the eager step's extra time is spread
// On the CPU (--device cpu) the same loop runs, for checking the plumbing without a GPU; peak_mib, held_mib and
// kept_mib count the CPU's tensor storage the same way (mixtape::cpu_memory_stats), reserved_peak_mib is null: which
// tensors a step keeps alive is the tape's doing on either device, only the kernels' temporaries differ (the CPU's
// convolutions take cache-sized chunks of the batch, the GPU's chunks of at most 10 MiB of columns in f16/bf16 and
// 20 MiB in f32 unless --conv-column-limit-mib).
// --cuda-graph (on CUDA): after three eager steps one step is captured into a CUDA graph and replayed for
// every later step, as examples/mnist --cuda-graph does; the row's framework is "mixtape+graph".
// --conv-column-limit-mib N: mixtape::cuda::set_conv_column_limit(N MiB) instead of the default (each dtype's
// limit), the convolutions' batches in chunks of at most N MiB of columns, or 0: the whole batch as one GEMM (the
// CNN's peak memory against its step time); the row's framework says so.
// --tf32: f32 matrix products and convolutions on the Tensor Cores in TF32 (mixtape::cuda::set_allow_tf32(true));
// the row's framework ends in ", tf32". PyTorch's default runs its convolutions (cuDNN) in TF32 and its matrix
// products in f32: bench/mnist_gpu.py --tf32 times both frameworks both ways.
//
// The one design idea: the two frameworks never share a process and share everything else. With --weights-out this
// program writes the model's initial state_dict (seeded by --seed) as safetensors before training, and the
// PyTorch side loads those bytes into the same modules; both read the same IDX files.
//
//   bench_mnist_gpu --model cnn --precision fp16 --device cuda --weights-out /tmp/cnn.safetensors
//   bench_mnist_gpu --model mlp --hidden 4096 --batch-size 1024 --precision fp16   # the seeds' wide MLP
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <mixtape/mixtape.h>

#include "graph_step.h"
#include "models.h"
#include "resident.h"

namespace {

namespace mt = mixtape;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string model = "mlp";
  int64_t hidden = 512;  // the MLP's two hidden widths (examples/mnist's: 512)
  std::string precision = "fp32";
  std::string device = "cuda";
  std::string data;
  std::string weights_out;
  int epochs = 1;
  int64_t batch_size = 128;
  int64_t warmup = 50;
  int64_t max_steps = 0;  // per epoch; 0: the whole epoch
  uint64_t seed = 0;
  bool cuda_graph = false;  // replay a captured step after a few eager ones (examples/mnist --cuda-graph)
  std::optional<int64_t> conv_column_limit_mib;  // set_conv_column_limit in MiB (0: none); unset: the default
  bool tf32 = false;  // f32 GEMMs (matmuls, convolutions) in TF32: mixtape::cuda::set_allow_tf32
};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void sync(mt::Device device) {
  if (device.is_cuda()) mt::cuda::synchronize();
}

/// Bytes of tensor storage on `device`: asked for now and at most since reset_peak, in blocks at most, reserved now
/// and at most (-1: not counted; the CPU's counts are of bytes asked for, its cache keeps no peak).
struct Memory {
  int64_t requested = 0, peak_requested = 0, allocated = 0, peak_allocated = 0, reserved = 0, peak_reserved = -1;
};
Memory memory(mt::Device device) {
  if (device.is_cuda()) {
    const mt::cuda::MemoryStats s = mt::cuda::memory_stats();
    return {s.requested_bytes, s.peak_requested_bytes, s.allocated_bytes, s.peak_allocated_bytes, s.reserved_bytes,
            s.peak_reserved_bytes};
  }
  const mt::CpuMemoryStats s = mt::cpu_memory_stats();
  return {s.allocated_bytes,  s.peak_allocated_bytes, s.allocated_bytes,
          s.peak_allocated_bytes, s.allocated_bytes + s.cached_bytes, -1};
}
double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }
void reset_peak(mt::Device device) {
  if (device.is_cuda())
    mt::cuda::reset_peak_memory_stats();
  else
    mt::reset_cpu_peak_memory();
}

/// What the row's framework adds for --conv-column-limit-mib: ", columns <= N MiB", ", whole batch", or nothing.
std::string column_label(const Options& opt) {
  if (!opt.conv_column_limit_mib) return "";
  if (*opt.conv_column_limit_mib == 0) return ", whole batch";
  return ", columns <= " + std::to_string(*opt.conv_column_limit_mib) + " MiB";
}

int run(const Options& opt) {
  const mt::Device device = opt.device == "cuda" ? mt::Device::cuda() : mt::Device::cpu();
  MT_CHECK(!device.is_cuda() || mt::cuda::is_available(), "--device cuda: ", mt::cuda::unavailable_reason());
  if (opt.conv_column_limit_mib) mt::cuda::set_conv_column_limit(*opt.conv_column_limit_mib << 20);
  MT_CHECK(!opt.tf32 || device.is_cuda(), "--tf32: TF32 is the GPU's Tensor Cores' (--device cuda)");
  mt::cuda::set_allow_tf32(opt.tf32);
  const mt::data::DatasetLocation location = mt::data::find_mnist(opt.data);
  const mt::data::MNIST train(location, mt::data::Split::kTrain), test(location, mt::data::Split::kTest);

  const mnist::ResidentSplit train_data(train, device), test_data(test, device);
  sync(device);
  reset_peak(device);
  const Memory baseline = memory(device);  // the dataset's

  mt::manual_seed(opt.seed);
  std::unique_ptr<mnist::Model> model;
  if (opt.model == "mlp")
    model = std::make_unique<mnist::Mlp>(opt.hidden);
  else
    model = mnist::make_model(opt.model);
  if (!opt.weights_out.empty()) mt::data::save_safetensors(opt.weights_out, model->state_dict());
  model->to(device);
  mt::optim::AdamW optimizer(model->parameters(), {.lr = 1e-3});
  const bool fp16 = opt.precision == "fp16", bf16 = opt.precision == "bf16";
  mt::amp::GradScaler scaler({.enabled = fp16});
  const int64_t n = train.size(), epoch_steps = n / opt.batch_size;
  const int64_t steps = opt.max_steps > 0 ? std::min(epoch_steps, opt.max_steps) : epoch_steps;
  const int64_t warmup = std::min(opt.warmup, steps - 1);
  MT_CHECK(steps >= 2, "bench_mnist_gpu: an epoch of ", steps, " step(s) has no steady state to time");
  MT_CHECK(!opt.cuda_graph || device.is_cuda(), "bench_mnist_gpu: --cuda-graph needs --device cuda");

  int64_t kept = 0;        // what the second step's forward left for backward
  bool count_kept = false;  // set for that step (as the PyTorch side, which counts in that step only)
  mnist::GraphedStep train_step([&](const mt::Tensor& x, const mt::Tensor& y) {
    optimizer.zero_grad();
    const int64_t before_forward = count_kept ? memory(device).requested : 0;
    mt::Tensor step_loss;
    {
      mt::amp::Autocast ac(bf16 ? mt::kBF16 : mt::kF16, fp16 || bf16);
      step_loss = mt::cross_entropy(model->forward(x), y);
    }
    if (count_kept) kept = memory(device).requested - before_forward;
    if (fp16) {
      scaler.scale(step_loss).backward();
      scaler.step_on_device(optimizer);  // skipped on the device when a gradient overflowed: no host read
      scaler.update();
    } else {
      step_loss.backward();
      optimizer.step();
    }
    return step_loss;
  }, opt.cuda_graph);

  mt::Generator shuffling(opt.seed);
  double train_seconds = 0, steady_seconds = 0;
  mt::Tensor loss;
  for (int epoch = 0; epoch < opt.epochs; ++epoch) {
    const auto epoch_start = Clock::now();
    const mt::Tensor perm = mt::randperm(n, device, &shuffling);  // (N) i64, drawn on the device
    Clock::time_point steady_start;
    for (int64_t s = 0; s < steps; ++s) {
      if (epoch == 0 && s == warmup) {
        sync(device);
        steady_start = Clock::now();
      }
      const auto [x, y] = train_data.batch(perm, s * opt.batch_size, opt.batch_size);
      count_kept = epoch == 0 && s == 1;
      loss = train_step(x, y);
    }
    sync(device);
    if (epoch == 0) steady_seconds = seconds_since(steady_start);
    train_seconds += seconds_since(epoch_start);
  }
  const Memory trained = memory(device);

  model->eval();
  mt::autograd::NoGradGuard no_grad;
  mt::Tensor hits = mt::zeros({}, device);
  for (int64_t i = 0; i < test.size(); i += 1000) {
    const int64_t e = std::min(test.size(), i + 1000);
    mt::amp::Autocast ac(bf16 ? mt::kBF16 : mt::kF16, fp16 || bf16);
    const mt::Tensor logits = model->forward(test_data.x.slice(0, i, e));
    hits = hits + mt::sum(mt::eq(mt::argmax(logits, 1), test_data.y.slice(0, i, e)).to(mt::kF32));
  }
  const double steady_steps = static_cast<double>(steps - warmup);
  nlohmann::json result = {
      {"framework", std::string(opt.cuda_graph ? "mixtape+graph" : "mixtape") +
                        column_label(opt) + (opt.tf32 ? ", tf32" : "")},
      {"model", opt.model == "mlp" && opt.hidden != 512 ? "mlp" + std::to_string(opt.hidden) : opt.model},
      {"precision", opt.precision},
      {"device", device.is_cuda() ? mt::cuda::device_properties(0).name : "cpu"},
      {"steps", steps * opt.epochs},
      {"step_ms", 1e3 * steady_seconds / steady_steps},
      {"samples_per_s", steady_steps * static_cast<double>(opt.batch_size) / steady_seconds},
      {"epoch_s", train_seconds / opt.epochs},
      {"peak_mib", mib(trained.peak_requested - baseline.requested)},
      {"held_mib", mib(trained.requested - baseline.requested)},
      {"kept_mib", mib(kept)},
      {"alloc_peak_mib", mib(trained.peak_allocated - baseline.allocated)},
      {"reserved_peak_mib", nullptr},
      {"loss", loss.item<float>()},
      {"skipped", scaler.skipped_steps()},
      {"accuracy", hits.item<float>() / static_cast<double>(test.size())},
      {"graph_nodes", nullptr}};
  if (opt.cuda_graph) result["graph_nodes"] = train_step.node_count();
  if (trained.peak_reserved >= 0) result["reserved_peak_mib"] = mib(trained.peak_reserved - baseline.reserved);
  std::printf("%s\n", result.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"examples/mnist's models trained with the dataset on the device: mixtape's side of "
               "bench/mnist_gpu.py (one JSON line)",
               "bench_mnist_gpu"};
  app.option_defaults()->always_capture_default();
  app.add_option("--model", opt.model, "mlp or cnn")->check(CLI::IsMember({"mlp", "cnn"}));
  app.add_option("--hidden", opt.hidden, "the MLP's hidden width (examples/mnist: 512)")->check(CLI::PositiveNumber);
  app.add_option("--precision", opt.precision, "fp32, fp16 or bf16")->check(CLI::IsMember({"fp32", "fp16", "bf16"}));
  app.add_option("--device", opt.device, "cuda, or cpu to check the plumbing")->check(CLI::IsMember({"cuda", "cpu"}));
  app.add_option("--data", opt.data, "the MNIST directory [default: $MIXTAPE_MNIST_DIR, ./data/mnist, ...]");
  app.add_option("--weights-out", opt.weights_out, "write the initial state_dict here (safetensors) first");
  app.add_option("--epochs", opt.epochs, "epochs")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", opt.batch_size, "samples per step")->check(CLI::PositiveNumber);
  app.add_option("--warmup", opt.warmup, "first-epoch steps left out of step_ms")->check(CLI::NonNegativeNumber);
  app.add_option("--max-steps", opt.max_steps, "steps per epoch at most (0: all)")->check(CLI::NonNegativeNumber);
  app.add_option("--seed", opt.seed, "the initial weights' and the shuffling's seed");
  app.add_flag("--cuda-graph", opt.cuda_graph, "replay a captured training step after a few eager ones (cuda)");
  app.add_option("--conv-column-limit-mib", opt.conv_column_limit_mib,
                 "the most MiB of im2col columns a convolution holds at once (0: the whole batch's) "
                 "[default: 10 in f16/bf16, 20 in f32]")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--tf32", opt.tf32, "f32 matrix products and convolutions in TF32 on the Tensor Cores (cuda)");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(opt);
  } catch (const std::exception& e) {
    std::cerr << "bench_mnist_gpu: error: " << e.what() << '\n';
    return 1;
  }
}
