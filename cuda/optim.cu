// cuda/optim.cu — the optimizer step kernels on the GPU: SGD, Adam and AdamW over a list of parameters.
//
// One launch updates many parameters (cuda/chunks.cuh: the parameters whose tensors are all contiguous, grouped by
// dtype, cut into chunks of a table passed as a kernel parameter); a parameter with a strided operand gets a
// grid-stride launch of its own (cuda/launch.cuh's offsets). Either way a thread loads an element's gradient,
// state, master and parameter once, applies the formula of ops/backend/optim_math.h — the very function the CPU
// loop calls, with products and sums that are never fused into an FMA — and stores once, so the GPU's bits are the
// CPU's. The sync-free step: a kernel reads the loss scaler's found-inf flag and each parameter's update count
// from device memory (the count advanced, or not, by count_steps_kernel before it) and computes its scalars there
// (optim_math's adam_coeffs and rounding_key, the CPU's functions), so a skipped step costs no host read. Captured
// into a CUDA graph, the kernels read their options from a replay argument of the graph (replayed_options), which
// each replay fills with the optimizer's options then: a schedule between replays reaches them.
#include <mixtape/ops/backend/kernels.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>

#include <cuda_runtime.h>

#include <mixtape/core/dtype.h>
#include <mixtape/core/strided_loop.h>
#include <mixtape/cuda/chunks.cuh>
#include <mixtape/cuda/launch.cuh>
#include <mixtape/cuda/stream.cuh>
#include <mixtape/ops/backend/optim_math.h>

