// examples/mnist/resident.h — a split of MNIST kept on the device, and its batches gathered there (what the example
// and bench/mnist_gpu.cpp train from on a GPU).
#pragma once

#include <algorithm>
#include <cstdint>

#include <mixtape/mixtape.h>

namespace mnist {

namespace mt = mixtape;

/// A split kept on `device`: images normalised once as the DataLoader normalises them, and labels.
struct ResidentSplit {
  mt::Tensor x;  // (N, 1, 28, 28) f32
  mt::Tensor y;  // (N) i64
  ResidentSplit(const mt::data::MNIST& split, mt::Device device) {
    mt::data::DataLoader all(split, {.batch_size = std::max<int64_t>(split.size(), 1), .prefetch = false});
    const mt::data::Batch batch = *all.begin();
    x = batch.x.to(device);
    y = batch.y.to(device);
  }
  int64_t size() const { return y.size(0); }
  /// Samples [start, start + count) of `order` ((N) i64 on the device), gathered on the device.
  mt::data::Batch batch(const mt::Tensor& order, int64_t start, int64_t count) const {
    const mt::Tensor idx = order.slice(0, start, start + count);
    return {mt::index_select(x, 0, idx), mt::index_select(y, 0, idx)};
  }
};

}  // namespace mnist
