// bench/mnist_cpu_libtorch.cpp — the LibTorch side of bench_mnist_cpu: epochs of examples/mnist/models.h's MLP or
// CNN written with torch::nn, trained as examples/mnist trains them (batch 128, AdamW lr 1e-3, drop_last, bf16 by
// CPU autocast), on the initial weights and the MNIST bytes that bench_mnist_cpu wrote for it.
//
// The one design idea: this program is a child process of bench_mnist_cpu and never shares a process with
// mixtape (two OpenMP runtimes and two BLAS builds in one address space would make both timings suspect). All it
// learns from its parent comes through two safetensors files (the model's initial state_dict; the MNIST splits as
// u8 images and i64 labels), so both sides start from the same parameters and train on the same bytes, and all it
// answers is one JSON line on stdout: the training loop's seconds, the steps taken, the test accuracy, and the BLAS
// library this process loaded (Debian's libblas.so.3 is an alternative: the reference BLAS or one of OpenBLAS's
// builds, whichever the machine's packages chose; LibTorch's f32 GEMMs are that library's).
//
//   bench_mnist_cpu_libtorch --model cnn --precision bf16 --threads 2 --weights cnn.safetensors
//                            --data mnist.safetensors [--max-steps N] [--batch-size 128] [--seed 0] [--epochs 1]
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

// Debian's libtorch links OpenBLAS beside its reference BLAS; weak, so that a build without it still links.
extern "C" void openblas_set_num_threads(int) __attribute__((weak));

namespace {

/// The BLAS libraries mapped into this process (libblas.so.3 and libopenblas.so.0 resolved through Debian's
/// alternatives), from /proc/self/maps: the files whose names hold "blas", comma-separated, or "unknown".
std::string loaded_blas() {
  std::ifstream maps("/proc/self/maps");
  std::string line, found;
  while (std::getline(maps, line)) {
    const size_t slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    if (path.substr(path.rfind('/') + 1).find("blas") == std::string::npos) continue;
    if (found.find(path) == std::string::npos) found += (found.empty() ? "" : ", ") + path;
  }
  return found.empty() ? "unknown" : found;
}

using Clock = std::chrono::steady_clock;

// ---- safetensors: the subset bench_mnist_cpu writes (F32, U8, I64; little-endian, contiguous) ---------------------

std::map<std::string, torch::Tensor> read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t header_len = 0;
  if (bytes.size() < 8) throw std::runtime_error(path + ": shorter than a safetensors header");
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | static_cast<unsigned char>(bytes[i]);
  if (header_len > bytes.size() - 8) throw std::runtime_error(path + ": header length beyond the file");
  const auto header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<int64_t>(header_len));
  const char* data = bytes.data() + 8 + header_len;
  const size_t data_size = bytes.size() - 8 - header_len;
  const std::map<std::string, torch::ScalarType> dtypes = {
      {"F32", torch::kFloat32}, {"U8", torch::kUInt8}, {"I64", torch::kInt64}};
  std::map<std::string, torch::Tensor> out;
  for (const auto& [key, entry] : header.items()) {
    if (key == "__metadata__") continue;
    const auto dtype = dtypes.find(entry.at("dtype").get<std::string>());
    if (dtype == dtypes.end()) throw std::runtime_error(path + ": " + key + " has a dtype this reader does not know");
    const auto shape = entry.at("shape").get<std::vector<int64_t>>();
    const auto offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
    torch::Tensor t = torch::empty(shape, dtype->second);
    const uint64_t nbytes = static_cast<uint64_t>(t.nbytes());
    if (offsets.size() != 2 || offsets[0] > offsets[1] || offsets[1] > data_size || offsets[1] - offsets[0] != nbytes)
      throw std::runtime_error(path + ": " + key + " has a byte range that does not fit its shape or the file");
    std::memcpy(t.data_ptr(), data + offsets[0], nbytes);
    out.emplace(key, t);
  }
  return out;
}

const torch::Tensor& entry(const std::map<std::string, torch::Tensor>& file, const std::string& key) {
  const auto it = file.find(key);
  if (it == file.end()) throw std::runtime_error("no tensor '" + key + "' in the file from bench_mnist_cpu");
  return it->second;
}