namespace mixtape::kernels::cuda {

namespace {

using optim_math::dispatch_store;
using optim_math::Store;

/// The operands of one parameter's update, in this order; absent ones (no master, no optional buffer) have a null
/// pointer and stride 0.
enum Slot : int { kParam, kGrad, kState0, kState1, kState2, kMaster, kSlots };

/// A parameter's update count: its counter in device memory when it has one, else the host's value.
struct StepRef {
  int64_t value;
  const int32_t* count;
  int64_t index;
  __device__ int64_t get() const { return count != nullptr ? *count : value; }
};

StepRef step_ref(const OptimStep& s) { return {s.step, s.count, s.index}; }

/// Whether the step is skipped: found_inf (null: never) is nonzero.
__device__ inline bool skipped(const float* found_inf) { return found_inf != nullptr && *found_inf != 0.0f; }

/// One element's SGD update: param T, grad T, momentum buffer S (with kMomentum), master f32 (kMaster) at the
/// offsets `off`; i is the element's index in its parameter (of its stochastic rounding).
template <class T, class S, Store kStore, bool kMomentum>
__device__ __forceinline__ void sgd_element(T* param, const T* grad, S* momentum_buffer, float* master,
                                            const int64_t (&off)[kSlots], int64_t i,
                                            const optim_math::SgdCoeffs<opmath_t<T>>& c, uint64_t key) {
  using M = opmath_t<T>;
  float* master_at = kStore == Store::kMaster ? master + off[kMaster] : nullptr;
  M buf = M(0);
  if constexpr (kMomentum) buf = static_cast<M>(momentum_buffer[off[kState0]]);
  const M p = optim_math::load_param<kStore, optim_math::CoreConvert, T, M>(param + off[kParam], master_at);
  const M updated = optim_math::sgd_update<kMomentum>(p, static_cast<M>(grad[off[kGrad]]), buf, c);
  if constexpr (kMomentum) momentum_buffer[off[kState0]] = convert<S>(buf);
  optim_math::store_param<kStore, optim_math::CoreConvert, T, M>(param + off[kParam], master_at, updated, key, i);
}

/// One element's Adam update: param T, grad T, exp_avg, exp_avg_sq and (kAmsgrad) max_exp_avg_sq S, master f32
/// (kMaster) at the offsets `off`; i as sgd_element's.
template <class T, class S, Store kStore, bool kAmsgrad>
__device__ __forceinline__ void adam_element(T* param, const T* grad, S* exp_avg, S* exp_avg_sq, S* max_exp_avg_sq,
                                             float* master, const int64_t (&off)[kSlots], int64_t i,
                                             const optim_math::AdamCoeffs<opmath_t<T>>& c, uint64_t key) {
  using M = opmath_t<T>;
  float* master_at = kStore == Store::kMaster ? master + off[kMaster] : nullptr;
  M m = static_cast<M>(exp_avg[off[kState0]]), v = static_cast<M>(exp_avg_sq[off[kState1]]), vmax = M(0);
  if constexpr (kAmsgrad) vmax = static_cast<M>(max_exp_avg_sq[off[kState2]]);
  const M p = optim_math::load_param<kStore, optim_math::CoreConvert, T, M>(param + off[kParam], master_at);
  const M updated = optim_math::adam_update<kAmsgrad>(p, static_cast<M>(grad[off[kGrad]]), m, v, vmax, c);
  exp_avg[off[kState0]] = convert<S>(m);
  exp_avg_sq[off[kState1]] = convert<S>(v);
  if constexpr (kAmsgrad) max_exp_avg_sq[off[kState2]] = convert<S>(vmax);
  optim_math::store_param<kStore, optim_math::CoreConvert, T, M>(param + off[kParam], master_at, updated, key, i);
}

/// SGD over one parameter of any layout (L's shape).
template <class T, class S, Store kStore, bool kMomentum>
__global__ void __launch_bounds__(kBlockThreads)
    sgd_kernel(T* param, const T* grad, S* momentum_buffer, float* master, OffsetLayout<kSlots> L,
               optim_math::SgdCoeffs<opmath_t<T>> c, uint64_t seed, const SgdHyper* live, StepRef step,
               const float* found_inf) {
  if (skipped(found_inf)) return;
  if (live != nullptr) {  // a replay's options
    c = optim_math::sgd_coeffs<opmath_t<T>>(*live, c.first_momentum);
    seed = live->seed;
  }
  const uint64_t key = optim_math::rounding_key(seed, step.get(), step.index);
  for (int64_t i = first_index(); i < L.numel; i += grid_stride()) {
    int64_t off[kSlots];
    element_offsets(L, i, off);
    sgd_element<T, S, kStore, kMomentum>(param, grad, momentum_buffer, master, off, i, c, key);
  }
}

/// Adam over one parameter of any layout (L's shape).
template <class T, class S, Store kStore, bool kAmsgrad>
__global__ void __launch_bounds__(kBlockThreads)
    adam_kernel(T* param, const T* grad, S* exp_avg, S* exp_avg_sq, S* max_exp_avg_sq, float* master,
                OffsetLayout<kSlots> L, AdamHyper hyper, StepRef step, const float* found_inf) {
  using M = opmath_t<T>;
  if (skipped(found_inf)) return;
  if (hyper.on_device != nullptr) hyper = *hyper.on_device;  // a replay's options
  const int64_t count = step.get();
  const optim_math::AdamCoeffs<M> c = optim_math::adam_coeffs<M>(hyper, count);
  const uint64_t key = optim_math::rounding_key(hyper.seed, count, step.index);
  for (int64_t i = first_index(); i < L.numel; i += grid_stride()) {
    int64_t off[kSlots];
    element_offsets(L, i, off);
    adam_element<T, S, kStore, kAmsgrad>(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, master, off, i, c, key);
  }
}

/// A run's parameter in a multi-tensor launch: its update count, and (SGD) whether its momentum buffer is new.
struct RunStep {
  StepRef step;
  bool first_momentum;
};
/// 32 runs of 6 pointers, 2 element bounds, a first block and a RunStep: about 3.2 KiB.
using OptimChunks = ChunkList<kSlots, 32, RunStep>;

/// SGD over the chunks of many contiguous parameters of one dtype (cuda/chunks.cuh); c's first_momentum is each
/// run's.
template <class T, class S, Store kStore, bool kMomentum>
__global__ void __launch_bounds__(kBlockThreads)
    sgd_chunks_kernel(const __grid_constant__ OptimChunks l, optim_math::SgdCoeffs<opmath_t<T>> c, uint64_t seed,
                      const SgdHyper* live, const float* found_inf) {
  if (skipped(found_inf)) return;
  if (live != nullptr) {  // a replay's options
    c = optim_math::sgd_coeffs<opmath_t<T>>(*live, false);
    seed = live->seed;
  }
  const BlockChunk b = block_chunk(l);
  const RunStep& run = l.extra[b.run];
  c.first_momentum = run.first_momentum;
  const uint64_t key = optim_math::rounding_key(seed, run.step.get(), run.step.index);
  void* const* ptr = l.ptr[b.run];
  for (int64_t i = b.start + threadIdx.x; i < b.stop; i += blockDim.x) {
    const int64_t off[kSlots] = {i, i, i, i, i, i};
    sgd_element<T, S, kStore, kMomentum>(static_cast<T*>(ptr[kParam]), static_cast<const T*>(ptr[kGrad]),
                                         static_cast<S*>(ptr[kState0]), static_cast<float*>(ptr[kMaster]), off, i, c,
                                         key);
  }
}

/// Adam over the chunks of many contiguous parameters of one dtype (cuda/chunks.cuh).
template <class T, class S, Store kStore, bool kAmsgrad>
__global__ void __launch_bounds__(kBlockThreads)
    adam_chunks_kernel(const __grid_constant__ OptimChunks l, AdamHyper hyper, const float* found_inf) {
  using M = opmath_t<T>;
  if (skipped(found_inf)) return;
  if (hyper.on_device != nullptr) hyper = *hyper.on_device;  // a replay's options
  const BlockChunk b = block_chunk(l);
  const StepRef& step = l.extra[b.run].step;
  const int64_t count = step.get();
  const optim_math::AdamCoeffs<M> c = optim_math::adam_coeffs<M>(hyper, count);
  const uint64_t key = optim_math::rounding_key(hyper.seed, count, step.index);
  void* const* ptr = l.ptr[b.run];
  for (int64_t i = b.start + threadIdx.x; i < b.stop; i += blockDim.x) {
    const int64_t off[kSlots] = {i, i, i, i, i, i};
    adam_element<T, S, kStore, kAmsgrad>(static_cast<T*>(ptr[kParam]), static_cast<const T*>(ptr[kGrad]),
                                         static_cast<S*>(ptr[kState0]), static_cast<S*>(ptr[kState1]),
                                         static_cast<S*>(ptr[kState2]), static_cast<float*>(ptr[kMaster]), off, i, c,
                                         key);
  }
}

/// The element offsets of `ts` (null entries absent) over the parameter's shape, in elements.
OffsetLayout<kSlots> layout_of(const std::array<const Tensor*, kSlots>& ts) {
  const Tensor& param = *ts[kParam];
  std::array<const Shape*, kSlots> strides;
  std::array<int64_t, kSlots> unit;
  for (int k = 0; k < kSlots; ++k) {
    strides[k] = ts[k] != nullptr ? &ts[k]->strides() : &param.strides();
    unit[k] = ts[k] != nullptr ? 1 : 0;
  }
  return offset_layout(make_strided_layout<kSlots>(param.shape(), strides, unit));
}

/// A typed pointer to t's first element, or null for an absent operand.
template <class X>
X* ptr(const Tensor* t) {
  return t != nullptr ? static_cast<X*>(t->data_ptr()) : nullptr;
}

/// A run's operand pointers in a multi-tensor table (null for an absent operand).
void fill_pointers(void* (&out)[kSlots], const std::array<const Tensor*, kSlots>& ts) {
  for (int k = 0; k < kSlots; ++k) out[k] = ts[k] != nullptr ? ts[k]->data_ptr() : nullptr;
}

/// Runs an optimizer's update over a list of parameters: for each dtype, the parameters whose operands
/// (operands(i), null: absent) are all contiguous in multi-tensor launches, chunks.operator()<T, S, kStore>(group);
/// then each other non-empty parameter i on its own, strided.operator()<T, S, kStore>(i, its operands, their
/// layout). T, S, kStore: the parameter's dtype, its state's and where its value lives (dispatch_store).
template <class Operands, class Chunks, class Strided>
void for_each_update(std::span<const Tensor> params, bool master, bool stochastic_rounding, const char* kernel,
                     Operands&& operands, Chunks&& chunks, Strided&& strided) {
  const ChunkGroups groups = group_for_chunks(
      params.size(), [&](size_t i) { return params[i].dtype(); }, [&](size_t i) { return params[i].numel(); },
      [&](size_t i) { return all_contiguous(operands(i)); });
  for (int d = 0; d < 4; ++d) {
    if (groups.chunked[d].empty()) continue;
    const Tensor& first = params[static_cast<size_t>(groups.chunked[d].front().index)];
    dispatch_store(first.dtype(), master, stochastic_rounding, kernel, [&](auto t, auto st, auto store) {
      using T = typename decltype(t)::type;
      using S = typename decltype(st)::type;
      chunks.template operator()<T, S, decltype(store)::value>(std::span<const ChunkTensor>(groups.chunked[d]));
    });
  }
  for (size_t i : groups.strided) {
    const std::array<const Tensor*, kSlots> ts = operands(i);
    const OffsetLayout<kSlots> L = layout_of(ts);
    dispatch_store(params[i].dtype(), master, stochastic_rounding, kernel, [&](auto t, auto st, auto store) {
      using T = typename decltype(t)::type;
      using S = typename decltype(st)::type;
      strided.template operator()<T, S, decltype(store)::value>(i, ts, L);
    });
  }
}

/// The options the kernels of an optimizer step read: `hyper`, with on_device set when a CUDA graph captures the call
/// and at_replay is given (kernels.h): then to a replay argument of the graph (cuda/graph.cu), which each replay sets
/// to at_replay()'s options, refusing the replay when they would select other kernels than the captured ones.
template <class Hyper>
Hyper replayed_options(const Hyper& hyper, const std::function<Hyper()>& at_replay, Device device,
                       const char* kernel) {
  Hyper h = hyper;
  namespace detail = ::mixtape::cuda::detail;
  const detail::Capture& capture = detail::thread_capture();
  if (capture.stream == nullptr) return h;
  MT_CHECK(device.index == capture.device, "cuda::Graph::capture on cuda:", capture.device, ": ", kernel, " on ",
           device, " inside the capture (a graph records the work of its own device only)");
  // Launched on another stream, the kernels run now, not in the graph: the options passed are theirs.
  if (!at_replay || launch_stream(device.index) != capture.stream) return h;
  h.on_device = static_cast<const Hyper*>(detail::replay_argument(sizeof(Hyper), [=](void* out) {
    Hyper now = at_replay();
    MT_CHECK(same_kernels(hyper, now), "cuda::Graph::replay: the captured ", kernel, " on ", device,
             " was given options now that need other kernels (a momentum that was or was not 0, amsgrad, the "
             "weight decay's kind or stochastic rounding changed since the capture; capture the step again)");
    now.on_device = nullptr;
    std::memcpy(out, &now, sizeof now);
  }));
  return h;
}

}  // namespace

void sgd_step_(std::span<const Tensor> params, std::span<const Tensor> grads, std::span<const Tensor> momentum_buffers,
               std::span<const Tensor> masters, std::span<const OptimStep> steps, const SgdHyper& hyper,
               const Tensor& found_inf, const std::function<SgdHyper()>& at_replay) {
  if (params.empty()) return;
  DeviceGuard guard(params[0].device());
  const SgdHyper* live = replayed_options(hyper, at_replay, params[0].device(), "sgd_step_").on_device;
  const bool momentum = hyper.momentum != 0, master = !masters.empty();
  const float* skip = found_inf.defined() ? static_cast<const float*>(found_inf.data_ptr()) : nullptr;
  auto operands = [&](size_t i) -> std::array<const Tensor*, kSlots> {
    return {&params[i], &grads[i], momentum ? &momentum_buffers[i] : nullptr,
            nullptr,    nullptr,   master ? &masters[i] : nullptr};
  };
  for_each_update(
      params, master, hyper.stochastic_rounding, "sgd_step_", operands,
      [&]<class T, class S, Store kStore>(std::span<const ChunkTensor> group) {
        const auto c = optim_math::sgd_coeffs<opmath_t<T>>(hyper, false);  // first_momentum: each run's
        auto* kernel = momentum ? sgd_chunks_kernel<T, S, kStore, true> : sgd_chunks_kernel<T, S, kStore, false>;
        launch_chunks<OptimChunks>(
            group,
            [&](OptimChunks& l, int r, int i) {
              const size_t k = static_cast<size_t>(i);
              fill_pointers(l.ptr[r], operands(k));
              l.extra[r] = {step_ref(steps[k]), steps[k].first_momentum};
            },
            [&](const OptimChunks& l, int blocks) {
              kernel<<<blocks, kBlockThreads, 0, launch_stream()>>>(l, c, hyper.seed, live, skip);
              MT_CUDA_CHECK_LAUNCH("sgd_chunks_kernel (", dtype_v<T>, ", ", l.n, " parameters on ",
                                   params[0].device(), ")");
            });
      },
      [&]<class T, class S, Store kStore>(size_t i, const std::array<const Tensor*, kSlots>& ts,
                                          const OffsetLayout<kSlots>& L) {
        const auto c = optim_math::sgd_coeffs<opmath_t<T>>(hyper, steps[i].first_momentum);
        auto* kernel = momentum ? sgd_kernel<T, S, kStore, true> : sgd_kernel<T, S, kStore, false>;
        kernel<<<grid_blocks(L.numel), kBlockThreads, 0, launch_stream()>>>(
            ptr<T>(ts[kParam]), ptr<const T>(ts[kGrad]), ptr<S>(ts[kState0]), ptr<float>(ts[kMaster]), L, c,
            hyper.seed, live, step_ref(steps[i]), skip);
        MT_CUDA_CHECK_LAUNCH("sgd_kernel (", params[i].dtype(), ", shape ", params[i].shape(), " on ",
                             params[i].device(), ")");
      });
}

void adam_step_(std::span<const Tensor> params, std::span<const Tensor> grads, std::span<const Tensor> exp_avgs,
                std::span<const Tensor> exp_avg_sqs, std::span<const Tensor> max_exp_avg_sqs,
                std::span<const Tensor> masters, std::span<const OptimStep> steps, const AdamHyper& given,
                const Tensor& found_inf, const std::function<AdamHyper()>& at_replay) {
  if (params.empty()) return;
  DeviceGuard guard(params[0].device());
  const AdamHyper hyper = replayed_options(given, at_replay, params[0].device(), "adam_step_");
  const bool master = !masters.empty();
  const float* skip = found_inf.defined() ? static_cast<const float*>(found_inf.data_ptr()) : nullptr;
  auto operands = [&](size_t i) -> std::array<const Tensor*, kSlots> {
    return {&params[i],   &grads[i], &exp_avgs[i], &exp_avg_sqs[i], hyper.amsgrad ? &max_exp_avg_sqs[i] : nullptr,
            master ? &masters[i] : nullptr};
  };
  for_each_update(
      params, master, hyper.stochastic_rounding, "adam_step_", operands,
      [&]<class T, class S, Store kStore>(std::span<const ChunkTensor> group) {
        auto* kernel =
            hyper.amsgrad ? adam_chunks_kernel<T, S, kStore, true> : adam_chunks_kernel<T, S, kStore, false>;
        launch_chunks<OptimChunks>(
            group,
            [&](OptimChunks& l, int r, int i) {
              const size_t k = static_cast<size_t>(i);
              fill_pointers(l.ptr[r], operands(k));
              l.extra[r] = {step_ref(steps[k]), false};
            },
            [&](const OptimChunks& l, int blocks) {
              kernel<<<blocks, kBlockThreads, 0, launch_stream()>>>(l, hyper, skip);
              MT_CUDA_CHECK_LAUNCH("adam_chunks_kernel (", dtype_v<T>, ", ", l.n, " parameters on ",
                                   params[0].device(), ")");
            });
      },
      [&]<class T, class S, Store kStore>(size_t i, const std::array<const Tensor*, kSlots>& ts,
                                          const OffsetLayout<kSlots>& L) {
        auto* kernel = hyper.amsgrad ? adam_kernel<T, S, kStore, true> : adam_kernel<T, S, kStore, false>;
        kernel<<<grid_blocks(L.numel), kBlockThreads, 0, launch_stream()>>>(
            ptr<T>(ts[kParam]), ptr<const T>(ts[kGrad]), ptr<S>(ts[kState0]), ptr<S>(ts[kState1]),
            ptr<S>(ts[kState2]), ptr<float>(ts[kMaster]), L, hyper, step_ref(steps[i]), skip);
        MT_CUDA_CHECK_LAUNCH("adam_kernel (", params[i].dtype(), ", shape ", params[i].shape(), " on ",
                             params[i].device(), ")");
      });
}

namespace {

/// Counters a count_steps_kernel launch advances (kernel parameters: no copy to the device).
constexpr int kCountsPerLaunch = 64;
struct Counters {
  int32_t* at[kCountsPerLaunch];
  int n;
};

/// Each of c's counters += 1 unless the step is skipped or the count is 2^31 − 1 (it stays there, as on the CPU);
/// one thread per counter.
__global__ void count_steps_kernel(Counters c, const float* found_inf) {
  if (skipped(found_inf)) return;
  if (static_cast<int>(threadIdx.x) < c.n) {
    int32_t* count = c.at[threadIdx.x];
    if (*count < INT32_MAX) ++*count;
  }
}

}  // namespace

void optim_count_steps_(std::span<const Tensor> counts, const Tensor& found_inf) {
  if (counts.empty()) return;
  DeviceGuard guard(counts[0].device());
  const float* skip = found_inf.defined() ? static_cast<const float*>(found_inf.data_ptr()) : nullptr;
  for (size_t first = 0; first < counts.size(); first += kCountsPerLaunch) {
    Counters c{};
    c.n = static_cast<int>(std::min<size_t>(kCountsPerLaunch, counts.size() - first));
    for (int k = 0; k < c.n; ++k) c.at[k] = static_cast<int32_t*>(counts[first + static_cast<size_t>(k)].data_ptr());
    count_steps_kernel<<<1, kCountsPerLaunch, 0, launch_stream()>>>(c, skip);
    MT_CUDA_CHECK_LAUNCH("count_steps_kernel (", c.n, " counters on ", counts[0].device(), ")");
  }
}

}  // namespace mixtape::kernels::cuda
