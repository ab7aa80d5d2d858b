// data/dataloader.cpp — the loader's state, the worker thread, and one batch's gather and normalisation.
//
// Hand-off protocol (all under `mu`): the worker waits until `slot` is empty, assembles batch b outside the
// lock, then fills `slot` (or `error`); the consumer waits until `slot` or `error` is set and empties it. So the
// worker is never more than one batch ahead, and `stop` (set by a new epoch or the destructor) is seen at each wait.
#include <mixtape/data/dataloader.h>

#include <array>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <mixtape/core/error.h>
#include <mixtape/core/random.h>
#include <mixtape/core/raw.h>

namespace mixtape::data {

struct DataLoader::State {
  // ---- fixed at construction ----
  Tensor inputs;   // (N, ...) contiguous, CPU, u8/f32/f64
  Tensor targets;  // (N) i64, CPU
  DataLoaderOptions opt;
  Shape x_shape;   // of one sample in a batch: (1, H, W) for (N, H, W) inputs, else inputs.shape()[1:]
  int64_t n = 0, row = 0, batches = 0;
  std::array<float, 256> lut{};  // u8 value → normalised f32

  // ---- the current epoch (written only while no worker runs) ----
  uint64_t epochs_begun = 0;
  std::vector<int64_t> order;  // (N) sample indices in this epoch's order
  bool failed = false;         // the worker threw: the epoch is over

  // ---- the hand-off ----
  std::mutex mu;
  std::condition_variable cv;
  std::optional<Batch> slot;
  std::exception_ptr error;
  bool stop = false;
  std::thread worker;

  ~State() { stop_worker(); }

  void stop_worker() {
    {
      std::lock_guard lock(mu);
      stop = true;
    }
    cv.notify_all();
    if (worker.joinable()) worker.join();
    stop = false;
    slot.reset();
    error = nullptr;
  }

  // Fisher–Yates driven by Philox at (seed, counter = (epoch, i)): the same order for the same (seed, epoch) on
  // every machine, a different one each epoch.
  void draw_order(uint64_t epoch) {
    order.resize(n);
    for (int64_t i = 0; i < n; ++i) order[i] = i;
    if (!opt.shuffle) return;
    for (int64_t i = n - 1; i > 0; --i) {
      uint32_t r[4];
      philox4x32_10(opt.seed, epoch, static_cast<uint64_t>(i), r);
      uint64_t bits = uint64_t{r[0]} << 32 | r[1];
      // Lemire's multiply-shift: uniform in [0, i] without a division.
      int64_t j = static_cast<int64_t>((static_cast<unsigned __int128>(bits) * static_cast<uint64_t>(i + 1)) >> 64);
      std::swap(order[i], order[j]);
    }
  }

  Batch assemble(int64_t b) const {
    const int64_t start = b * opt.batch_size;
    const int64_t len = std::min(opt.batch_size, n - start);
    const int64_t* idx = order.data() + start;

    std::vector<int64_t> dims{len};
    for (int64_t d : x_shape) dims.push_back(d);
    Tensor x = empty(Shape(dims), TensorOptions(DType::kF32));
    Tensor y = empty({len}, TensorOptions(DType::kI64));
    float* xd = x.data<float>();
    int64_t* yd = y.data<int64_t>();
    const int64_t* t = targets.data<int64_t>();
    for (int64_t k = 0; k < len; ++k) {
      const int64_t i = idx[k];
      float* dst = xd + k * row;
      switch (inputs.dtype()) {
        case DType::kU8: {
          const uint8_t* src = inputs.data<uint8_t>() + i * row;
          for (int64_t e = 0; e < row; ++e) dst[e] = lut[src[e]];
          break;
        }
        case DType::kF32: {
          const float* src = inputs.data<float>() + i * row;
          for (int64_t e = 0; e < row; ++e) dst[e] = static_cast<float>((src[e] - opt.mean) / opt.std);
          break;
        }
        default: {  // kF64 (the constructor admits nothing else)
          const double* src = inputs.data<double>() + i * row;
          for (int64_t e = 0; e < row; ++e) dst[e] = static_cast<float>((src[e] - opt.mean) / opt.std);
          break;
        }
      }
      yd[k] = t[i];
    }
    if (!opt.device.is_cpu()) {
      x = raw::to(x, opt.device);
      y = raw::to(y, opt.device);
    }
    return {std::move(x), std::move(y)};
  }

