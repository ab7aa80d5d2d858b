// data/mnist.h — MNIST (and Fashion-MNIST, which has the same files): finding the four files and loading a split.
//
// A dataset is two tensors on the CPU, inputs and targets, with one row per sample (TensorDataset); MNIST is
// that, read from IDX files and validated as MNIST (28 × 28 u8 images, labels 0–9, as many labels as images).
#pragma once

#include <cstdint>
#include <string>

#include <mixtape/core/tensor.h>

namespace mixtape::data {

/// Inputs (N, ...) and targets (N) on the CPU: what a DataLoader batches.
class TensorDataset {
 public:
  TensorDataset() = default;
  /// Throws mixtape::Error unless both are defined CPU tensors with the same first dim N.
  TensorDataset(Tensor inputs, Tensor targets);
  int64_t size() const { return m_inputs.defined() ? m_inputs.size(0) : 0; }
  const Tensor& inputs() const { return m_inputs; }    // (N, ...)
  const Tensor& targets() const { return m_targets; }  // (N)

 private:
  Tensor m_inputs;
  Tensor m_targets;
};

enum class Split { kTrain, kTest };

/// Where the four files are, and which dataset they are ("MNIST" or "Fashion-MNIST").
struct DatasetLocation {
  std::string dir;
  std::string name;
};

/// The Debian package's Fashion-MNIST (`apt-get install dataset-fashion-mnist`), the last place find_mnist tries.
inline constexpr const char* kDebianFashionMnistDir = "/usr/share/datasets/fashion-mnist";

/// Finds a directory holding the four MNIST files (train-/t10k- images-idx3-ubyte / labels-idx1-ubyte, each raw
/// or .gz): `dir` when given (it must hold them, else an error naming what is missing); else $MIXTAPE_MNIST_DIR;
/// else ./data/mnist; else Debian's Fashion-MNIST. Throws mixtape::Error listing every place tried and what each
/// lacked. The name is "Fashion-MNIST" for the Debian directory or a path containing "fashion", else "MNIST".
///
///     mixtape::data::MNIST train(mixtape::data::find_mnist(), mixtape::data::Split::kTrain);
DatasetLocation find_mnist(const std::string& dir = "");

/// One split of MNIST: images (N, 28, 28) u8 and labels (N) i64, on the CPU.
class MNIST {
 public:
  /// Reads and validates the split's two files; throws mixtape::Error naming the file and what is wrong
  /// (besides read_idx's checks: not u8, images not (N, 28, 28), labels not (N), a label above 9, counts that differ).
  MNIST(const DatasetLocation& where, Split split);

  int64_t size() const { return m_data.size(); }
  const Tensor& images() const { return m_data.inputs(); }   // (N, 28, 28) u8
  const Tensor& labels() const { return m_data.targets(); }  // (N) i64
  const std::string& name() const { return m_name; }
  Split split() const { return m_split; }
  const TensorDataset& dataset() const { return m_data; }

 private:
  TensorDataset m_data;
  std::string m_name;
  Split m_split;
};

}  // namespace mixtape::data