// ---- the models: examples/mnist/models.h in torch::nn, parameters named alike --------------------------------------

struct Model : torch::nn::Module {
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;  // (B, 1, 28, 28) -> (B, 10)
};

struct Mlp : Model {
  torch::nn::Linear fc1{register_module("fc1", torch::nn::Linear(784, 512))};
  torch::nn::Linear fc2{register_module("fc2", torch::nn::Linear(512, 512))};
  torch::nn::Linear fc3{register_module("fc3", torch::nn::Linear(512, 10))};
  torch::Tensor forward(const torch::Tensor& x) override {
    torch::Tensor h = torch::relu(fc1(x.flatten(1)));  // (B, 512)
    h = torch::relu(fc2(h));                            // (B, 512)
    return fc3(h);                                      // (B, 10)
  }
};

struct Cnn : Model {
  torch::nn::Conv2d conv1{register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3)))};
  torch::nn::Conv2d conv2{register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3)))};
  torch::nn::Dropout dropout1{register_module("dropout1", torch::nn::Dropout(0.25))};
  torch::nn::Dropout dropout2{register_module("dropout2", torch::nn::Dropout(0.5))};
  torch::nn::Linear fc1{register_module("fc1", torch::nn::Linear(9216, 128))};
  torch::nn::Linear fc2{register_module("fc2", torch::nn::Linear(128, 10))};
  torch::Tensor forward(const torch::Tensor& x) override {
    torch::Tensor h = torch::relu(conv1(x));                 // (B, 32, 26, 26)
    h = torch::max_pool2d(torch::relu(conv2(h)), 2);         // (B, 64, 12, 12)
    h = dropout1(h).flatten(1);                              // (B, 9216)
    h = dropout2(torch::relu(fc1(h)));                       // (B, 128)
    return fc2(h);                                           // (B, 10)
  }
};

/// Copies mixtape's initial state_dict into the parameters of the same names; every key must match both ways.
void load_weights(Model& model, const std::map<std::string, torch::Tensor>& file) {
  torch::NoGradGuard no_grad;
  const auto params = model.named_parameters();
  if (params.size() != file.size())
    throw std::runtime_error("the weights file holds " + std::to_string(file.size()) + " tensors, the model has " +
                             std::to_string(params.size()) + " parameters");
  for (const auto& p : params) {
    const torch::Tensor& w = entry(file, p.key());
    if (w.sizes() != p.value().sizes())
      throw std::runtime_error(p.key() + ": the file's shape differs from the model's");
    p.value().copy_(w);
  }
}

/// CPU autocast to `dtype` over a scope, as Python's torch.autocast("cpu") does: the cast cache is dropped when
/// the outermost region ends.
class AutocastCpu {
 public:
  AutocastCpu(torch::ScalarType dtype, bool enabled)
      : m_prev_enabled(at::autocast::is_cpu_enabled()), m_prev_dtype(at::autocast::get_autocast_cpu_dtype()) {
    at::autocast::set_cpu_enabled(enabled);
    at::autocast::set_autocast_cpu_dtype(dtype);
    at::autocast::increment_nesting();
  }
  ~AutocastCpu() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_cpu_enabled(m_prev_enabled);
    at::autocast::set_autocast_cpu_dtype(m_prev_dtype);
  }
  AutocastCpu(const AutocastCpu&) = delete;
  AutocastCpu& operator=(const AutocastCpu&) = delete;

 private:
  bool m_prev_enabled;
  torch::ScalarType m_prev_dtype;
};

/// u8 images (N, 28, 28) to (N, 1, 28, 28) f32 = (v/255 − 0.1307)/0.3081, computed in double and rounded once as
/// mixtape's DataLoader does; done once, so the loop only gathers.
torch::Tensor normalise(const torch::Tensor& images) {
  return ((images.to(torch::kFloat64) / 255.0 - 0.1307) / 0.3081).to(torch::kFloat32).unsqueeze(1);
}

struct Options {
  std::string model, precision, weights, data;
  int threads = 2;
  int64_t max_steps = 0;  // 0: the whole epoch
  int64_t batch_size = 128;
  uint64_t seed = 0;
  int epochs = 1;
};

