// bench/gemm.cu — mixtape's WMMA GEMM against cuBLAS on the same GPU (bench_gpu_gemm).
//
// For each shape: mixtape WMMA (f16 and bf16 in, f32 accumulate, output in the input dtype) against
// cublasGemmEx with the same dtypes and CUBLAS_COMPUTE_32F, and mixtape's f32 SIMT matmul
// (kernels::cuda::matmul) against cublasSgemm (pure f32, no TF32). Inputs are uniform in [-1, 1)
// (never zeros: a Tensor Core multiplying zeros draws less power and clocks higher). Before timing,
// every mixtape result is compared with cuBLAS's (relative Frobenius error, computed on the device) and
// the program fails when it is off. mixtape and its peer are timed in 21 interleaved pairs of runs after
// at least 20 ms of alternating warm-up, a run being a CUDA-event-timed burst of back-to-back launches
// of about 0.5 ms (so launch gaps of tiny MNIST GEMMs count the way they do in training); the ratio is
// the median of the pairs' ratios, the TFLOP/s (2mnk / time) each side's median. Prints the ratios the
// issue set as targets, and the registers / shared memory of every WMMA instantiation. Where the automatic
// choice splits K over thread-block clusters (sm_90, the MNIST shapes), it also times that against the same
// small tile unsplit. First it times the launch floor: idle kernels of the small tile's shape as graph nodes,
// plain and as clusters of 2, 4 and 8 blocks (what a split-K launch costs before any work).
//
// The MNIST products last 1-12 µs, close to what a host launch costs, so a burst of launches can time the host
// as much as the GPU (and clocks move between shapes: cuBLAS measured 7.7 and then 12.4 TFLOP/s at 128 × 512 ×
// 784 on two H100 runs). For them the program also times device work alone: each side's burst is captured once
// into a CUDA graph and the two graphs are replayed in interleaved pairs, with the SM clock read on the device
// (clock64 against %globaltimer) before and after, so a ratio comes with the clocks it was measured at, and
// each graph's nodes are counted (one kernel a product for mixtape; cuBLAS may add a reduce kernel or a memset).
//
// Layouts: NN = A (m, k) · B (k, n); NT reads B stored (n, k) (Linear forward: x·Wᵀ); TN reads A stored
// (k, m) (the weight gradient Xᵀ·dY). cuBLAS is column-major: row-major C = A·B is computed as
// Cᵀ = Bᵀ·Aᵀ, i.e. the operands swap and each keeps its own transpose flag.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <mixtape/core/dtype.h>
#include <mixtape/core/error.h>
#include <mixtape/core/tensor.h>
#include <mixtape/cuda/check.h>
#include <mixtape/cuda/cluster.cuh>
#include <mixtape/cuda/gemm.cuh>
#include <mixtape/ops/backend/kernels.h>
#include <mixtape/cuda/runtime.h>

namespace mt = mixtape;
namespace kc = mixtape::kernels::cuda;
using mt::DType;
using mt::Tensor;

#define BENCH_CUBLAS(expr, what)                                                       \
  do {                                                                                 \
    const cublasStatus_t bench_status_ = (expr);                                       \
    if (bench_status_ != CUBLAS_STATUS_SUCCESS)                                        \
      MT_ERROR(what, ": ", cublasGetStatusName(bench_status_), " (", #expr, ")");      \
  } while (0)

namespace {

// ---- device helpers: random fill and the relative Frobenius error ----------------------------------------

__device__ __forceinline__ float hash_uniform(uint64_t i, uint64_t seed) {  // splitmix64 → [-1, 1)
  uint64_t z = i + seed * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

template <class T>
__global__ void fill_uniform_kernel(T* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float v = hash_uniform(static_cast<uint64_t>(i), seed);
    if constexpr (std::is_same_v<T, float>) p[i] = v;
    else if constexpr (std::is_same_v<T, __half>) p[i] = __float2half_rn(v);
    else p[i] = __float2bfloat16_rn(v);
  }
}

template <class T>
__device__ __forceinline__ double as_double(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, float>) return p[i];
  else if constexpr (std::is_same_v<T, __half>) return __half2float(p[i]);
  else return __bfloat162float(p[i]);
}

/// acc[0] += Σ (x - y)², acc[1] += Σ y² over n dense elements.
template <class T>
__global__ void diff_kernel(const T* x, const T* y, int64_t n, double* acc) {
  double d2 = 0.0, y2 = 0.0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const double xv = as_double(x, i), yv = as_double(y, i);
    d2 += isfinite(xv) ? (xv - yv) * (xv - yv) : 1e300;
    y2 += yv * yv;
  }
  for (int o = 16; o > 0; o /= 2) {
    d2 += __shfl_down_sync(0xffffffffu, d2, o);
    y2 += __shfl_down_sync(0xffffffffu, y2, o);
  }
  if (threadIdx.x % 32 == 0) {
    atomicAdd(acc, d2);
    atomicAdd(acc + 1, y2);
  }
}

