// cuda/optim.cu — the optimizer step kernels on the GPU: SGD, Adam and AdamW over a list of parameters.
//
// Each parameter of the list is one grid-stride launch over its elements (any layouts, cuda/launch.cuh's
// offsets); a thread loads the element's gradient, state, master and parameter once, applies the formula of
// ops/backend/optim_math.h — the very function the CPU loop calls, with products and sums that are never fused into
// an FMA — and stores once, so the GPU's bits are the CPU's. The sync-free step: a kernel reads the loss scaler's
// found-inf flag and the parameter's update count from device memory (the count advanced, or not, by
// count_steps_kernel before it) and computes its scalars there (optim_math's adam_coeffs and rounding_key, the
// CPU's functions), so a skipped step costs no host read. Launches that cover many tensors at once are the GPU
// issue's work; they will take these launchers' place without changing the kernels' contract
// (ops/backend/kernels.h, MT_KERNELS_OPTIM).
#include <mixtape/ops/backend/kernels.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include <mixtape/core/dtype.h>
#include <mixtape/core/strided_loop.h>
#include <mixtape/cuda/launch.cuh>
#include <mixtape/ops/backend/optim_math.h>

namespace mixtape::kernels::cuda {

namespace {

using optim_math::Store;

/// The operands of one parameter's update, in this order; absent ones (no master, no optional buffer) have a null
/// pointer and stride 0.
enum Slot : int { kParam, kGrad, kState0, kState1, kState2, kMaster, kSlots };

/// A parameter's update count: its counter in device memory when it has one, else the host's value.
struct StepRef {
  int64_t value;
  const int64_t* count;
  int64_t index;
  __device__ int64_t get() const { return count != nullptr ? *count : value; }
};

StepRef step_ref(const OptimStep& s) { return {s.step, s.count, s.index}; }

/// Whether the step is skipped: found_inf (null: never) is nonzero.
__device__ inline bool skipped(const float* found_inf) { return found_inf != nullptr && *found_inf != 0.0f; }

/// SGD over one parameter: param T (L's shape), grad T, momentum buffer S (with kMomentum), master f32 (kMaster).
template <class T, class S, Store kStore, bool kMomentum>
__global__ void __launch_bounds__(kBlockThreads)
    sgd_kernel(T* param, const T* grad, S* momentum_buffer, float* master, OffsetLayout<kSlots> L,
               optim_math::SgdCoeffs<opmath_t<T>> c, uint64_t seed, StepRef step, const float* found_inf) {
  using M = opmath_t<T>;
  if (skipped(found_inf)) return;
  const uint64_t key = optim_math::rounding_key(seed, step.get(), step.index);
  for (int64_t i = first_index(); i < L.numel; i += grid_stride()) {
    int64_t off[kSlots];
    element_offsets(L, i, off);
    float* master_at = kStore == Store::kMaster ? master + off[kMaster] : nullptr;
    M buf = M(0);
    if constexpr (kMomentum) buf = static_cast<M>(momentum_buffer[off[kState0]]);
    const M p = optim_math::load_param<kStore, optim_math::CoreConvert, T, M>(param + off[kParam], master_at);
    const M updated = optim_math::sgd_update<kMomentum>(p, static_cast<M>(grad[off[kGrad]]), buf, c);
    if constexpr (kMomentum) momentum_buffer[off[kState0]] = convert<S>(buf);
    optim_math::store_param<kStore, optim_math::CoreConvert, T, M>(param + off[kParam], master_at, updated, key, i);
  }
}

/// Adam over one parameter: param T (L's shape), grad T, exp_avg, exp_avg_sq and (kAmsgrad) max_exp_avg_sq S,
/// master f32 (kMaster).
template <class T, class S, Store kStore, bool kAmsgrad>
__global__ void __launch_bounds__(kBlockThreads)
    adam_kernel(T* param, const T* grad, S* exp_avg, S* exp_avg_sq, S* max_exp_avg_sq, float* master,
                OffsetLayout<kSlots> L, AdamHyper hyper, StepRef step, const float* found_inf) {
  using M = opmath_t<T>;
  if (skipped(found_inf)) return;
  const int64_t count = step.get();
  const optim_math::AdamCoeffs<M> c = optim_math::adam_coeffs<M>(hyper, count);
  const uint64_t key = optim_math::rounding_key(hyper.seed, count, step.index);
  for (int64_t i = first_index(); i < L.numel; i += grid_stride()) {
    int64_t off[kSlots];
    element_offsets(L, i, off);
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

/// Calls f(TypeTag<T>, TypeTag<S>, std::integral_constant<Store, ...>) for a parameter: its dtype, its state's and
/// where its value lives (kernels.h, MT_KERNELS_OPTIM).
template <class F>
void dispatch_store(const Tensor& param, bool has_master, bool stochastic_rounding, const char* kernel, F&& f) {
  dispatch_floating(param.dtype(), kernel, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      if (has_master) return f(tag, TypeTag<float>{}, std::integral_constant<Store, Store::kMaster>{});
      if constexpr (std::is_same_v<T, BFloat16>)
        if (stochastic_rounding) return f(tag, TypeTag<float>{}, std::integral_constant<Store, Store::kStochastic>{});
    }
    return f(tag, tag, std::integral_constant<Store, Store::kNearest>{});
  });
}

}  // namespace

void sgd_step_(std::span<const Tensor> params, std::span<const Tensor> grads, std::span<const Tensor> momentum_buffers,
               std::span<const Tensor> masters, std::span<const OptimStep> steps, const SgdHyper& hyper,
               const Tensor& found_inf) {
  if (params.empty()) return;
  DeviceGuard guard(params[0].device());
  const bool momentum = hyper.momentum != 0, master = !masters.empty();
  const float* skip = found_inf.defined() ? static_cast<const float*>(found_inf.data_ptr()) : nullptr;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].numel() == 0) continue;
    const std::array<const Tensor*, kSlots> ts = {&params[i], &grads[i], momentum ? &momentum_buffers[i] : nullptr,
                                                  nullptr,    nullptr,   master ? &masters[i] : nullptr};
    const OffsetLayout<kSlots> L = layout_of(ts);
    dispatch_store(params[i], master, hyper.stochastic_rounding, "sgd_step_", [&](auto t, auto st, auto store) {
      using T = typename decltype(t)::type;
      using S = typename decltype(st)::type;
      constexpr Store kStore = decltype(store)::value;
      const auto c = optim_math::sgd_coeffs<opmath_t<T>>(hyper, steps[i].first_momentum);
      auto* kernel = momentum ? sgd_kernel<T, S, kStore, true> : sgd_kernel<T, S, kStore, false>;
      kernel<<<grid_blocks(L.numel), kBlockThreads, 0, launch_stream()>>>(
          ptr<T>(ts[kParam]), ptr<const T>(ts[kGrad]), ptr<S>(ts[kState0]), ptr<float>(ts[kMaster]), L, c,
          hyper.seed, step_ref(steps[i]), skip);
      MT_CUDA_CHECK_LAUNCH("sgd_kernel (", params[i].dtype(), ", shape ", params[i].shape(), " on ",
                           params[i].device(), ")");
    });
  }
}

