// examples/mnist/main.cpp — trains an MLP or pytorch/examples' CNN on MNIST (or Fashion-MNIST) in fp32, fp16
// (autocast + dynamic loss scaling) or bf16 (autocast alone), on the CPU or a CUDA GPU, with mixtape's public API.
//
//   build/examples/mnist --model cnn --precision fp16 --epochs 3 --metrics run.jsonl --plot run.png
//
// The one design idea: the training loop never waits for the device. The running loss is summed on the device and
// read back every --log-interval steps (for the progress bar and the metrics file), the test accuracy is counted on
// the device and read once per epoch; under fp16 the GradScaler's skip decision stays on the device too
// (step_on_device: the optimizer's kernels read found_inf), its count read with the loss. On a GPU the whole dataset
// lives on the device, normalised once: each epoch's order is drawn there (mixtape::randperm) and each batch
// gathered there (index_select), so a step copies nothing from the host. On the CPU the DataLoader assembles each
// batch one ahead on a worker thread (--resident on|off chooses either on any device). With --cuda-graph, after a
// few eager steps one training step is captured into a CUDA graph and every later step is one replay of it on the
// next batch, copied into the graph's input tensors (mixtape::cuda::Graph); the schedule steps between replays,
// which read the optimizer's options anew.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <mixtape/mixtape.h>

#include "graph_step.h"
#include "models.h"
#include "progress.h"
#include "resident.h"

// OpenBLAS's OpenMP build (what mixtape links when it can) follows omp_set_num_threads; its pthreads build keeps a
// pool of its own, which needs telling. Weak, so that a BLAS without this knob still links and runs.
extern "C" void openblas_set_num_threads(int) __attribute__((weak));