void fill_uniform(const Tensor& t, uint64_t seed) {
  const int64_t n = t.numel();
  mt::dispatch_floating(t.dtype(), "fill_uniform", [&](auto tag) {
    using T0 = typename decltype(tag)::type;
    using T = std::conditional_t<std::is_same_v<T0, mt::Half>, __half,
                                 std::conditional_t<std::is_same_v<T0, mt::BFloat16>, __nv_bfloat16, T0>>;
    if constexpr (!std::is_same_v<T, double>) {
      fill_uniform_kernel<T><<<1024, 256>>>(static_cast<T*>(t.data_ptr()), n, seed);
      MT_CUDA_CHECK_LAUNCH("fill_uniform_kernel");
    }
  });
}

/// ||x - y||_F / ||y||_F of two dense device tensors of one dtype.
double rel_frobenius(const Tensor& x, const Tensor& y) {
  double* acc = nullptr;
  MT_CUDA_CHECK(cudaMalloc(&acc, 2 * sizeof(double)), "bench: cudaMalloc");
  MT_CUDA_CHECK(cudaMemset(acc, 0, 2 * sizeof(double)), "bench: cudaMemset");
  switch (x.dtype()) {
    case DType::kF16:
      diff_kernel<<<1024, 256>>>(static_cast<const __half*>(x.data_ptr()), static_cast<const __half*>(y.data_ptr()),
                                 x.numel(), acc);
      break;
    case DType::kBF16:
      diff_kernel<<<1024, 256>>>(static_cast<const __nv_bfloat16*>(x.data_ptr()),
                                 static_cast<const __nv_bfloat16*>(y.data_ptr()), x.numel(), acc);
      break;
    default:
      diff_kernel<<<1024, 256>>>(static_cast<const float*>(x.data_ptr()), static_cast<const float*>(y.data_ptr()),
                                 x.numel(), acc);
  }
  MT_CUDA_CHECK_LAUNCH("diff_kernel");
  double h[2] = {0.0, 0.0};
  MT_CUDA_CHECK(cudaMemcpy(h, acc, sizeof(h), cudaMemcpyDeviceToHost), "bench: cudaMemcpy");
  MT_CUDA_CHECK(cudaFree(acc), "bench: cudaFree");
  return std::sqrt(h[0]) / std::max(std::sqrt(h[1]), 1e-300);
}

// ---- timing ------------------------------------------------------------------------------------------------

/// Milliseconds of one burst of `reps` back-to-back launches of `launch`, per launch (CUDA events).
template <class F>
double burst_ms(F& launch, int reps, cudaEvent_t e0, cudaEvent_t e1) {
  MT_CUDA_CHECK(cudaEventRecord(e0, 0), "bench: cudaEventRecord");
  for (int i = 0; i < reps; ++i) launch();
  MT_CUDA_CHECK(cudaEventRecord(e1, 0), "bench: cudaEventRecord");
  MT_CUDA_CHECK(cudaEventSynchronize(e1), "bench: cudaEventSynchronize");
  float ms = 0.0f;
  MT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1), "bench: cudaEventElapsedTime");
  return ms / reps;
}

