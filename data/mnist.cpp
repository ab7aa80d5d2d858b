// data/mnist.cpp — finding MNIST on disk and loading a split, checked as MNIST after read_idx checked it as IDX.
//
// Labels become i64 (what cross_entropy takes) once, here, so a batch is a gather and nothing more.
#include <mixtape/data/mnist.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include <mixtape/core/error.h>
#include <mixtape/data/idx.h>

namespace mixtape::data {

namespace fs = std::filesystem;

namespace {

constexpr std::array<const char*, 4> kFiles = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                               "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};

// The path of `base` in `dir`, raw or .gz; "" when neither is a regular file.
std::string resolve(const std::string& dir, const std::string& base) {
  std::error_code ec;
  for (const std::string& p : {(fs::path(dir) / base).string(), (fs::path(dir) / (base + ".gz")).string()})
    if (fs::is_regular_file(p, ec)) return p;
  return "";
}

// What `dir` lacks, for an error message; "" when it holds all four files.
std::string missing_in(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return "not a directory";
  std::string missing;
  for (const char* f : kFiles)
    if (resolve(dir, f).empty()) missing += (missing.empty() ? "missing " : ", ") + std::string(f) + "[.gz]";
  return missing;
}

std::string dataset_name(const std::string& dir) {
  std::string lower = dir;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return lower.find("fashion") != std::string::npos ? "Fashion-MNIST" : "MNIST";
}

}  // namespace

TensorDataset::TensorDataset(Tensor inputs, Tensor targets) : m_inputs(std::move(inputs)), m_targets(std::move(targets)) {
  MT_CHECK(m_inputs.defined() && m_targets.defined(), "TensorDataset: inputs and targets must be defined tensors");
  MT_CHECK(m_inputs.device().is_cpu() && m_targets.device().is_cpu(), "TensorDataset: inputs (",
           m_inputs.device(), ") and targets (", m_targets.device(), ") must be on the CPU");
  MT_CHECK(m_inputs.dim() >= 1 && m_targets.dim() == 1, "TensorDataset: inputs must be (N, ...) and targets (N); got ",
           m_inputs.shape(), " and ", m_targets.shape());
  MT_CHECK(m_inputs.size(0) == m_targets.size(0), "TensorDataset: ", m_inputs.size(0), " inputs but ",
           m_targets.size(0), " targets (shapes ", m_inputs.shape(), " and ", m_targets.shape(), ")");
}

DatasetLocation find_mnist(const std::string& dir) {
  if (!dir.empty()) {
    std::string why = missing_in(dir);
    MT_CHECK(why.empty(), "find_mnist: '", dir, "' does not hold MNIST (", why, ")");
    return {dir, dataset_name(dir)};
  }
  std::vector<std::pair<std::string, std::string>> tried;  // (place, why not)
  auto try_dir = [&](const std::string& place, const std::string& d) -> bool {
    std::string why = missing_in(d);
    if (why.empty()) return true;
    tried.emplace_back(place + " '" + d + "'", why);
    return false;
  };
  if (const char* env = std::getenv("MIXTAPE_MNIST_DIR"); env && *env) {
    if (try_dir("$MIXTAPE_MNIST_DIR", env)) return {env, dataset_name(env)};
  } else {
    tried.emplace_back("$MIXTAPE_MNIST_DIR", "not set");
  }
  if (try_dir("the default", "data/mnist")) return {"data/mnist", "MNIST"};
  if (try_dir("Debian's dataset-fashion-mnist", kDebianFashionMnistDir))
    return {kDebianFashionMnistDir, "Fashion-MNIST"};
  std::string list;
  for (const auto& [place, why] : tried) list += "\n  " + place + ": " + why;
  MT_ERROR("find_mnist: no MNIST found; tried:", list,
           "\nrun scripts/get_mnist.sh, or set MIXTAPE_MNIST_DIR to a directory holding the four files");
}

MNIST::MNIST(const DatasetLocation& where, Split split) : m_name(where.name), m_split(split) {
  const char* prefix = split == Split::kTrain ? "train" : "t10k";
  const std::string images_base = std::string(prefix) + "-images-idx3-ubyte";
  const std::string labels_base = std::string(prefix) + "-labels-idx1-ubyte";
  std::string images_path = resolve(where.dir, images_base), labels_path = resolve(where.dir, labels_base);
  MT_CHECK(!images_path.empty(), "MNIST: no file '", (fs::path(where.dir) / images_base).string(), "' (or .gz)");
  MT_CHECK(!labels_path.empty(), "MNIST: no file '", (fs::path(where.dir) / labels_base).string(), "' (or .gz)");

  Tensor images = read_idx(images_path);
  MT_CHECK(images.dtype() == DType::kU8, "MNIST: '", images_path, "' holds ", images.dtype(),
           " elements; MNIST images are u8");
  MT_CHECK(images.dim() == 3 && images.size(1) == 28 && images.size(2) == 28, "MNIST: '", images_path,
           "' has dims ", images.shape(), "; MNIST images are (N, 28, 28)");

  Tensor raw_labels = read_idx(labels_path);
  MT_CHECK(raw_labels.dtype() == DType::kU8, "MNIST: '", labels_path, "' holds ", raw_labels.dtype(),
           " elements; MNIST labels are u8");
  MT_CHECK(raw_labels.dim() == 1, "MNIST: '", labels_path, "' has dims ", raw_labels.shape(),
           "; MNIST labels are (N)");
  MT_CHECK(raw_labels.size(0) == images.size(0), "MNIST: '", images_path, "' has ", images.size(0), " images but '",
           labels_path, "' has ", raw_labels.size(0), " labels");

  const int64_t n = raw_labels.size(0);
  const uint8_t* src = raw_labels.data<uint8_t>();
  Tensor labels = empty({n}, TensorOptions(DType::kI64));
  int64_t* dst = labels.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    MT_CHECK(src[i] <= 9, "MNIST: '", labels_path, "' has label ", int{src[i]}, " at index ", i,
             "; labels are 0 to 9");
    dst[i] = src[i];
  }
  m_data = TensorDataset(std::move(images), std::move(labels));
}

}  // namespace mixtape::data