namespace {

namespace mt = mixtape;
namespace fs = std::filesystem;
using mt::Tensor;
using Clock = std::chrono::steady_clock;

/// An error to report as one line and a non-zero exit (bad flags, files, mismatched checkpoints).
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Options {
  std::string model = "mlp";
  std::string precision = "fp32";
  std::string device = "auto";
  std::string optimizer = "adamw";
  std::string schedule = "cosine";
  std::string resident = "auto";  // the dataset kept on the device: auto (on a GPU), on, off
  int epochs = 1;
  int64_t batch_size = 128;
  std::optional<double> lr;
  uint64_t seed = 0;
  int threads = std::max(1U, std::thread::hardware_concurrency());
  std::string data, save, resume, metrics, plot, inspect;
  int64_t inspect_step = 100;  // the training step --inspect looks at (1: the first)
  int64_t max_steps = 0;     // 0: no bound
  int64_t log_interval = 20;  // steps between two host reads of the loss
  bool cuda_graph = false;    // replay a captured training step
  bool tf32 = false;          // f32 matrix products and convolutions in TF32 (a GPU's Tensor Cores)
};

std::string one_line(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  for (size_t i = 0; (i = text.find('\n', i)) != std::string::npos;) text.replace(i, 1, "; ");
  return text;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// Waits for the device, so that a timing covers the work issued (the CPU backend runs synchronously).
void sync(mt::Device device) {
  if (device.is_cuda()) mt::cuda::synchronize();
}

// ---- metrics: kept in memory for the plot, appended to --metrics as JSONL -----------------------------------------

struct StepRecord {
  int64_t step;
  double loss, lr, loss_scale;
  int64_t skipped;
};
struct EpochRecord {
  int epoch;
  double accuracy, seconds;
};

class Metrics {
 public:
  Metrics(const std::string& path, bool append) : m_path(path) {
    if (path.empty()) return;
    m_out.open(path, append ? std::ios::app : std::ios::trunc);
    if (!m_out) throw UsageError("--metrics: cannot write " + path);
  }
  void step(int epoch, const StepRecord& r, double samples_per_s) {
    steps.push_back(r);
    write({{"type", "step"}, {"epoch", epoch}, {"step", r.step}, {"loss", r.loss}, {"lr", r.lr},
           {"loss_scale", r.loss_scale}, {"skipped_steps", r.skipped}, {"samples_per_s", samples_per_s}});
  }
  void epoch(const EpochRecord& r, int64_t step, double train_seconds, double samples_per_s) {
    epochs.push_back(r);
    write({{"type", "epoch"}, {"epoch", r.epoch}, {"step", step}, {"accuracy", r.accuracy}, {"time_s", r.seconds},
           {"train_time_s", train_seconds}, {"samples_per_s", samples_per_s}});
  }

  std::vector<StepRecord> steps;
  std::vector<EpochRecord> epochs;

 private:
  void write(const nlohmann::json& j) {
    if (!m_out.is_open()) return;
    m_out << j.dump() << '\n' << std::flush;
    if (!m_out) throw UsageError("--metrics: writing " + m_path + " failed (disk full?)");
  }
  std::string m_path;
  std::ofstream m_out;
};

// ---- the plot: a gnuplot script over two data files, in a temporary directory ---------------------------------------

/// A fresh directory under /tmp for gnuplot's inputs, removed with what it holds when the scope ends.
class ScratchDir {
 public:
  explicit ScratchDir(const char* flag) {
    char name[] = "/tmp/mnist-plot-XXXXXX";
    if (mkdtemp(name) == nullptr) throw UsageError(std::string(flag) + ": cannot create a temporary directory");
    m_path = name;
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(m_path, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  fs::path operator/(const char* name) const { return m_path / name; }

 private:
  fs::path m_path;
};

/// A file written whole or not at all: its bytes go to "<path>.tmp.<pid>" beside it, renamed over `path` by
/// commit(); a write that fails or stops half way leaves the old file (or none) and no temporary behind.
class PendingFile {
 public:
  PendingFile(fs::path path, const char* flag)
      : m_path(std::move(path)), m_tmp(m_path.string() + ".tmp." + std::to_string(::getpid())), m_flag(flag) {}
  ~PendingFile() {
    std::error_code ec;
    if (!m_committed) fs::remove(m_tmp, ec);
  }
  PendingFile(const PendingFile&) = delete;
  PendingFile& operator=(const PendingFile&) = delete;
  /// Where the bytes go until commit().
  const fs::path& tmp() const { return m_tmp; }
  void commit() {
    std::error_code ec;
    fs::rename(m_tmp, m_path, ec);
    if (ec) throw UsageError(std::string(m_flag) + ": cannot write " + m_path.string() + " (" + ec.message() + ")");
    m_committed = true;
  }

 private:
  fs::path m_path, m_tmp;
  const char* m_flag;
  bool m_committed = false;
};

/// `text` as the whole of `path` (a PendingFile); a failure is a UsageError naming the file.
void write_text(const fs::path& path, const std::string& text, const char* flag) {
  PendingFile file(path, flag);
  std::ofstream out(file.tmp(), std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw UsageError(std::string(flag) + ": cannot write " + path.string());
  file.commit();
}

void run_gnuplot(const std::filesystem::path& script, const char* flag);

bool have_gnuplot() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }

std::string gnuplot_quote(const std::string& s) {  // '…' with ' doubled
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

void write_plot(const std::string& png, const Metrics& metrics, const std::string& title, bool show_scale) {
  const ScratchDir dir("--plot");
  PendingFile file(png, "--plot");
  std::ostringstream steps, epochs;
  for (const auto& r : metrics.steps) steps << r.step << ' ' << r.loss << ' ' << r.loss_scale << '\n';
  for (const auto& r : metrics.epochs) epochs << r.epoch << ' ' << 100 * r.accuracy << '\n';
  write_text(dir / "steps.dat", steps.str(), "--plot");
  write_text(dir / "epochs.dat", epochs.str(), "--plot");
  const int panels = show_scale ? 3 : 2;
  std::ostringstream script;
  script << "set terminal pngcairo size 900," << 300 * panels << " font ',10'\n"
         << "set output " << gnuplot_quote(file.tmp().string()) << "\n"
         << "set multiplot layout " << panels << ",1 title " << gnuplot_quote(title) << "\n"
         << "set grid\nset key top right\n"
         << "set xlabel 'step'\nset ylabel 'training loss'\n"
         << "plot " << gnuplot_quote((dir / "steps.dat").string()) << " using 1:2 with lines lw 1.5 title 'loss'\n"
         << "set xlabel 'epoch'\nset ylabel 'test accuracy (%)'\nset xtics 1\nset offsets 0.5, 0.5, 0.5, 0.5\n"
         << "plot " << gnuplot_quote((dir / "epochs.dat").string())
         << " using 1:2 with linespoints lw 1.5 pt 7 title 'accuracy'\n";
  if (show_scale)
    script << "set offsets 0, 0, 0, 0\nset xtics autofreq\nset xlabel 'step'\nset ylabel 'loss scale'\n"
           << "set logscale y 2\nplot " << gnuplot_quote((dir / "steps.dat").string())
           << " using 1:3 with steps lw 1.5 title 'GradScaler scale'\n";
  script << "unset multiplot\n";
  write_text(dir / "plot.gp", script.str(), "--plot");
  run_gnuplot(dir / "plot.gp", "--plot");
  file.commit();
}

/// Runs gnuplot on `script`; its complaint (one line) becomes a UsageError naming `flag`.
void run_gnuplot(const std::filesystem::path& script, const char* flag) {
  const std::string command = "gnuplot " + script.string() + " 2>&1";
  std::string output;
  if (FILE* pipe = popen(command.c_str(), "r")) {
    char buffer[512];
    while (fgets(buffer, sizeof buffer, pipe) != nullptr) output += buffer;
    const int status = pclose(pipe);
    if (status != 0) throw UsageError(std::string(flag) + ": gnuplot failed: " + one_line(output));
  } else {
    throw UsageError(std::string(flag) + ": cannot run gnuplot");
  }
}

/// --inspect PREFIX: the inspector's table (PREFIX.txt, also printed), JSON (PREFIX.json) and the activation
/// gradient histogram (PREFIX.png, when gnuplot is there).
void write_inspection(const std::string& prefix, const mt::amp::InspectReport& report, int64_t step) {
  const std::string table = report.table();
  std::cerr << "\nnumerics at step " << step << ":\n" << table;
  write_text(prefix + ".txt", "step " + std::to_string(step) + "\n" + table, "--inspect");
  report.write_json(prefix + ".json");
  if (!have_gnuplot()) {
    std::cerr << "--inspect: gnuplot is not on PATH, no " << prefix << ".png\n";
    return;
  }
  const ScratchDir dir("--inspect");
  PendingFile png(prefix + ".png", "--inspect");
  write_text(dir / "histogram.gp", report.gnuplot_script(png.tmp().string()), "--inspect");
  run_gnuplot(dir / "histogram.gp", "--inspect");
  png.commit();
}

// ---- checkpoints ---------------------------------------------------------------------------------------------------

/// A checkpoint part on `device`; of an optimizer's, only the per-parameter "state." tensors move (its group
/// options stay host scalars).
mt::StateDict part_on(const mt::data::Checkpoint& checkpoint, const std::string& name, mt::Device device) {
  mt::StateDict out;
  for (const auto& [key, value] : checkpoint.part(name)) {
    const bool move = name != "optimizer" || key.rfind("state.", 0) == 0;
    out.insert(key, move ? value.to(device) : value);
  }
  return out;
}

// ---- the data on the device, the evaluation -------------------------------------------------------------------------

using mnist::ResidentSplit;

/// One epoch's training batches in order: the DataLoader's (the CPU), or gathered on the device from a resident
/// split in an order drawn there (a GPU). Both shuffle by the epoch's seed and drop the last partial batch.
class EpochBatches {
 public:
  EpochBatches(const mt::data::MNIST& train, const ResidentSplit* resident, int64_t batch_size, uint64_t seed,
               mt::Device device)
      : m_resident(resident), m_batch_size(batch_size) {
    if (resident != nullptr) {
      mt::Generator generator(seed);
      m_order = mt::randperm(resident->size(), device, &generator);
      m_size = resident->size() / batch_size;
    } else {
      m_loader.emplace(train, mt::data::DataLoaderOptions{.batch_size = batch_size, .shuffle = true,
                                                          .drop_last = true, .seed = seed, .device = device});
      m_size = m_loader->size();
    }
  }
  int64_t size() const { return m_size; }
  /// Batch `b` of the epoch; b = 0, 1, ... in order (the loader's batches come one after another).
  mt::data::Batch take(int64_t b) {
    if (m_resident != nullptr) return m_resident->batch(m_order, b * m_batch_size, m_batch_size);
    if (b == 0)
      m_it = m_loader->begin();
    else
      ++m_it;
    return *m_it;
  }

 private:
  const ResidentSplit* m_resident;
  int64_t m_batch_size, m_size = 0;
  Tensor m_order;
  std::optional<mt::data::DataLoader> m_loader;
  mt::data::DataLoader::Iterator m_it;
};

/// Test accuracy in [0, 1]: hits counted on the device, read once. With `resident`, the test split is read from
/// the device in slices; otherwise the DataLoader brings it.
double evaluate(mnist::Model& model, const mt::data::MNIST& test, const ResidentSplit* resident, mt::Device device,
                std::optional<mt::DType> autocast) {
  model.eval();
  mt::autograd::NoGradGuard no_grad;
  Tensor hits = mt::zeros({}, device);  // () f32: exact up to 2^24 samples
  auto count = [&](const Tensor& x, const Tensor& y) {
    Tensor logits;
    {
      mt::amp::Autocast ac(autocast.value_or(mt::kF16), autocast.has_value());
      logits = model.forward(x);  // (B, 10)
    }
    hits = hits + mt::sum(mt::eq(mt::argmax(logits, 1), y).to(mt::kF32));
  };
  if (resident != nullptr) {
    for (int64_t i = 0; i < resident->size(); i += 1000) {
      const int64_t e = std::min(resident->size(), i + 1000);
      count(resident->x.slice(0, i, e), resident->y.slice(0, i, e));
    }
  } else {
    mt::data::DataLoader loader(test, {.batch_size = 1000, .device = device});
    for (auto& [x, y] : loader) count(x, y);
  }
  model.train();
  return hits.item<float>() / static_cast<double>(test.size());
}

int run(const Options& opt) {
  const auto run_start = Clock::now();
  omp_set_num_threads(opt.threads);
  if (openblas_set_num_threads != nullptr) openblas_set_num_threads(opt.threads);

  mt::Device device = mt::Device::cpu();
  if (opt.device == "cuda" || (opt.device == "auto" && mt::cuda::is_available())) {
    if (!mt::cuda::is_available()) throw UsageError("--device cuda: " + mt::cuda::unavailable_reason());
    device = mt::Device::cuda();
  } else if (opt.device == "auto" && mt::cuda::device_count() > 0) {  // GPUs, none of which the kernels run on
    std::cerr << "mnist: " << mt::cuda::unavailable_reason() << ": training on the CPU\n";
  }
  const std::string device_name = device.is_cuda() ? "cuda (" + mt::cuda::device_properties(0).name + ")" : "cpu";
  if (!opt.plot.empty() && !have_gnuplot())
    throw UsageError("--plot needs gnuplot, which is not on PATH (apt-get install gnuplot-nox)");
  // What is written after training must find its directory: said now, not after the run.
  for (const auto& [flag, path] : {std::pair{"--save", opt.save}, {"--plot", opt.plot}, {"--inspect", opt.inspect}}) {
    const fs::path dir = fs::path(path).parent_path();
    if (!path.empty() && !dir.empty() && !fs::is_directory(dir))
      throw UsageError(std::string(flag) + ": no such directory: " + dir.string());
  }

  const std::optional<mt::DType> autocast = opt.precision == "fp16"   ? std::optional(mt::kF16)
                                            : opt.precision == "bf16" ? std::optional(mt::kBF16)
                                                                      : std::nullopt;
  const bool fp16 = opt.precision == "fp16";
  if (opt.cuda_graph) {
    // What a replayed graph cannot do: it repeats the capture's kernels with the capture's arguments (but for the
    // optimizer's options, which each replay reads anew: the schedule goes on between replays).
    if (!device.is_cuda()) throw UsageError("--cuda-graph: CUDA graphs need --device cuda (or auto on a GPU)");
    if (!opt.inspect.empty()) throw UsageError("--cuda-graph: --inspect reads its step on the host; drop one of them");
    if (opt.resident == "off") throw UsageError("--cuda-graph: the batches must be on the device (--resident on)");
  }
  if (opt.tf32) {  // PyTorch's allow_tf32: 10 bits of mantissa in the products, f32 sums
    if (!device.is_cuda())
      throw UsageError("--tf32: TF32 runs on a GPU's Tensor Cores (--device cuda, or auto on a GPU)");
    mt::cuda::set_allow_tf32(true);
  }
  const std::string precision_label = opt.precision + (opt.tf32 ? " (tf32)" : "");

  const mt::data::DatasetLocation location = mt::data::find_mnist(opt.data);
  const mt::data::MNIST train_set(location, mt::data::Split::kTrain);
  const mt::data::MNIST test_set(location, mt::data::Split::kTest);
  if (opt.batch_size > static_cast<int64_t>(train_set.size()))  // every batch is whole: no step would be taken
    throw UsageError("--batch-size: " + std::to_string(opt.batch_size) + " is more than the " +
                     std::to_string(train_set.size()) + " training images of " + location.name);
  std::optional<ResidentSplit> train_resident, test_resident;  // a GPU's copies of the splits
  if (opt.resident == "on" || (opt.resident == "auto" && device.is_cuda())) {
    train_resident.emplace(train_set, device);
    test_resident.emplace(test_set, device);
  }

  mt::manual_seed(opt.seed);
  std::unique_ptr<mnist::Model> model = mnist::make_model(opt.model);
  model->to(device);
  std::unique_ptr<mt::optim::Optimizer> optimizer;
  if (opt.optimizer == "sgd")
    optimizer = std::make_unique<mt::optim::SGD>(model->parameters(),
                                                 mt::optim::SGDOptions{.lr = opt.lr.value_or(0.01), .momentum = 0.9});
  else
    optimizer = std::make_unique<mt::optim::AdamW>(model->parameters(),
                                                   mt::optim::AdamWOptions{.lr = opt.lr.value_or(1e-3)});
  mt::amp::GradScaler scaler({.enabled = fp16});  // bf16 has f32's exponent range: no scaling
  // The schedule spans the whole run (--epochs), stepped once per batch; "constant" keeps --lr throughout.
  const int64_t steps_per_epoch = static_cast<int64_t>(train_set.size()) / opt.batch_size;  // drop_last
  std::unique_ptr<mt::optim::LRScheduler> schedule;
  if (opt.schedule == "cosine")
    schedule = std::make_unique<mt::optim::CosineAnnealingLR>(*optimizer, opt.epochs * steps_per_epoch);
  else if (opt.schedule == "onecycle")
    schedule = std::make_unique<mt::optim::OneCycleLR>(
        *optimizer,
        mt::optim::OneCycleLROptions{.max_lr = optimizer->lr(0), .total_steps = opt.epochs * steps_per_epoch});

  int first_epoch = 0;
  int64_t step = 0;  // optimizer steps taken (including skipped ones), over every run of this checkpoint
  if (!opt.resume.empty()) {
    if (!fs::exists(opt.resume)) throw UsageError("--resume: no such file: " + opt.resume);
    const mt::data::Checkpoint checkpoint = mt::data::load_checkpoint(opt.resume);
    auto meta = [&](const std::string& key) {
      auto it = checkpoint.metadata.find(key);
      if (it == checkpoint.metadata.end())
        throw UsageError("--resume: " + opt.resume + " has no '" + key + "' metadata");
      return it->second;
    };
    // A decaying schedule spans the run's --epochs: a resumed run must ask for the same number to stay on it.
    std::map<std::string, std::string> must_match = {
        {"model", opt.model}, {"precision", opt.precision}, {"optimizer", opt.optimizer}, {"schedule", opt.schedule}};
    if (opt.schedule != "constant") must_match["epochs"] = std::to_string(opt.epochs);
    for (const auto& [key, want] : must_match)
      if (meta(key) != want)
        throw UsageError("--resume: " + opt.resume + " holds " + key + " '" + meta(key) + "', not '" + want + "'" +
                         (key == "epochs" ? " (its --schedule spans that many epochs)" : ""));
    model->load_state_dict(part_on(checkpoint, "model", device));
    optimizer->load_state_dict(part_on(checkpoint, "optimizer", device));  // lr and initial_lr too
    if (schedule) schedule->load_state_dict(checkpoint.part("scheduler"));
    if (fp16) scaler.load_state_dict(checkpoint.part("scaler"));
    mt::default_generator().set_state(checkpoint.rng);  // dropout continues with the masks it would have drawn
    const std::string epoch_text = meta("epoch");
    const char* const epoch_end = epoch_text.data() + epoch_text.size();
    const auto [parsed_to, parse_error] = std::from_chars(epoch_text.data(), epoch_end, first_epoch);
    if (epoch_text.empty() || parse_error != std::errc() || parsed_to != epoch_end || first_epoch < 0)
      throw UsageError("--resume: " + opt.resume + " holds epoch '" + epoch_text + "', not a number of epochs");
    step = checkpoint.step;
    if (first_epoch >= opt.epochs)
      throw UsageError("--resume: " + opt.resume + " has already trained " + std::to_string(first_epoch) +
                       " epoch(s)" +
                       (opt.schedule == "constant" ? "; ask for more with --epochs" : ", all of its run"));
    std::cerr << "resumed from " << opt.resume << " after epoch " << first_epoch << " (step " << step << ")\n";
  }

  Metrics metrics(opt.metrics, !opt.resume.empty());
  const bool tty = mnist::ProgressBar::enabled();
  const std::string title = train_set.name() + ", " + opt.model + ", " + precision_label + ", " + device_name;
  double accuracy = 0, train_seconds = 0;
  int64_t samples = 0, run_steps = 0, skipped = 0;
  bool stop = false;

  // One training step on a batch; returns its loss, () f32 on the device. --cuda-graph replays a captured one.
  mnist::GraphedStep train_step([&](const Tensor& x, const Tensor& y) {
    optimizer->zero_grad();
    Tensor loss;
    {
      mt::amp::Autocast ac(autocast.value_or(mt::kF16), autocast.has_value());
      loss = mt::cross_entropy(model->forward(x), y);  // () f32 in every precision
    }
    if (fp16) {
      scaler.scale(loss).backward();
      scaler.step_on_device(*optimizer);  // skipped, on the device, when a gradient overflowed
      scaler.update();
    } else {
      loss.backward();
      optimizer->step();
    }
    return loss;
  }, opt.cuda_graph);

  for (int epoch = first_epoch; epoch < opt.epochs && !stop; ++epoch) {
    const auto epoch_start = Clock::now();
    // A seed per epoch, so a resumed run sees the batches an uninterrupted one would have.
    const uint64_t shuffle_seed = opt.seed ^ (0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(epoch + 1));
    EpochBatches batches(train_set, train_resident ? &*train_resident : nullptr, opt.batch_size, shuffle_seed,
                         device);
    const int64_t steps_this_epoch =
        opt.max_steps > 0 ? std::min(batches.size(), opt.max_steps - run_steps) : batches.size();
    mnist::ProgressBar bar("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(opt.epochs),
                           steps_this_epoch, opt.batch_size);
    Tensor loss_sum = mt::zeros({}, device);  // () f32: the losses since the last read
    int64_t in_sum = 0, epoch_steps = 0;
    double last_loss = std::nan("");
    while (epoch_steps < steps_this_epoch) {
      const auto [x, y] = batches.take(epoch_steps);
      // --inspect: one step under the numerics inspector (statistics kernels run beside the step's, no host reads).
      std::optional<mt::amp::Inspect> inspect;
      if (!opt.inspect.empty() && step + 1 == opt.inspect_step)
        inspect.emplace(mt::amp::InspectOptions{.parameters = model->named_parameters()});
      const Tensor loss = train_step(x, y);
      if (schedule) schedule->step();
      if (inspect) write_inspection(opt.inspect, inspect->report(), step + 1);
      {
        mt::autograd::NoGradGuard no_grad;
        loss_sum = loss_sum + loss.detach();
      }
      ++in_sum, ++epoch_steps, ++run_steps, ++step;
      samples += x.size(0);
      const bool last = epoch_steps == steps_this_epoch;
      if (in_sum == opt.log_interval || last) {
        last_loss = loss_sum.item<float>() / static_cast<double>(in_sum);  // the host reads, every K steps
        if (fp16) skipped = scaler.skipped_steps();
        loss_sum = mt::zeros({}, device);
        in_sum = 0;
        const double rate = static_cast<double>(epoch_steps * opt.batch_size) / seconds_since(epoch_start);
        metrics.step(epoch + 1, {step, last_loss, optimizer->lr(0), fp16 ? scaler.get_scale() : 1.0, skipped}, rate);
      }
      if (tty) bar.update(epoch_steps, last_loss, last);
    }
    sync(device);
    const double epoch_train_seconds = seconds_since(epoch_start);
    train_seconds += epoch_train_seconds;
    if (tty) bar.finish();
    if (opt.max_steps > 0 && run_steps >= opt.max_steps) stop = true;

    accuracy = evaluate(*model, test_set, test_resident ? &*test_resident : nullptr, device, autocast);
    const double epoch_seconds = seconds_since(epoch_start);
    const double rate = static_cast<double>(epoch_steps * opt.batch_size) / epoch_train_seconds;
    metrics.epoch({epoch + 1, accuracy, epoch_seconds}, step, epoch_train_seconds, rate);
    const std::string scaling = fp16 ? ", loss scale " + std::to_string(static_cast<long long>(scaler.get_scale())) +
                                           ", " + std::to_string(skipped) + " steps skipped"
                                     : "";
    char line[256];
    std::snprintf(line, sizeof line,
                  "epoch %d/%d: %lld steps, loss %.4f, test accuracy %.2f%%, %.1f s (%.0f samples/s)", epoch + 1,
                  opt.epochs, static_cast<long long>(epoch_steps), last_loss, 100 * accuracy, epoch_seconds, rate);
    std::cerr << line << scaling << '\n';

    if (!opt.save.empty()) {
      mt::data::Checkpoint checkpoint{.step = step, .rng = mt::default_generator().state()};
      checkpoint.parts["model"] = model->state_dict();
      checkpoint.parts["optimizer"] = optimizer->state_dict();
      checkpoint.parts["scaler"] = scaler.state_dict();
      if (schedule) checkpoint.parts["scheduler"] = schedule->state_dict();
      checkpoint.metadata = {{"epoch", std::to_string(epoch + 1)}, {"model", opt.model},
                             {"precision", opt.precision},          {"optimizer", opt.optimizer},
                             {"schedule", opt.schedule},            {"epochs", std::to_string(opt.epochs)},
                             {"dataset", train_set.name()},          {"accuracy", std::to_string(accuracy)}};
      mt::data::save_checkpoint(opt.save, checkpoint);  // atomic: a crash mid-write leaves the previous one whole
    }
  }

  if (!opt.plot.empty()) write_plot(opt.plot, metrics, title, fp16);
  const double total = seconds_since(run_start);
  std::printf("%s | %s | %s | %s | test accuracy %.2f%% | %.1f s | %.0f samples/s\n", train_set.name().c_str(),
              opt.model.c_str(), precision_label.c_str(), device_name.c_str(), 100 * accuracy, total,
              train_seconds > 0 ? static_cast<double>(samples) / train_seconds : 0.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"Trains an MLP or a CNN on MNIST with mixtape, in fp32, fp16 or bf16, on the CPU or a GPU.", "mnist"};
  app.option_defaults()->always_capture_default();
  // CLI11's PositiveNumber names DBL_MAX in its message: these say what is wanted.
  auto within = [](double low, double high, std::string text) {
    return CLI::Validator(
        [low, high, text](std::string& value) -> std::string {
          char* end = nullptr;
          const double v = std::strtod(value.c_str(), &end);
          const bool number = end != value.c_str() && *end == '\0' && std::isfinite(v);
          return number && v >= low && v <= high ? "" : value + " is not " + text;
        },
        "");
  };
  const double huge = std::numeric_limits<double>::max();
  const CLI::Validator positive = within(std::nextafter(0.0, 1.0), huge, "a number > 0");
  const CLI::Validator non_negative = within(0.0, huge, "a number >= 0");
  app.add_option("--model", opt.model, "mlp (784-512-512-10) or cnn (pytorch/examples' net)")
      ->check(CLI::IsMember({"mlp", "cnn"}));
  app.add_option("--precision", opt.precision, "fp32; fp16 (autocast + loss scaling); bf16 (autocast)")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}));
  app.add_option("--device", opt.device,
                 "auto (CUDA when there is a GPU the kernels run on: compute capability 8.0 or newer), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--epochs", opt.epochs, "epochs to train")->check(positive);
  app.add_option("--batch-size", opt.batch_size, "training batch size")->check(positive);
  app.add_option("--lr", opt.lr, "learning rate [default: 1e-3 for adamw, 0.01 for sgd]")
      ->check(positive);
  app.add_option("--optimizer", opt.optimizer, "adamw, or sgd (momentum 0.9)")
      ->check(CLI::IsMember({"sgd", "adamw"}));
  app.add_option("--schedule", opt.schedule, "learning rate over the run: cosine decay to 0, onecycle, or constant")
      ->check(CLI::IsMember({"cosine", "onecycle", "constant"}));
  app.add_option("--seed", opt.seed, "seed of the initialisation, the shuffling and dropout");
  // Threads beyond the CPUs only wait on one another (on 2 cores, 100,000 slowed the MLP 6x and stalled the CNN),
  // and libgomp cannot start tens of thousands (a bare parallel region aborted at 50,000 and crashed at 100,000):
  // at most the CPUs or 64 (Debian's OpenBLAS's own most), whichever is more.
  const int most_threads = static_cast<int>(std::max(64U, std::thread::hardware_concurrency()));
  app.add_option("--threads", opt.threads, "CPU threads (OpenMP, OpenBLAS)")
      ->check(within(1, most_threads, "a number of threads in [1, " + std::to_string(most_threads) + "]"));
  app.add_option("--data", opt.data,
                 "the MNIST directory [default: $MIXTAPE_MNIST_DIR, ./data/mnist, Debian's Fashion-MNIST]");
  app.add_option("--save", opt.save, "write a checkpoint (safetensors) here after each epoch");
  app.add_option("--resume", opt.resume, "continue from this checkpoint, at its next epoch");
  app.add_option("--metrics", opt.metrics, "write JSONL metrics here (per logged step and per epoch)");
  app.add_option("--plot", opt.plot, "write a PNG of loss, accuracy (and fp16's loss scale) here, with gnuplot");
  app.add_option("--inspect", opt.inspect,
                 "inspect one training step's numerics: writes PREFIX.txt, PREFIX.json and PREFIX.png");
  app.add_option("--inspect-step", opt.inspect_step, "the training step --inspect looks at")->check(positive);
  app.add_option("--max-steps", opt.max_steps, "stop after this many training steps, then evaluate (0: no bound)")
      ->check(non_negative);
  app.add_option("--log-interval", opt.log_interval, "steps between two reads of the loss from the device")
      ->check(positive);
  app.add_option("--resident", opt.resident,
                 "keep the dataset on the device, shuffled and batched there: auto (on a GPU), on, or off (the "
                 "DataLoader, a batch ahead on a worker thread)")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  app.add_flag("--cuda-graph", opt.cuda_graph,
               "after a few eager steps, capture one training step in a CUDA graph and replay it for the others "
               "(GPU)");
  app.add_flag("--tf32", opt.tf32,
               "f32 matrix products and convolutions in TF32 on the Tensor Cores (GPU; PyTorch's allow_tf32): "
               "faster, with 10 bits of mantissa in each product");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "mnist: " << one_line(e.what()) << " (see --help)\n";
    return 2;
  }
  try {
    return run(opt);
  } catch (const std::exception& e) {
    std::cerr << "mnist: error: " << one_line(e.what()) << '\n';
    return 1;
  }
}
