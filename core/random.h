// core/random.h — a seedable, counter-based generator (Philox4x32-10).
//
// Element i of a draw is a pure function of (seed, offset + i), so the same
// seed gives the same numbers on every machine, with any number of threads,
// and on the GPU (the CUDA layer calls the same MT_HD function).
#pragma once

#include <array>
#include <cstdint>
#include <mutex>

#include <mixtape/core/macros.h>
#include <mixtape/core/tensor.h>

namespace mixtape {

/// Philox4x32 with 10 rounds (Salmon et al., SC'11): four 32-bit outputs per (key, counter).
MT_HD inline void philox4x32_10(uint64_t key, uint64_t counter_hi, uint64_t counter_lo, uint32_t out[4]) {
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/// A uniform float in [0, 1) from the top 24 bits of `bits`.
MT_HD inline float uniform_float(uint32_t bits) { return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f); }
/// A uniform double in [0, 1) from 53 bits.
MT_HD inline double uniform_double(uint32_t hi, uint32_t lo) {
  uint64_t v = (static_cast<uint64_t>(hi) << 21) ^ (lo >> 11);
  return static_cast<double>(v & ((uint64_t{1} << 53) - 1)) * (1.0 / 9007199254740992.0);
}

/// The sort key of position i of a random permutation drawn at (seed, offset): the first 64 bits of Philox at
/// counter offset + i. Sorting 0..n-1 by (key, i) gives the permutation, alike on every device (mixtape::randperm).
MT_HD inline uint64_t permutation_key(uint64_t seed, uint64_t offset, int64_t i) {
  uint32_t r[4];
  philox4x32_10(seed, 0, offset + static_cast<uint64_t>(i), r);
  return static_cast<uint64_t>(r[0]) << 32 | r[1];
}

/// Where a stream of random numbers stands: its seed and how many counters it has handed out.
struct GeneratorState {
  uint64_t seed = 0;
  uint64_t offset = 0;
  bool operator==(const GeneratorState&) const = default;
};

/// The state of a stream of random numbers: a seed and how far it has been read. Safe to share between threads:
/// each advance() reserves its own counters (no two draws get the same ones, none are skipped).
class Generator {
 public:
  explicit Generator(uint64_t seed = 0x6d69787461706521ull) : m_state{seed, 0} {}
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  void manual_seed(uint64_t seed) { set_state({seed, 0}); }
  uint64_t seed() const { return state().seed; }
  uint64_t offset() const { return state().offset; }
  /// Reserves `n` counters and returns the first; a draw of n values uses counters [first, first + n).
  uint64_t advance(uint64_t n) { return reserve(n).offset; }
  /// Reserves `n` counters: the seed they belong to and the first of them, read together (a manual_seed on another
  /// thread cannot fall between the two).
  GeneratorState reserve(uint64_t n) {
    std::lock_guard lock(m_mutex);
    const GeneratorState first = m_state;
    m_state.offset += n;
    return first;
  }
  /// The seed and offset together (a checkpoint saves them; set_state puts the stream back where it was).
  GeneratorState state() const {
    std::lock_guard lock(m_mutex);
    return m_state;
  }
  void set_state(GeneratorState state) {
    std::lock_guard lock(m_mutex);
    m_state = state;
  }
  /// Sets the state to `desired` only if it is `expected` (nothing moved it since the caller looked); whether it did.
  bool compare_and_set(GeneratorState expected, GeneratorState desired) {
    std::lock_guard lock(m_mutex);
    if (m_state != expected) return false;
    m_state = desired;
    return true;
  }

 private:
  mutable std::mutex m_mutex;
  GeneratorState m_state;
};

/// The process-wide default generator (the one `rand`, `randn`, dropout and initializers use).
Generator& default_generator();
/// Seeds the default generator, like torch::manual_seed.
void manual_seed(uint64_t seed);

/// Uniform values in [0, 1).
Tensor rand(const Shape& shape, TensorOptions options = {}, Generator* gen = nullptr);
/// Uniform values in [low, high).
Tensor uniform(const Shape& shape, double low, double high, TensorOptions options = {}, Generator* gen = nullptr);
/// Standard normal values (Box–Muller).
Tensor randn(const Shape& shape, TensorOptions options = {}, Generator* gen = nullptr);
/// Integers uniform in [low, high) (dtype i64 unless given).
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions options = TensorOptions(DType::kI64),
               Generator* gen = nullptr);

}  // namespace mixtape
