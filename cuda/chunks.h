// cuda/chunks.h — how a multi-tensor launch cuts a list of tensors into blocks (host code only, no CUDA: the CPU
// tests check it).
//
// One launch updates many tensors (Apex's and PyTorch's multi_tensor_apply): every block takes one chunk of
// kChunkElements consecutive elements of one tensor, and the kernel's parameters say which (a short table of runs:
// tensor, element range, first block). plan_chunk_launches cuts a list into launches whose tables fit the kernel's
// parameter space: at most `max_runs` runs and `max_blocks` blocks a launch. A tensor too big for what is left of a
// launch goes on in the next one (a second run of the same tensor), so every element of every tensor is in exactly
// one chunk, chunks never cross tensors, and the tensors come in the order given.
#pragma once
#include <algorithm>
#include <cstdint>
#include <span>

namespace mixtape::kernels::cuda {

/// Elements a block of a multi-tensor launch takes (its threads stride over them).
inline constexpr int64_t kChunkElements = 4096;

/// One tensor of a list to plan: where the caller keeps it, and its element count (> 0).
struct ChunkTensor {
  int index;
  int64_t numel;
};

/// A run of one tensor's chunks inside a launch: elements [begin, end) of tensor `index`, taken by blocks
/// first_block, first_block + 1, ... of the launch (each kChunkElements, the last one what is left).
struct ChunkRun {
  int index;
  int64_t begin, end;
  int first_block;
};

/// The blocks a run of [begin, end) takes.
inline int64_t chunk_blocks(int64_t begin, int64_t end) { return (end - begin + kChunkElements - 1) / kChunkElements; }

/// Calls launch(std::span<const ChunkRun> runs, int blocks) for consecutive launches covering every element of
/// `tensors` once (runs in the list's order, first_block ascending from 0, blocks = the launch's grid). Each launch
/// has 1..max_runs runs and 1..max_blocks blocks. 1 <= max_runs <= kMaxRuns; 1 <= max_blocks <= INT_MAX (a grid).
template <int kMaxRuns, class Launch>
void plan_chunk_launches(std::span<const ChunkTensor> tensors, int max_runs, int64_t max_blocks, Launch&& launch) {
  static_assert(kMaxRuns > 0);
  ChunkRun runs[kMaxRuns];
  int n = 0;
  int64_t blocks = 0;
  auto flush = [&] {
    if (n > 0) launch(std::span<const ChunkRun>(runs, static_cast<size_t>(n)), static_cast<int>(blocks));
    n = 0;
    blocks = 0;
  };
  for (const ChunkTensor& t : tensors) {
    int64_t begin = 0;
    while (begin < t.numel) {
      if (n == max_runs || blocks == max_blocks) flush();
      const int64_t take = std::min(chunk_blocks(begin, t.numel), max_blocks - blocks);
      const int64_t end = std::min(t.numel, begin + take * kChunkElements);
      runs[n++] = {t.index, begin, end, static_cast<int>(blocks)};
      blocks += take;
      begin = end;
    }
  }
  flush();
}

}  // namespace mixtape::kernels::cuda
