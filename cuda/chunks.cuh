// cuda/chunks.cuh — multi-tensor launches (internal to the .cu files): one kernel launch updates many tensors.
//
// A list's tensors whose operands are all contiguous are grouped by dtype and cut into chunks (cuda/chunks.h);
// each launch carries its table of runs — pointers, element ranges, first blocks and a per-run extra (an update
// count, a flag) — as one __grid_constant__ kernel parameter of at most 4 KiB, so a block finds its tensor without
// a copy to the device and the launch needs no memory of its own (a CUDA graph can capture it as is). A block's
// threads stride over its chunk; element i of a chunk is element i of its tensor, so a kernel that keys anything on
// the element's position (stochastic rounding) gives the bits of a launch per tensor. Tensors with a strided
// operand keep the grid-stride kernels of one tensor (cuda/launch.cuh's offsets), the CPU's layouts.
#pragma once
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <span>
#include <vector>

#include <mixtape/core/tensor.h>
#include <mixtape/cuda/chunks.h>
#include <mixtape/cuda/launch.cuh>

namespace mixtape::kernels::cuda {

/// The most blocks one multi-tensor launch has (a grid's x dimension allows 2^31 − 1).
inline constexpr int64_t kMaxChunkBlocks = int64_t{1} << 30;

struct NoExtra {};

/// One launch's table: up to kMaxRuns runs of K operands each (kernel parameter; its size is checked against the
/// 4 KiB every CUDA version takes).
template <int K, int kRuns, class Extra = NoExtra>
struct ChunkList {
  static constexpr int kMaxRuns = kRuns;
  int n;                        // runs in this launch
  int first_block[kRuns];       // ascending, first_block[0] = 0
  int64_t begin[kRuns];         // the run's first element in its tensor
  int64_t end[kRuns];           // one past its last
  void* ptr[kRuns][K];          // the operands' first elements (null: absent)
  Extra extra[kRuns];
};

/// What a block of a multi-tensor launch takes: run `run`'s elements [start, stop).
struct BlockChunk {
  int run;
  int64_t start, stop;
};

template <class List>
__device__ __forceinline__ BlockChunk block_chunk(const List& l) {
  int r = l.n - 1;
  while (r > 0 && static_cast<int>(blockIdx.x) < l.first_block[r]) --r;
  const int64_t start = l.begin[r] + (static_cast<int64_t>(blockIdx.x) - l.first_block[r]) * kChunkElements;
  return {r, start, start + kChunkElements < l.end[r] ? start + kChunkElements : l.end[r]};
}

/// Whether every operand of an entry (null: absent) is contiguous, so that its elements are indexed alike.
template <class Operands>
bool all_contiguous(const Operands& operands) {
  for (const Tensor* t : operands)
    if (t != nullptr && !t->is_contiguous()) return false;
  return true;
}

/// The entries of a list to launch: `chunked[d]` those of floating dtype kDTypes[d] (their order kept) that go in
/// multi-tensor launches, `strided` the others (an entry with a strided operand, or of another dtype, which the
/// one-tensor launcher refuses); empty entries are in neither.
struct ChunkGroups {
  static constexpr DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64};
  std::vector<ChunkTensor> chunked[4];
  std::vector<size_t> strided;
};

/// Sorts entries 0..n-1 into ChunkGroups: dtype(i) is entry i's dtype, numel(i) its element count, dense(i)
/// whether all its operands are contiguous.
template <class DTypeOf, class NumelOf, class DenseOf>
ChunkGroups group_for_chunks(size_t n, DTypeOf&& dtype, NumelOf&& numel, DenseOf&& dense) {
  ChunkGroups g;
  for (size_t i = 0; i < n; ++i) {
    if (numel(i) == 0) continue;
    if (!dense(i)) {
      g.strided.push_back(i);
      continue;
    }
    const DType* d = std::find(std::begin(ChunkGroups::kDTypes), std::end(ChunkGroups::kDTypes), dtype(i));
    if (d == std::end(ChunkGroups::kDTypes)) g.strided.push_back(i);  // not floating: its launcher says so
    else g.chunked[d - std::begin(ChunkGroups::kDTypes)].push_back({static_cast<int>(i), numel(i)});
  }
  return g;
}

/// Launches over `tensors` in as few launches as their tables allow: for each, fill(list, r, index) sets run r's
/// ptr and extra for the caller's entry `index`, then go(list, blocks) launches.
template <class List, class Fill, class Go>
void launch_chunks(std::span<const ChunkTensor> tensors, Fill&& fill, Go&& go) {
  static_assert(sizeof(List) <= 3584, "a multi-tensor table leaves room for the kernel's other parameters in 4 KiB");
  plan_chunk_launches<List::kMaxRuns>(tensors, List::kMaxRuns, kMaxChunkBlocks,
                                      [&](std::span<const ChunkRun> runs, int blocks) {
                                        List l{};
                                        l.n = static_cast<int>(runs.size());
                                        for (int r = 0; r < l.n; ++r) {
                                          l.first_block[r] = runs[r].first_block;
                                          l.begin[r] = runs[r].begin;
                                          l.end[r] = runs[r].end;
                                          fill(l, r, runs[r].index);
                                        }
                                        go(l, blocks);
                                      });
}

}  // namespace mixtape::kernels::cuda