Options parse(int argc, char** argv) {
  std::map<std::string, std::string> args;
  for (int i = 1; i + 1 < argc; i += 2) args[argv[i]] = argv[i + 1];
  if (argc % 2 == 0) throw std::runtime_error(std::string("an option without a value: ") + argv[argc - 1]);
  Options o;
  for (const auto& [key, value] : args) {
    if (key == "--model") o.model = value;
    else if (key == "--precision") o.precision = value;
    else if (key == "--weights") o.weights = value;
    else if (key == "--data") o.data = value;
    else if (key == "--threads") o.threads = std::stoi(value);
    else if (key == "--max-steps") o.max_steps = std::stoll(value);
    else if (key == "--batch-size") o.batch_size = std::stoll(value);
    else if (key == "--seed") o.seed = std::stoull(value);
    else if (key == "--epochs") o.epochs = std::stoi(value);
    else throw std::runtime_error("unknown option " + key);
  }
  if (o.model != "mlp" && o.model != "cnn") throw std::runtime_error("--model must be mlp or cnn");
  if (o.precision != "fp32" && o.precision != "bf16") throw std::runtime_error("--precision must be fp32 or bf16");
  if (o.weights.empty() || o.data.empty()) throw std::runtime_error("--weights and --data are required");
  if (o.threads < 1 || o.batch_size < 1 || o.max_steps < 0 || o.epochs < 1)
    throw std::runtime_error("bad --threads/--batch-size/--max-steps/--epochs");
  return o;
}

int run(const Options& o) {
  torch::set_num_threads(o.threads);
  if (openblas_set_num_threads != nullptr) openblas_set_num_threads(o.threads);
  torch::manual_seed(o.seed);

  const auto data = read_safetensors(o.data);
  const torch::Tensor train_x = normalise(entry(data, "train.images"));  // (N, 1, 28, 28) f32
  const torch::Tensor train_y = entry(data, "train.labels");              // (N) i64
  const torch::Tensor test_x = normalise(entry(data, "test.images"));
  const torch::Tensor test_y = entry(data, "test.labels");

  std::shared_ptr<Model> model;
  if (o.model == "cnn") model = std::make_shared<Cnn>();
  else model = std::make_shared<Mlp>();
  load_weights(*model, read_safetensors(o.weights));
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
  const bool bf16 = o.precision == "bf16";

  // Each epoch: a fresh permutation, full batches only (drop_last); timed from the first gather to the last step.
  const int64_t n = train_x.size(0);
  const int64_t steps = o.max_steps > 0 ? std::min(n / o.batch_size, o.max_steps) : n / o.batch_size;
  model->train();
  const auto start = Clock::now();
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    const torch::Tensor order = torch::randperm(n, torch::kInt64);
    for (int64_t s = 0; s < steps; ++s) {
      const torch::Tensor idx = order.slice(0, s * o.batch_size, (s + 1) * o.batch_size);
      const torch::Tensor x = train_x.index_select(0, idx), y = train_y.index_select(0, idx);
      optimizer.zero_grad();
      torch::Tensor loss;
      {
        AutocastCpu ac(torch::kBFloat16, bf16);
        loss = torch::nn::functional::cross_entropy(model->forward(x), y);
      }
      loss.backward();
      optimizer.step();
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();

  model->eval();
  torch::NoGradGuard no_grad;
  int64_t hits = 0;
  for (int64_t i = 0; i < test_x.size(0); i += 1000) {
    AutocastCpu ac(torch::kBFloat16, bf16);
    const torch::Tensor logits = model->forward(test_x.slice(0, i, i + 1000));
    hits += logits.argmax(1).eq(test_y.slice(0, i, i + 1000)).sum().item<int64_t>();
  }
  const nlohmann::json result = {{"blas", loaded_blas()},
                                 {"seconds", seconds},
                                 {"steps", steps * o.epochs},
                                 {"samples", steps * o.epochs * o.batch_size},
                                 {"accuracy", static_cast<double>(hits) / static_cast<double>(test_x.size(0))},
                                 {"threads", torch::get_num_threads()}};
  std::printf("%s\n", result.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::cerr << "bench_mnist_cpu_libtorch: " << e.what() << '\n';
    return 1;
  }
}