/// Launches per burst so that a burst lasts about 0.5 ms (tiny GEMMs: their launch gaps count, as in training).
template <class F>
int burst_reps(F& launch, cudaEvent_t e0, cudaEvent_t e1) {
  const double est = burst_ms(launch, 1, e0, e1);
  return std::clamp(static_cast<int>(std::ceil(0.5 / std::max(est, 1e-4))), 1, 200);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct PairTiming {
  double ours_ms, theirs_ms;  // medians per launch
  double ratio;               // median over the pairs of theirs / ours: mixtape's speed relative to the peer
};

/// Times `ours` against `theirs` in 21 interleaved pairs of bursts (ours, theirs, ours, theirs, …) after at least
/// 20 ms of alternating warm-up, so that both see the same clocks: the first H100 runs measured cuBLAS at 7.7 and
/// then 12.4 TFLOP/s on one MNIST product timed in separate blocks, while mixtape's stayed at 8.5. The ratio is
/// the median of the per-pair ratios, which drift between pairs cancels; the times are each side's median.
template <class F, class G>
PairTiming time_pair(F&& ours, G&& theirs) {
  cudaEvent_t e0, e1;
  MT_CUDA_CHECK(cudaEventCreate(&e0), "bench: cudaEventCreate");
  MT_CUDA_CHECK(cudaEventCreate(&e1), "bench: cudaEventCreate");
  for (int i = 0; i < 3; ++i) {  // caches, lazy module loading, cuBLAS's workspace
    ours();
    theirs();
  }
  const int reps_ours = burst_reps(ours, e0, e1), reps_theirs = burst_reps(theirs, e0, e1);
  double warm = 0;
  while (warm < 20.0)
    warm += burst_ms(ours, reps_ours, e0, e1) * reps_ours + burst_ms(theirs, reps_theirs, e0, e1) * reps_theirs;
  std::vector<double> a, b, r;
  for (int i = 0; i < 21; ++i) {
    a.push_back(burst_ms(ours, reps_ours, e0, e1));
    b.push_back(burst_ms(theirs, reps_theirs, e0, e1));
    r.push_back(b.back() / a.back());
  }
  MT_CUDA_CHECK(cudaGetLastError(), "bench: after timing");
  MT_CUDA_CHECK(cudaEventDestroy(e0), "bench: cudaEventDestroy");
  MT_CUDA_CHECK(cudaEventDestroy(e1), "bench: cudaEventDestroy");
  return {median(a), median(b), median(r)};
}

/// The SM clock in MHz as the device runs it now: one thread counts clock64() cycles over 200 µs of %globaltimer
/// (nanoseconds). Boost clocks move with load and temperature; this reads the clock the timed kernels ran at.
__global__ void sm_clock_kernel(double* mhz) {
  uint64_t t0, t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  const long long c0 = clock64();
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
  } while (t1 - t0 < 200000);
  const long long c1 = clock64();
  *mhz = static_cast<double>(c1 - c0) * 1e3 / static_cast<double>(t1 - t0);
}

double sm_clock_mhz(cudaStream_t stream) {
  double* d = nullptr;
  double h = 0.0;
  MT_CUDA_CHECK(cudaMalloc(&d, sizeof(double)), "bench: cudaMalloc");
  sm_clock_kernel<<<1, 1, 0, stream>>>(d);
  MT_CUDA_CHECK_LAUNCH("sm_clock_kernel");
  MT_CUDA_CHECK(cudaMemcpyAsync(&h, d, sizeof(double), cudaMemcpyDeviceToHost, stream), "bench: cudaMemcpyAsync");
  MT_CUDA_CHECK(cudaStreamSynchronize(stream), "bench: cudaStreamSynchronize");
  MT_CUDA_CHECK(cudaFree(d), "bench: cudaFree");
  return h;
}

/// Nodes of a captured graph: kernels and the rest (memsets, copies: cuBLAS's split-K may clear a workspace).
struct NodeCount {
  size_t kernels = 0, others = 0;
};

/// `reps` calls of `launch` (which launches on `stream`) captured into one executable CUDA graph; with `nodes`, what
/// the capture holds.
template <class F>
cudaGraphExec_t capture_graph(F& launch, int reps, cudaStream_t stream, NodeCount* nodes = nullptr) {
  cudaGraph_t graph = nullptr;
  MT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), "bench: cudaStreamBeginCapture");
  try {
    for (int i = 0; i < reps; ++i) launch();
  } catch (...) {
    if (cudaStreamEndCapture(stream, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    throw;
  }
  MT_CUDA_CHECK(cudaStreamEndCapture(stream, &graph), "bench: cudaStreamEndCapture");
  if (nodes) {
    size_t count = 0;
    std::vector<cudaGraphNode_t> all;
    if (cudaGraphGetNodes(graph, nullptr, &count) == cudaSuccess) {
      all.resize(count);
      if (cudaGraphGetNodes(graph, all.data(), &count) != cudaSuccess) all.clear();
    }
    for (cudaGraphNode_t n : all) {
      cudaGraphNodeType type{};
      if (cudaGraphNodeGetType(n, &type) != cudaSuccess) continue;
      ++(type == cudaGraphNodeTypeKernel ? nodes->kernels : nodes->others);
    }
    (void)cudaGetLastError();
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  MT_CUDA_CHECK(status, "bench: cudaGraphInstantiate");
  return exec;
}

/// Milliseconds one replay of `g` on `stream` takes, timed by the events e0 and e1.
double replay_ms(cudaGraphExec_t g, cudaStream_t stream, cudaEvent_t e0, cudaEvent_t e1) {
  MT_CUDA_CHECK(cudaEventRecord(e0, stream), "bench: cudaEventRecord");
  MT_CUDA_CHECK(cudaGraphLaunch(g, stream), "bench: cudaGraphLaunch");
  MT_CUDA_CHECK(cudaEventRecord(e1, stream), "bench: cudaEventRecord");
  MT_CUDA_CHECK(cudaEventSynchronize(e1), "bench: cudaEventSynchronize");
  float ms = 0.0f;
  MT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1), "bench: cudaEventElapsedTime");
  return static_cast<double>(ms);
}