  void worker_main() {
    for (int64_t b = 0; b < batches; ++b) {
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return stop || !slot; });
        if (stop) return;
      }
      std::optional<Batch> batch;
      std::exception_ptr err;
      try {
        batch = assemble(b);
      } catch (...) {
        err = std::current_exception();
      }
      const bool failed_here = err != nullptr;
      {
        std::lock_guard lock(mu);
        if (stop) return;
        // Moved, not copied: the loop alone then owns the exception and releases it (ThreadSanitizer cannot see
        // the atomic reference count inside libstdc++, and reported the worker's release of a copy as a race).
        if (failed_here) error = std::move(err); else slot = std::move(batch);
      }
      cv.notify_all();
      if (failed_here) return;
    }
  }

  // Batch b of the current epoch: from the worker, or assembled here without prefetch.
  Batch take(int64_t b) {
    MT_CHECK(!failed, "DataLoader: this epoch failed with an exception earlier; begin() starts a new one");
    if (!opt.prefetch) return assemble(b);
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return slot.has_value() || error != nullptr; });
    if (error) {
      failed = true;
      std::exception_ptr e = error;
      error = nullptr;
      lock.unlock();
      std::rethrow_exception(e);
    }
    Batch batch = std::move(*slot);
    slot.reset();
    lock.unlock();
    cv.notify_all();
    return batch;
  }
};

DataLoader::DataLoader(const MNIST& dataset, DataLoaderOptions options) : DataLoader(dataset.dataset(), options) {}

DataLoader::DataLoader(const TensorDataset& dataset, DataLoaderOptions options) : m_state(std::make_unique<State>()) {
  State& s = *m_state;
  MT_CHECK(dataset.inputs().defined(), "DataLoader: the dataset is empty (default-constructed)");
  MT_CHECK(options.batch_size >= 1, "DataLoader: batch_size must be at least 1, got ", options.batch_size);
  MT_CHECK(std::isfinite(options.std) && options.std > 0 && std::isfinite(options.mean), "DataLoader: mean (",
           options.mean, ") must be finite and std (", options.std, ") positive and finite");
  const DType in = dataset.inputs().dtype();
  MT_CHECK(in == DType::kU8 || in == DType::kF32 || in == DType::kF64, "DataLoader: inputs of dtype ", in,
           " are not supported (u8 images, f32 or f64)");
  const DType tg = dataset.targets().dtype();
  MT_CHECK(!is_floating(tg) && tg != DType::kBool, "DataLoader: targets must be integers (class indices), got ", tg);
  s.opt = options;
  s.inputs = raw::contiguous(dataset.inputs());
  s.targets = raw::contiguous(raw::to(dataset.targets(), DType::kI64));
  s.n = s.inputs.size(0);
  s.row = s.n ? s.inputs.numel() / s.n : 0;
  if (s.row == 0) {  // numel()/n is 0 when n is 0: compute the row from the shape instead
    s.row = 1;
    for (int64_t d = 1; d < s.inputs.dim(); ++d) s.row *= s.inputs.size(d);
  }
  if (s.inputs.dim() == 3) s.x_shape = Shape{1, s.inputs.size(1), s.inputs.size(2)};
  else
    for (int64_t d = 1; d < s.inputs.dim(); ++d) s.x_shape.push_back(s.inputs.size(d));
  s.batches = options.drop_last ? s.n / options.batch_size : (s.n + options.batch_size - 1) / options.batch_size;
  for (int v = 0; v < 256; ++v) s.lut[v] = static_cast<float>((v / 255.0 - options.mean) / options.std);
}

DataLoader::~DataLoader() = default;
DataLoader::DataLoader(DataLoader&&) noexcept = default;
DataLoader& DataLoader::operator=(DataLoader&&) noexcept = default;

DataLoader::Iterator DataLoader::begin() {
  MT_CHECK(m_state != nullptr, "DataLoader: begin() on a moved-from loader");
  State& s = *m_state;
  s.stop_worker();
  const uint64_t epoch = s.epochs_begun++;
  s.failed = false;
  s.draw_order(epoch);
  if (s.batches == 0) return {};
  if (s.opt.prefetch) s.worker = std::thread([&s] { s.worker_main(); });
  return Iterator(&s, epoch);
}

DataLoader::Iterator::Iterator(State* state, uint64_t epoch) : m_state(state), m_epoch(epoch), m_index(0) {
  m_batch = m_state->take(0);
}

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  MT_CHECK(m_state != nullptr, "DataLoader: ++ on an iterator at the end");
  MT_CHECK(m_state->epochs_begun == m_epoch + 1, "DataLoader: this iterator belongs to epoch ", m_epoch,
           ", but begin() has started epoch ", m_state->epochs_begun - 1);
  if (++m_index == m_state->batches) {
    m_state = nullptr;
    m_batch = {};
    return *this;
  }
  m_batch = m_state->take(m_index);
  return *this;
}

int64_t DataLoader::size() const { return m_state->batches; }
int64_t DataLoader::num_samples() const { return m_state->n; }
uint64_t DataLoader::epochs_begun() const { return m_state->epochs_begun; }
const DataLoaderOptions& DataLoader::options() const { return m_state->opt; }

}  // namespace mixtape::data
