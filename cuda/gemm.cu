// cuda/gemm.cu — gemm_tensor_core: checks the arguments, picks the tile and the instantiation, launches.
//
// The kernels are cuda/gemm_kernel.cuh, instantiated per operand dtype in cuda/gemm_f16.cu,
// cuda/gemm_bf16.cu and cuda/gemm_tf32.cu; this file is the host side of cuda/gemm.cuh and the
// process-wide TF32 switch of cuda/runtime.h.
#include <mixtape/cuda/gemm.cuh>

#include <atomic>
#include <cstdint>
#include <limits>

#include <cuda_runtime.h>

#include <mixtape/core/error.h>
#include <mixtape/cuda/check.h>
#include <mixtape/cuda/gemm_kernel.cuh>
#include <mixtape/cuda/runtime.h>
#include <mixtape/cuda/stream.cuh>

namespace mixtape::cuda {

namespace {
std::atomic<bool> g_allow_tf32{false};
}  // namespace

void set_allow_tf32(bool allow) noexcept { g_allow_tf32.store(allow, std::memory_order_relaxed); }
bool allow_tf32() noexcept { return g_allow_tf32.load(std::memory_order_relaxed); }

}  // namespace mixtape::cuda

namespace mixtape::kernels::cuda {

namespace {

constexpr bool is_gemm_float(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

/// 16-byte cp.async needs every row start of every batch 16-byte aligned.
bool vector_ok(const GemmOperand& op, int64_t batches, DType dtype) {
  const int64_t vec = 16 / static_cast<int64_t>(itemsize(dtype));
  return reinterpret_cast<uintptr_t>(op.ptr) % 16 == 0 && op.ld % vec == 0 &&
         (batches <= 1 || op.batch_stride % vec == 0);
}

/// Whether the large tile's 136 KB of shared memory fit a block of the current device: sm_80's 163 KB and sm_90's
/// 227 do, the RTX cards' 99 (sm_86, sm_89, sm_120) do not, and there the small tile runs.
bool large_fits(DType in_dtype, bool trans_a, bool trans_b) {
  switch (in_dtype) {
    case DType::kF16: return gemm::large_tile_fits<__half>(trans_a, trans_b);
    case DType::kBF16: return gemm::large_tile_fits<__nv_bfloat16>(trans_a, trans_b);
    default: return gemm::large_tile_fits<float>(trans_a, trans_b);
  }
}

bool choose_large(int64_t m, int64_t n, int64_t batches, DType in_dtype, const GemmOperand& a,
                  const GemmOperand& b) {
  if (!vector_ok(a, batches, in_dtype) || !vector_ok(b, batches, in_dtype)) return false;
  // The large tile runs one block per SM: take it when its tiles fill every SM at least once.
  constexpr int64_t kBM = 128, kBN = 256;  // gemm::LargeTile (the same for every operand type)
  static_assert(gemm::LargeTile<__half>::BM == kBM && gemm::LargeTile<__half>::BN == kBN &&
                gemm::LargeTile<float>::BM == kBM && gemm::LargeTile<float>::BN == kBN);
  const int64_t tiles = (m + kBM - 1) / kBM * ((n + kBN - 1) / kBN) * batches;
  return tiles >= ::mixtape::cuda::multiprocessor_count(::mixtape::cuda::current_device()) &&
         large_fits(in_dtype, a.trans, b.trans);
}

/// Whether the split-K small tile for these operands runs as clusters of `split` blocks here: clusters allowed
/// (mixtape::cuda::set_allow_clusters), and gemm::split_k_runs (sm_90 code on the device, room for a cluster).
bool split_runs(DType in_dtype, bool trans_a, bool trans_b, int split) {
  if (!::mixtape::cuda::allow_clusters()) return false;
  if (::mixtape::cuda::compute_capability_major(::mixtape::cuda::current_device()) < 9) return false;
  switch (in_dtype) {
    case DType::kF16: return gemm::split_k_runs<__half>(trans_a, trans_b, split);
    case DType::kBF16: return gemm::split_k_runs<__nv_bfloat16>(trans_a, trans_b, split);
    default: return gemm::split_k_runs<float>(trans_a, trans_b, split);
  }
}

/// Blocks per split-K cluster for the small tile (1: no split). Where clusters run (split_runs), the most of 2, 4
/// and 8 whose clusters still fit one block per SM and leave every block at least two tiles of K (a pipeline with
/// something to overlap): 128 × 512 × 784 in f16 is 16 tiles of 25 K steps, split 8 ways into 128 blocks of
/// 3-4 steps. A problem that already has a block for every SM is not split. Results are bit-reproducible for
/// one device and configuration only: S follows the SM count (128 × 512 × 784 splits 8 ways on a 132-SM H100 SXM,
/// 4 on a 114-SM H100 PCIe) and whether clusters run (set_allow_clusters, MPS limits).
int choose_split(int64_t m, int64_t n, int64_t k, int64_t batches, DType in_dtype, bool trans_a, bool trans_b) {
  constexpr int64_t kBM = 64, kBN = 64;  // gemm::SmallTile
  static_assert(gemm::SmallTile<__half>::BM == kBM && gemm::SmallTile<__half>::BN == kBN &&
                gemm::SmallTile<float>::BM == kBM && gemm::SmallTile<float>::BN == kBN);
  const int64_t tiles = (m + kBM - 1) / kBM * ((n + kBN - 1) / kBN) * batches;
  const int64_t bk = 64 / static_cast<int64_t>(itemsize(in_dtype));  // gemm::TileConfig::BK: 64 bytes of K
  const int64_t ktiles = (k + bk - 1) / bk;
  const int64_t sms = ::mixtape::cuda::multiprocessor_count(::mixtape::cuda::current_device());
  int split = 1;
  for (int s = 2; s <= gemm::kMaxSplitK; s *= 2)
    if (tiles * s <= sms && ktiles >= 2 * s && split_runs(in_dtype, trans_a, trans_b, s)) split = s;
  return split;
}

/// The blocks per cluster a forced tile asks for (1 for the others).
int forced_split(GemmTile tile) {
  switch (tile) {
    case GemmTile::kSplitK2: return 2;
    case GemmTile::kSplitK4: return 4;
    case GemmTile::kSplitK8: return 8;
    default: return 1;
  }
}

}  // namespace

bool gemm_tensor_core_supports(DType in_dtype, DType out_dtype, int device) noexcept {
  if (!is_gemm_float(in_dtype) || !is_gemm_float(out_dtype)) return false;
  try {
    return ::mixtape::cuda::compute_capability_major(device) >= 8;  // asked once per device
  } catch (...) {  // noexcept: no such device, or CUDA refused; the caller takes the other path
    return false;
  }
}

const char* gemm_tile_name(GemmTile tile) noexcept {
  switch (tile) {
    case GemmTile::kAuto: return "auto";
    case GemmTile::kLarge: return "large";
    case GemmTile::kSmall: return "small";
    case GemmTile::kSplitK2: return "small, K split 2";
    case GemmTile::kSplitK4: return "small, K split 4";
    case GemmTile::kSplitK8: return "small, K split 8";
  }
  return "?";
}

GemmTile gemm_tensor_core_tile(int64_t m, int64_t n, int64_t k, int64_t batches, DType in_dtype,
                               const GemmOperand& a, const GemmOperand& b) {
  if (choose_large(m, n, batches, in_dtype, a, b)) return GemmTile::kLarge;
  switch (choose_split(m, n, k, batches, in_dtype, a.trans, b.trans)) {
    case 2: return GemmTile::kSplitK2;
    case 4: return GemmTile::kSplitK4;
    case 8: return GemmTile::kSplitK8;
    default: return GemmTile::kSmall;
  }
}

void gemm_tensor_core(int64_t m, int64_t n, int64_t k, int64_t batches, DType in_dtype, const GemmOperand& a,
                      const GemmOperand& b, void* c, int64_t ldc, int64_t c_batch_stride, DType out_dtype,
                      const GemmEpilogue& epi, cudaStream_t stream, GemmTile tile) {
  auto shapes = [&] {
    return detail::str_cat("m ", m, ", n ", n, ", k ", k, ", batches ", batches, ", A ", a.trans ? "(k, m)" : "(m, k)",
                           " ld ", a.ld, ", B ", b.trans ? "(n, k)" : "(k, n)", " ld ", b.ld, ", ldc ", ldc);
  };
  MT_CHECK(is_gemm_float(in_dtype), "gemm_tensor_core: operands must be f16, bf16 or f32 (TF32), got ", in_dtype);
  MT_CHECK(is_gemm_float(out_dtype), "gemm_tensor_core: output must be f32, f16 or bf16, got ", out_dtype);
  MT_CHECK(epi.bias == nullptr || is_gemm_float(epi.bias_dtype),
           "gemm_tensor_core: bias must be f32, f16 or bf16, got ", epi.bias_dtype);
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  MT_CHECK(m >= 0 && n >= 0 && k >= 0 && batches >= 0 && m <= kMax && n <= kMax && k <= kMax && batches <= kMax,
           "gemm_tensor_core: sizes must lie in [0, 2^31) (", shapes(), ")");
  if (m == 0 || n == 0 || batches == 0) return;
  MT_CHECK(c != nullptr, "gemm_tensor_core: null output (", shapes(), ")");
  MT_CHECK(ldc >= n, "gemm_tensor_core: ldc must be at least n (", shapes(), ")");
  if (k > 0) {
    MT_CHECK(a.ptr != nullptr && b.ptr != nullptr, "gemm_tensor_core: null operand (", shapes(), ")");
    MT_CHECK(a.ld >= (a.trans ? m : k) && b.ld >= (b.trans ? k : n),
             "gemm_tensor_core: a leading dimension is shorter than its rows (", shapes(), ")");
  }

  GemmParams p{};
  p.a = a.ptr, p.b = b.ptr, p.c = c, p.bias = epi.bias;
  p.lda = a.ld, p.ldb = b.ld, p.ldc = ldc;
  p.a_batch = a.batch_stride, p.b_batch = b.batch_stride, p.c_batch = c_batch_stride;
  p.m = static_cast<int>(m), p.n = static_cast<int>(n), p.k = static_cast<int>(k);
  p.batches = static_cast<int>(batches);
  p.out_dtype = out_dtype, p.bias_dtype = epi.bias_dtype;
  p.relu = epi.relu;
  p.trans_a = a.trans, p.trans_b = b.trans;
  p.vec_a = k > 0 && vector_ok(a, batches, in_dtype);
  p.vec_b = k > 0 && vector_ok(b, batches, in_dtype);
  const bool large = p.vec_a && p.vec_b &&
                     ((tile == GemmTile::kLarge && large_fits(in_dtype, a.trans, b.trans)) ||
                      (tile == GemmTile::kAuto && choose_large(m, n, batches, in_dtype, a, b)));
  int split = 1;
  if (!large) {
    if (tile == GemmTile::kAuto) split = choose_split(m, n, k, batches, in_dtype, a.trans, b.trans);
    else if (forced_split(tile) > 1 && split_runs(in_dtype, a.trans, b.trans, forced_split(tile)))
      split = forced_split(tile);
  }
  // Blocks along x: the small tile has the most tiles (64 × 64), times the blocks of a cluster.
  MT_CHECK((m + 63) / 64 * ((n + 63) / 64) * split <= kMax, "gemm_tensor_core: too many tiles (", shapes(), ")");

  switch (in_dtype) {
    case DType::kF16: gemm::launch<__half>(p, large, split, stream); break;
    case DType::kBF16: gemm::launch<__nv_bfloat16>(p, large, split, stream); break;
    default: gemm::launch<float>(p, large, split, stream); break;
  }
}

std::vector<GemmKernelInfo> gemm_tensor_core_kernels(DType in_dtype) {
  switch (in_dtype) {
    case DType::kF16: return gemm::kernel_infos<__half>();
    case DType::kBF16: return gemm::kernel_infos<__nv_bfloat16>();
    case DType::kF32: return gemm::kernel_infos<float>();
    default: MT_ERROR("gemm_tensor_core_kernels: operands must be f16, bf16 or f32 (TF32), got ", in_dtype);
  }
}

}  // namespace mixtape::kernels::cuda