void adam_step_(std::span<const Tensor> params, std::span<const Tensor> grads, std::span<const Tensor> exp_avgs,
                std::span<const Tensor> exp_avg_sqs, std::span<const Tensor> max_exp_avg_sqs,
                std::span<const Tensor> masters, std::span<const OptimStep> steps, const AdamHyper& hyper,
                const Tensor& found_inf) {
  if (params.empty()) return;
  DeviceGuard guard(params[0].device());
  const bool master = !masters.empty();
  const float* skip = found_inf.defined() ? static_cast<const float*>(found_inf.data_ptr()) : nullptr;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].numel() == 0) continue;
    const std::array<const Tensor*, kSlots> ts = {&params[i],     &grads[i],
                                                  &exp_avgs[i],   &exp_avg_sqs[i],
                                                  hyper.amsgrad ? &max_exp_avg_sqs[i] : nullptr,
                                                  master ? &masters[i] : nullptr};
    const OffsetLayout<kSlots> L = layout_of(ts);
    dispatch_store(params[i], master, hyper.stochastic_rounding, "adam_step_", [&](auto t, auto st, auto store) {
      using T = typename decltype(t)::type;
      using S = typename decltype(st)::type;
      constexpr Store kStore = decltype(store)::value;
      auto* kernel = hyper.amsgrad ? adam_kernel<T, S, kStore, true> : adam_kernel<T, S, kStore, false>;
      kernel<<<grid_blocks(L.numel), kBlockThreads, 0, launch_stream()>>>(
          ptr<T>(ts[kParam]), ptr<const T>(ts[kGrad]), ptr<S>(ts[kState0]), ptr<S>(ts[kState1]),
          ptr<S>(ts[kState2]), ptr<float>(ts[kMaster]), L, hyper, step_ref(steps[i]), skip);
      MT_CUDA_CHECK_LAUNCH("adam_kernel (", params[i].dtype(), ", shape ", params[i].shape(), " on ",
                           params[i].device(), ")");
    });
  }
}

namespace {

/// Counters a count_steps_kernel launch advances (kernel parameters: no copy to the device).
constexpr int kCountsPerLaunch = 64;
struct Counters {
  int64_t* at[kCountsPerLaunch];
  int n;
};

/// Each of c's counters += 1 unless the step is skipped; one thread per counter.
__global__ void count_steps_kernel(Counters c, const float* found_inf) {
  if (skipped(found_inf)) return;
  if (static_cast<int>(threadIdx.x) < c.n) ++*c.at[threadIdx.x];
}

}  // namespace

void optim_count_steps_(std::span<const Tensor> counts, const Tensor& found_inf) {
  if (counts.empty()) return;
  DeviceGuard guard(counts[0].device());
  const float* skip = found_inf.defined() ? static_cast<const float*>(found_inf.data_ptr()) : nullptr;
  for (size_t first = 0; first < counts.size(); first += kCountsPerLaunch) {
    Counters c{};
    c.n = static_cast<int>(std::min<size_t>(kCountsPerLaunch, counts.size() - first));
    for (int k = 0; k < c.n; ++k) c.at[k] = static_cast<int64_t*>(counts[first + static_cast<size_t>(k)].data_ptr());
    count_steps_kernel<<<1, kCountsPerLaunch, 0, launch_stream()>>>(c, skip);
    MT_CUDA_CHECK_LAUNCH("count_steps_kernel (", c.n, " counters on ", counts[0].device(), ")");
  }
}

}  // namespace mixtape::kernels::cuda
