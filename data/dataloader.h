// data/dataloader.h — batches of a dataset, shuffled reproducibly, assembled one batch ahead on a worker thread.
//
// The design idea: the loader owns at most one batch the loop has not asked for yet. While the loop trains on
// batch k, a worker thread gathers, normalises (and with a CUDA device, copies) batch k+1 and waits; the loop
// takes it and the worker starts on k+2. An exception on the worker is rethrown to the loop by the ++ that
// would have returned that batch; destroying the loader or starting a new epoch stops and joins the worker.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>

#include <mixtape/core/device.h>
#include <mixtape/core/tensor.h>
#include <mixtape/data/mnist.h>

namespace mixtape::data {

/// One batch: x (B, 1, 28, 28) f32 = (pixel/255 − mean)/std, y (B) i64.
struct Batch {
  Tensor x;
  Tensor y;
};

struct DataLoaderOptions {
  int64_t batch_size = 64;
  bool shuffle = false;    // a new permutation each epoch, drawn from (seed, epoch number)
  bool drop_last = false;  // drop the last batch when it has fewer than batch_size samples
  uint64_t seed = 0;
  double mean = 0.1307;    // MNIST's pixel mean and standard deviation (after /255)
  double std = 0.3081;
  bool prefetch = true;    // assemble the next batch on a worker thread
  Device device = Device::cpu();
};

/// Iterates a dataset in batches; each `begin()` starts a new epoch.
///
///     mixtape::data::MNIST train(mixtape::data::find_mnist(), mixtape::data::Split::kTrain);
///     mixtape::data::DataLoader loader(train, {.batch_size = 128, .shuffle = true, .seed = 1});
///     for (int epoch = 0; epoch < 10; ++epoch)
///       for (auto& [x, y] : loader) { /* x (128, 1, 28, 28) f32, y (128) i64 */ }
///
/// Inputs: u8 values v become float((v/255 − mean)/std) (computed in double, rounded once); f32/f64 values
/// become float((v − mean)/std). (N, H, W) inputs gain a channel dim: x is (B, 1, H, W); otherwise (B, ...).
/// Targets of any integer dtype become i64.
class DataLoader {
  struct State;

 public:
  /// An input iterator over one epoch's batches; the end iterator is the default-constructed one.
  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = Batch*;
    using reference = Batch&;

    Iterator() = default;
    Batch& operator*() { return m_batch; }
    Batch* operator->() { return &m_batch; }
    /// Takes the next batch (waiting for the worker if it is not ready yet); rethrows the worker's exception.
    Iterator& operator++();
    /// Iterators compare equal when both are at the end (past the last batch, or the end iterator).
    bool operator==(const Iterator& other) const { return at_end() == other.at_end(); }
    /// Index of the current batch in the epoch.
    int64_t index() const { return m_index; }

   private:
    friend class DataLoader;
    Iterator(State* state, uint64_t epoch);
    bool at_end() const { return m_state == nullptr; }

    State* m_state = nullptr;  // null at the end
    uint64_t m_epoch = 0;
    int64_t m_index = 0;
    Batch m_batch;
  };

  /// Throws mixtape::Error on a batch_size below 1 or a std that is not positive and finite.
  DataLoader(const MNIST& dataset, DataLoaderOptions options = {});
  DataLoader(const TensorDataset& dataset, DataLoaderOptions options = {});
  ~DataLoader();
  DataLoader(DataLoader&&) noexcept;
  DataLoader& operator=(DataLoader&&) noexcept;
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  /// Starts a new epoch (stopping the previous one's worker, if any) and returns its first batch.
  Iterator begin();
  Iterator end() { return {}; }
  /// Batches per epoch.
  int64_t size() const;
  /// Samples in the dataset.
  int64_t num_samples() const;
  /// Epochs begun so far (the next begin() starts epoch number epochs_begun()).
  uint64_t epochs_begun() const;
  const DataLoaderOptions& options() const;

 private:
  std::unique_ptr<State> m_state;
};

}  // namespace mixtape::data