struct GraphTiming {
  PairTiming t;
  double mhz_before, mhz_after;  // the SM clock (sm_clock_mhz) around the timed pairs
  NodeCount ours, theirs;        // each graph's nodes (for `reps` products)
};

/// Device time alone: `reps` launches of each side captured into a graph, the two graphs replayed in 21 interleaved
/// pairs after 20 ms of alternating warm-up (as time_pair, without the host's launch cost in the bursts).
template <class F, class G>
GraphTiming time_pair_graph(F&& ours, G&& theirs, int reps, cudaStream_t stream) {
  GraphTiming out{};
  cudaGraphExec_t g_ours = capture_graph(ours, reps, stream, &out.ours);
  cudaGraphExec_t g_theirs = nullptr;
  try {
    g_theirs = capture_graph(theirs, reps, stream, &out.theirs);
  } catch (...) {
    cudaGraphExecDestroy(g_ours);
    throw;
  }
  cudaEvent_t e0, e1;
  MT_CUDA_CHECK(cudaEventCreate(&e0), "bench: cudaEventCreate");
  MT_CUDA_CHECK(cudaEventCreate(&e1), "bench: cudaEventCreate");
  auto per_product_ms = [&](cudaGraphExec_t g) { return replay_ms(g, stream, e0, e1) / reps; };
  double warm = 0;
  while (warm < 20.0) warm += (per_product_ms(g_ours) + per_product_ms(g_theirs)) * reps;
  out.mhz_before = sm_clock_mhz(stream);
  std::vector<double> a, b, r;
  for (int i = 0; i < 21; ++i) {
    a.push_back(per_product_ms(g_ours));
    b.push_back(per_product_ms(g_theirs));
    r.push_back(b.back() / a.back());
  }
  out.mhz_after = sm_clock_mhz(stream);
  MT_CUDA_CHECK(cudaEventDestroy(e0), "bench: cudaEventDestroy");
  MT_CUDA_CHECK(cudaEventDestroy(e1), "bench: cudaEventDestroy");
  MT_CUDA_CHECK(cudaGraphExecDestroy(g_ours), "bench: cudaGraphExecDestroy");
  MT_CUDA_CHECK(cudaGraphExecDestroy(g_theirs), "bench: cudaGraphExecDestroy");
  out.t = {median(a), median(b), median(r)};
  return out;
}

// ---- the launch floor: what a kernel node costs before it computes anything --------------------------------------

/// Computes nothing: 128 threads and the small tile's 38 KB of dynamic shared memory, placed as a small-tile GEMM
/// block is, then `barriers` cluster barriers (the split-K epilogue has two; no-ops outside a cluster).
__global__ void __launch_bounds__(128) idle_kernel(int barriers) {
  for (int i = 0; i < barriers; ++i) kc::cluster_sync();
}

constexpr size_t kIdleSmem = 38 * 1024;

void launch_idle(int blocks, int cluster, int barriers, cudaStream_t stream) {
  if (cluster <= 1) {
    idle_kernel<<<blocks, 128, kIdleSmem, stream>>>(barriers);
  } else {
    cudaLaunchAttribute attribute{};
    const cudaLaunchConfig_t config = kc::cluster_launch_config(dim3(static_cast<unsigned>(blocks)), dim3(128),
                                                                kIdleSmem, cluster, stream, attribute);
    MT_CUDA_CHECK(cudaLaunchKernelEx(&config, idle_kernel, barriers), "bench: cudaLaunchKernelEx (idle_kernel, ",
                  blocks, " blocks in clusters of ", cluster, ")");
  }
  MT_CUDA_CHECK_LAUNCH("idle_kernel (", blocks, " blocks, clusters of ", cluster, ")");
}

/// Microseconds a kernel node of `launch` costs on the device: 200 launches captured into a graph, the median of 21
/// replays after 10 ms of warm-up, per launch.
template <class F>
double graph_us_per_launch(F&& launch, cudaStream_t stream) {
  constexpr int kReps = 200;
  cudaGraphExec_t g = capture_graph(launch, kReps, stream);
  cudaEvent_t e0, e1;
  MT_CUDA_CHECK(cudaEventCreate(&e0), "bench: cudaEventCreate");
  MT_CUDA_CHECK(cudaEventCreate(&e1), "bench: cudaEventCreate");
  for (double warm = 0; warm < 10.0;) warm += replay_ms(g, stream, e0, e1);
  std::vector<double> t;
  for (int i = 0; i < 21; ++i) t.push_back(replay_ms(g, stream, e0, e1));
  MT_CUDA_CHECK(cudaEventDestroy(e0), "bench: cudaEventDestroy");
  MT_CUDA_CHECK(cudaEventDestroy(e1), "bench: cudaEventDestroy");
  MT_CUDA_CHECK(cudaGraphExecDestroy(g), "bench: cudaGraphExecDestroy");
  return median(t) * 1e3 / kReps;
}

/// The floor under the MNIST products' device time (bench/RESULTS.md's first hypothesis for their gap to cuBLAS:
/// a cluster launch costs more as the split grows): idle kernels of the small tile's shape as one graph node each,
/// plain and in clusters of 2, 4 and 8 blocks along x, without and with the split-K epilogue's two cluster barriers.
/// 128 blocks is fc1's forward (16 tiles split 8); 16 blocks the same tiles unsplit.
void launch_floor(const mt::cuda::DeviceProperties& props, cudaStream_t stream) {
  std::printf("\nLaunch floor (graph replays of 200 idle kernels of 128 threads and %zu KB of shared memory), "
              "us a kernel:\n", kIdleSmem / 1024);
  try {
    for (int blocks : {16, 128})
      std::printf("  %3d blocks, no cluster                 %6.2f\n", blocks,
                  graph_us_per_launch([&] { launch_idle(blocks, 1, 0, stream); }, stream));
    if (props.major < 9) {
      std::printf("  clusters: sm_%d%d has none\n", props.major, props.minor);
      return;
    }
    for (int barriers : {0, 2}) {
      std::printf("  128 blocks, clusters of 2 / 4 / 8, %d barriers:", barriers);
      for (int cluster : {2, 4, 8})
        std::printf(" %6.2f", graph_us_per_launch([&] { launch_idle(128, cluster, barriers, stream); }, stream));
      std::printf("\n");
    }
  } catch (const std::exception& e) {
    std::printf("  launch floor failed: %s\n", e.what());
  }
  std::fflush(stdout);
}

// ---- one shape ---------------------------------------------------------------------------------------------

struct Shape3 {
  const char* what;
  int64_t m, n, k;
  bool ta, tb;
  bool mnist;
};

struct Row {
  std::string label;
  double wmma_f16, cublas_f16, wmma_bf16, cublas_bf16, simt_f32, cublas_f32;  // TFLOP/s
  double ratio_f16, ratio_bf16, ratio_f32;  // mixtape / peer, the median of interleaved pairs (time_pair)
  double graph_ratio_f16, graph_ratio_bf16;   // the same from graph replays (time_pair_graph; MNIST shapes only)
  bool mnist;
};

cudaDataType_t cuda_type(DType t) {
  return t == DType::kF16 ? CUDA_R_16F : t == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
}

/// Operands stored as they lie for the layout: A (m, k) or (k, m), B (k, n) or (n, k).
struct Problem {
  Tensor a, b, c_ours, c_ref;
};

Problem make_problem(const Shape3& s, DType dtype, uint64_t seed) {
  const auto dev = mt::TensorOptions(dtype).device(mt::Device::cuda());
  Problem p;
  p.a = mt::empty(s.ta ? mt::Shape{s.k, s.m} : mt::Shape{s.m, s.k}, dev);
  p.b = mt::empty(s.tb ? mt::Shape{s.n, s.k} : mt::Shape{s.k, s.n}, dev);
  p.c_ours = mt::empty({s.m, s.n}, dev);
  p.c_ref = mt::empty({s.m, s.n}, dev);
  fill_uniform(p.a, seed);
  fill_uniform(p.b, seed + 1);
  return p;
}

void cublas_gemm(cublasHandle_t h, const Shape3& s, DType dtype, const Tensor& a, const Tensor& b, Tensor& c) {
  const float one = 1.0f, zero = 0.0f;
  const int lda = static_cast<int>(s.ta ? s.m : s.k), ldb = static_cast<int>(s.tb ? s.k : s.n);
  const cublasOperation_t op_b = s.tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_a = s.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int m = static_cast<int>(s.m), n = static_cast<int>(s.n), k = static_cast<int>(s.k);
  if (dtype == DType::kF32) {
    BENCH_CUBLAS(cublasSgemm(h, op_b, op_a, n, m, k, &one, static_cast<const float*>(b.data_ptr()), ldb,
                             static_cast<const float*>(a.data_ptr()), lda, &zero, static_cast<float*>(c.data_ptr()), n),
                 "cublasSgemm");
  } else {
    BENCH_CUBLAS(cublasGemmEx(h, op_b, op_a, n, m, k, &one, b.data_ptr(), cuda_type(dtype), ldb, a.data_ptr(),
                              cuda_type(dtype), lda, &zero, c.data_ptr(), cuda_type(dtype), n, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
  }
}

void wmma_gemm(const Shape3& s, DType dtype, const Tensor& a, const Tensor& b, Tensor& c,
               kc::GemmTile tile = kc::GemmTile::kAuto, cudaStream_t stream = cudaStreamLegacy) {
  kc::gemm_tensor_core(s.m, s.n, s.k, 1, dtype, {a.data_ptr(), s.ta ? s.m : s.k, s.ta, 0},
                       {b.data_ptr(), s.tb ? s.k : s.n, s.tb, 0}, c.data_ptr(), s.n, 0, dtype, {}, stream, tile);
}

/// The stream the graph timings capture on (the legacy default stream cannot be captured), and cuBLAS's
/// workspace there: cublasSetStream resets a handle to its default workspace, so it is set again each time.
struct CaptureStream {
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;
};
CaptureStream g_capture;

/// Points cuBLAS at the capture stream (and its own workspace) until destroyed, then back at the legacy stream.
struct CublasOnCaptureStream {
  cublasHandle_t h;
  explicit CublasOnCaptureStream(cublasHandle_t handle) : h(handle) {
    BENCH_CUBLAS(cublasSetStream(h, g_capture.stream), "cublasSetStream");
    BENCH_CUBLAS(cublasSetWorkspace(h, g_capture.workspace, CaptureStream::kWorkspaceBytes), "cublasSetWorkspace");
  }
  ~CublasOnCaptureStream() { (void)cublasSetStream(h, cudaStreamLegacy); }
  CublasOnCaptureStream(const CublasOnCaptureStream&) = delete;
  CublasOnCaptureStream& operator=(const CublasOnCaptureStream&) = delete;
};

Tensor simt_gemm(const Shape3& s, const Tensor& a, const Tensor& b) {
  return kc::matmul(s.ta ? a.t() : a, s.tb ? b.t() : b, DType::kF32);
}

bool g_failed = false;
bool g_graph_failed = false;  // a graph timing could not run (its ratio is missing, not zero)

void check(const char* what, const Shape3& s, DType dtype, double rel, double bound) {
  if (!(rel <= bound)) {
    std::printf("  SANITY FAIL %s %s (%lld x %lld x %lld, %s): rel Frobenius %.3g > %.3g\n", what, s.what,
                static_cast<long long>(s.m), static_cast<long long>(s.n), static_cast<long long>(s.k),
                mt::dtype_name(dtype), rel, bound);
    g_failed = true;
  }
}

/// --once: every product runs once, untimed, so that a profiler (bench/gpu_session.sh profile: ncu) sees each kernel.
bool g_once = false;

Row run_shape(cublasHandle_t h, const Shape3& s) {
  Row row{};
  row.mnist = s.mnist;
  char label[160];
  std::snprintf(label, sizeof(label), "%-10s %5lld x %5lld x %5lld %s%s", s.what, static_cast<long long>(s.m),
                static_cast<long long>(s.n), static_cast<long long>(s.k), s.ta ? "T" : "N", s.tb ? "T" : "N");
  row.label = label;
  const double flops = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
  auto tflops = [&](double ms) { return flops / (ms * 1e-3) / 1e12; };

  for (DType dtype : {DType::kF16, DType::kBF16}) {
    Problem p = make_problem(s, dtype, 17);
    wmma_gemm(s, dtype, p.a, p.b, p.c_ours);
    cublas_gemm(h, s, dtype, p.a, p.b, p.c_ref);
    // Both round the same f32 sums to 16 bits; they differ by the order of the sums and that rounding.
    check("wmma", s, dtype, rel_frobenius(p.c_ours, p.c_ref), dtype == DType::kF16 ? 2e-3 : 1.6e-2);
    if (g_once) continue;
    const PairTiming t = time_pair([&] { wmma_gemm(s, dtype, p.a, p.b, p.c_ours); },
                                   [&] { cublas_gemm(h, s, dtype, p.a, p.b, p.c_ref); });
    (dtype == DType::kF16 ? row.wmma_f16 : row.wmma_bf16) = tflops(t.ours_ms);
    (dtype == DType::kF16 ? row.cublas_f16 : row.cublas_bf16) = tflops(t.theirs_ms);
    (dtype == DType::kF16 ? row.ratio_f16 : row.ratio_bf16) = t.ratio;
    if (!s.mnist) continue;
    // Device time alone (graph replays), for the products short enough that a launch costs as much.
    const int reps = std::clamp(static_cast<int>(std::ceil(0.5 / std::max(t.ours_ms, 1e-4))), 20, 500);
    try {
      CublasOnCaptureStream on_capture(h);
      const GraphTiming g =
          time_pair_graph([&] { wmma_gemm(s, dtype, p.a, p.b, p.c_ours, kc::GemmTile::kAuto, g_capture.stream); },
                          [&] { cublas_gemm(h, s, dtype, p.a, p.b, p.c_ref); }, reps, g_capture.stream);
      (dtype == DType::kF16 ? row.graph_ratio_f16 : row.graph_ratio_bf16) = g.t.ratio;
      const double per = static_cast<double>(reps);
      std::printf("%s  %-4s graph replay (%3d a graph): wmma %6.2f us  cublas %6.2f us  (%.2fx)  SM clock %4.0f -> "
                  "%4.0f MHz  nodes a product: wmma %.1f kernel + %.1f other, cublas %.1f + %.1f\n",
                  row.label.c_str(), mt::dtype_name(dtype), reps, g.t.ours_ms * 1e3, g.t.theirs_ms * 1e3, g.t.ratio,
                  g.mhz_before, g.mhz_after, g.ours.kernels / per, g.ours.others / per, g.theirs.kernels / per,
                  g.theirs.others / per);
    } catch (const std::exception& e) {
      std::printf("%s  %-4s graph replay failed: %s\n", row.label.c_str(), mt::dtype_name(dtype), e.what());
      g_graph_failed = true;
    }
  }
  if (g_once) {
    std::printf("%s  ran once (--once)\n", row.label.c_str());
    return row;
  }
  {
    Problem p = make_problem(s, DType::kF32, 29);
    Tensor c = simt_gemm(s, p.a, p.b);
    cublas_gemm(h, s, DType::kF32, p.a, p.b, p.c_ref);
    check("simt f32", s, DType::kF32, rel_frobenius(c, p.c_ref), 1e-5);
    const PairTiming t = time_pair([&] { c = simt_gemm(s, p.a, p.b); },
                                   [&] { cublas_gemm(h, s, DType::kF32, p.a, p.b, p.c_ref); });
    row.simt_f32 = tflops(t.ours_ms);
    row.cublas_f32 = tflops(t.theirs_ms);
    row.ratio_f32 = t.ratio;
  }
  const auto tile = kc::gemm_tensor_core_tile(s.m, s.n, s.k, 1, DType::kF16, {nullptr, s.ta ? s.m : s.k, s.ta, 0},
                                              {nullptr, s.tb ? s.k : s.n, s.tb, 0});
  // What splitting K over clusters gains where kAuto chose it: the same kernel unsplit (kSmall), same run.
  double split_gain = 0.0;
  if (tile != kc::GemmTile::kLarge && tile != kc::GemmTile::kSmall) {
    Problem p = make_problem(s, DType::kF16, 31);
    Tensor c_small = mt::empty({s.m, s.n}, mt::TensorOptions(DType::kF16).device(mt::Device::cuda()));
    wmma_gemm(s, DType::kF16, p.a, p.b, p.c_ours);
    wmma_gemm(s, DType::kF16, p.a, p.b, c_small, kc::GemmTile::kSmall);
    check("wmma split-K vs unsplit", s, DType::kF16, rel_frobenius(p.c_ours, c_small), 2e-3);
    split_gain = time_pair([&] { wmma_gemm(s, DType::kF16, p.a, p.b, p.c_ours); },
                           [&] { wmma_gemm(s, DType::kF16, p.a, p.b, c_small, kc::GemmTile::kSmall); })
                     .ratio;
  }
  std::printf("%s  [%s tile]  wmma f16 %7.1f  cublas f16 %7.1f  (%.2fx) | "
              "wmma bf16 %7.1f  cublas bf16 %7.1f  (%.2fx) | simt f32 %6.2f  sgemm %6.2f  (%.2fx) | "
              "wmma f16 / simt f32 %.1fx\n",
              row.label.c_str(), kc::gemm_tile_name(tile), row.wmma_f16, row.cublas_f16,
              row.ratio_f16, row.wmma_bf16, row.cublas_bf16, row.ratio_bf16, row.simt_f32, row.cublas_f32,
              row.ratio_f32, row.wmma_f16 / row.simt_f32);
  if (split_gain > 0.0)
    std::printf("%s  f16 split-K / the same small tile unsplit: %.2fx\n", row.label.c_str(), split_gain);
  std::fflush(stdout);
  return row;
}

void target(const char* what, double value, double goal) {
  std::printf("  %-58s %6.2f  (target >= %.2f)  %s\n", what, value, goal, value >= goal ? "met" : "MISSED");
}

}  // namespace

int main(int argc, char** argv) {
  g_once = argc > 1 && std::string(argv[1]) == "--once";
  try {
    if (!mt::cuda::is_available()) {
      std::printf("bench_gpu_gemm: no CUDA device (%s)\n", mt::cuda::unavailable_reason().c_str());
      return 0;
    }
    const auto props = mt::cuda::device_properties(0);
    std::printf("bench_gpu_gemm on %s (sm_%d%d, %d SMs); TFLOP/s = 2mnk / median time of 21 interleaved pairs\n",
                props.name.c_str(), props.major, props.minor, props.multiprocessor_count);
    std::printf("\nWMMA instantiations (cudaFuncGetAttributes):\n");
    for (DType dtype : {DType::kF16, DType::kBF16, DType::kF32})
      for (const auto& info : kc::gemm_tensor_core_kernels(dtype))
        std::printf("  %-28s %3d threads %3d registers %6zu B static smem %7zu B dynamic smem %zu B local\n",
                    info.name.c_str(), info.threads, info.registers, info.static_smem, info.dynamic_smem,
                    info.local_bytes);

    cublasHandle_t h = nullptr;
    BENCH_CUBLAS(cublasCreate(&h), "cublasCreate");
    BENCH_CUBLAS(cublasSetStream(h, cudaStreamLegacy), "cublasSetStream");
    MT_CUDA_CHECK(cudaStreamCreateWithFlags(&g_capture.stream, cudaStreamNonBlocking), "bench: cudaStreamCreate");
    MT_CUDA_CHECK(cudaMalloc(&g_capture.workspace, CaptureStream::kWorkspaceBytes), "bench: cudaMalloc");
    if (!g_once) launch_floor(props, g_capture.stream);

    // MNIST MLP, batch 128, Linear(in, out) with W stored (out, in): forward y = x·Wᵀ (NT),
    // dX = dY·W (NN), dW = dYᵀ·X (TN).
    std::vector<Shape3> shapes = {
        {"square", 4096, 4096, 4096, false, false, false}, {"square", 4096, 4096, 4096, false, true, false},
        {"square", 8192, 8192, 8192, false, false, false}, {"short-k", 4096, 4096, 256, false, false, false},
    };
    const int64_t layers[][2] = {{784, 512}, {512, 256}, {256, 10}};
    for (const auto& l : layers) {
      shapes.push_back({"mnist fwd", 128, l[1], l[0], false, true, true});
      shapes.push_back({"mnist dX", 128, l[0], l[1], false, false, true});
      shapes.push_back({"mnist dW", l[1], l[0], 128, true, false, true});
    }
    std::printf("\n%-10s %-23s %s\n", "shape", "m x n x k layout", "TFLOP/s (ratio = mixtape / cuBLAS)");
    std::vector<Row> rows;
    for (const auto& s : shapes) rows.push_back(run_shape(h, s));
    BENCH_CUBLAS(cublasDestroy(h), "cublasDestroy");
    MT_CUDA_CHECK(cudaFree(g_capture.workspace), "bench: cudaFree");
    MT_CUDA_CHECK(cudaStreamDestroy(g_capture.stream), "bench: cudaStreamDestroy");

    if (g_once) return g_failed ? 1 : 0;
    std::printf("\nTargets (issue 5):\n");
    target("wmma f16 / cublas f16 at 4096^3 NN", rows[0].ratio_f16, 0.30);
    target("wmma f16 / cublas f16 at 8192^3 NN", rows[2].ratio_f16, 0.30);
    double worst = 1e30;
    for (const auto& r : rows)
      if (r.mnist) worst = std::min({worst, r.ratio_f16, r.ratio_bf16});
    target("worst wmma / cublas over the MNIST shapes (f16 and bf16)", worst, 0.70);
    double worst_graph = 1e30;
    for (const auto& r : rows)
      if (r.mnist) worst_graph = std::min({worst_graph, r.graph_ratio_f16, r.graph_ratio_bf16});
    if (g_graph_failed) std::printf("  device time alone (graph replays): not measured, see \"graph replay failed\"\n");
    else target("the same, device time alone (graph replays)", worst_graph, 0.70);
    target("wmma f16 / mixtape simt f32 at 4096^3 NN", rows[0].wmma_f16 / rows[0].simt_f32, 4.0);
    if (g_failed) {
      std::printf("\nbench_gpu_gemm: FAILED sanity checks (see SANITY FAIL above)\n");
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu_gemm: %s\n", e.what());
    return 1;
  }
}
