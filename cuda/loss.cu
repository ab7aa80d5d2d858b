// cuda/loss.cu — gather (torch.gather) and scatter_add, its gradient: the indexing halves of the class losses.
//
// gather: one thread per output element maps its coordinates to the index
// element and the x element it names; elements are moved as raw bytes of
// their size, so every dtype is one of four instantiations and nothing is
// converted. An index value out of [0, x.size(dim)) reads nothing and writes
// NaN (0 for integer and bool dtypes): the host cannot check CUDA index values
// without a synchronisation, and a NaN loss is how a bad target shows up.
//
// scatter_add is deterministic without float atomics by ownership: one thread
// owns each line of the output along `dim` (fixed coordinates off `dim`) and
// adds the index line's j = 0, 1, ... contributions into it in that order —
// the order the CPU adds them, in the same opmath accumulator (an f32 buffer
// for f16/bf16, rounded once at the end), so the two backends agree exactly.
// No two threads touch one output element. For cross-entropy (index (N, 1)
// along the class dim) a thread does one add; a scatter whose index has few
// lines and long ones runs serially per line (correct, not fast). Out-of-range
// index values are skipped: nothing is written out of bounds.
// Outputs are freshly allocated and overwritten.
#include <mixtape/cuda/nn.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <mixtape/core/dtype.h>
#include <mixtape/cuda/launch.cuh>

namespace mixtape::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGrid = 1 << 20;  // grid-stride loops past this many blocks

/// The index's shape and the operands' strides (in elements), passed to the kernels by value.
struct IndexLayout {
  int ndim;                          // 0 for 0-d tensors
  int64_t sizes[Shape::kMaxDims];    // (ndim): gather: the index's shape; scatter_add: its lines (1 along dim)
  int64_t a_strides[Shape::kMaxDims];      // gather: x's strides; scatter_add: the accumulator's. 0 along dim
  int64_t b_strides[Shape::kMaxDims];      // src's strides (scatter_add)
  int64_t index_strides[Shape::kMaxDims];  // the index's strides
};

/// Offsets (in elements) of linear element `i` of L.sizes in the three operands.
__device__ __forceinline__ void offsets(const IndexLayout& L, int64_t i, int64_t& a, int64_t& b, int64_t& idx) {
  a = b = idx = 0;
  for (int d = L.ndim - 1; d >= 0; --d) {
    const int64_t q = i / L.sizes[d], c = i - q * L.sizes[d];
    a += c * L.a_strides[d];
    b += c * L.b_strides[d];
    idx += c * L.index_strides[d];
    i = q;
  }
}


int grid_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxGrid)); }

/// out[i] = x[coords(i) with coordinate dim = index[i]]; E is an unsigned integer of the element's size.
/// `bad` (the bits of NaN, or 0) is written for an index value out of [0, size). Overwrites out.
template <class E>
__global__ void __launch_bounds__(kThreads) gather_kernel(E* __restrict__ out,               // (index shape), contiguous
                                                          const E* __restrict__ x,           // strides L.a_strides
                                                          const int64_t* __restrict__ index,  // strides L.index_strides
                                                          IndexLayout L, int64_t numel, int64_t size, int64_t step,
                                                          E bad) {
  for (int64_t i = first_index(); i < numel; i += grid_stride()) {
    int64_t xo, unused, io;
    offsets(L, i, xo, unused, io);
    const int64_t k = index[io];
    out[i] = (k >= 0 && k < size) ? x[xo + k * step] : bad;
  }
}

/// For each line of the index along dim (L.sizes has 1 there): acc[line, index[line, j]] += src[line, j] for
/// j = 0 .. J−1 in order; out-of-range index values are skipped. Accumulates into acc (zero-filled by the caller).
template <class T>
__global__ void __launch_bounds__(kThreads) scatter_add_kernel(opmath_t<T>* __restrict__ acc,    // (shape), contiguous
                                                               const T* __restrict__ src,         // strides L.b_strides
                                                               const int64_t* __restrict__ index,  // strides L.index_strides
                                                               IndexLayout L, int64_t lines, int64_t J, int64_t size,
                                                               int64_t acc_step, int64_t src_step,
                                                               int64_t index_step) {
  using Acc = opmath_t<T>;
  for (int64_t line = first_index(); line < lines; line += grid_stride()) {
    int64_t ao, so, io;
    offsets(L, line, ao, so, io);
    for (int64_t j = 0; j < J; ++j) {
      const int64_t k = index[io + j * index_step];
      if (k >= 0 && k < size) acc[ao + k * acc_step] += static_cast<Acc>(src[so + j * src_step]);
    }
  }
}

/// The bits gather writes for an out-of-range index: a quiet NaN for floating dtypes, 0 otherwise.
uint64_t bad_value_bits(DType t) {
  switch (t) {
    case DType::kF64: return 0x7ff8000000000000ull;
    case DType::kF32: return 0x7fc00000u;
    case DType::kF16: return 0x7e00u;
    case DType::kBF16: return 0x7fc0u;
    default: return 0;
  }
}

}  // namespace

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  Tensor out = empty(index.shape(), TensorOptions(x.dtype()).device(x.device()));
  const int64_t numel = out.numel();
  if (numel == 0) return out;
  IndexLayout L{};
  L.ndim = static_cast<int>(index.dim());
  for (int d = 0; d < L.ndim; ++d) {
    L.sizes[d] = index.size(d);
    L.a_strides[d] = d == dim ? 0 : x.stride(d);
    L.index_strides[d] = index.stride(d);
  }
  const int64_t size = x.dim() == 0 ? 1 : x.size(dim);
  const int64_t step = x.dim() == 0 ? 0 : x.stride(dim);
  DeviceGuard guard(x.device());
  const uint64_t bad = bad_value_bits(x.dtype());
  auto launch = [&](auto bytes_tag) {
    using E = decltype(bytes_tag);
    gather_kernel<E><<<grid_for(numel), kThreads, 0, ::mixtape::cuda::launch_stream()>>>(
        static_cast<E*>(out.data_ptr()), static_cast<const E*>(x.data_ptr()), index.data<int64_t>(), L, numel, size,
        step, static_cast<E>(bad));
    MT_CUDA_CHECK_LAUNCH("gather_kernel (", x.dtype(), " x of shape ", x.shape(), ", index of shape ", index.shape(),
                         ", dim ", dim, ")");
  };
  switch (x.itemsize()) {
    case 1: launch(uint8_t{}); break;
    case 2: launch(uint16_t{}); break;
    case 4: launch(uint32_t{}); break;
    default: launch(uint64_t{}); break;
  }
  return out;
}

Tensor scatter_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src) {
  const auto out_options = TensorOptions(src.dtype()).device(src.device());
  if (index.numel() == 0) return zeros(shape, out_options);
  const DType acc_dtype = src.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  // f32/f64 accumulate in the output itself; f16/bf16 in an f32 buffer rounded once below.
  Tensor acc = zeros(shape, TensorOptions(acc_dtype).device(src.device()));
  const Shape acc_strides = contiguous_strides(shape);
  IndexLayout L{};
  L.ndim = static_cast<int>(index.dim());
  int64_t lines = 1;
  for (int d = 0; d < L.ndim; ++d) {
    L.sizes[d] = d == dim ? 1 : index.size(d);
    L.a_strides[d] = d == dim ? 0 : acc_strides[d];
    L.b_strides[d] = src.stride(d);
    L.index_strides[d] = index.stride(d);
    lines *= L.sizes[d];
  }
  const bool zero_d = shape.empty();
  const int64_t J = zero_d ? 1 : index.size(dim), size = zero_d ? 1 : shape[dim];
  const int64_t acc_step = zero_d ? 0 : acc_strides[dim];
  const int64_t src_step = zero_d ? 0 : src.stride(dim), index_step = zero_d ? 0 : index.stride(dim);
  DeviceGuard guard(src.device());
  dispatch_floating(src.dtype(), "scatter_add_kernel", [&](auto tag) {
    using T = typename decltype(tag)::type;
    scatter_add_kernel<T><<<grid_for(lines), kThreads, 0, ::mixtape::cuda::launch_stream()>>>(
        acc.data<opmath_t<T>>(), src.data<T>(), index.data<int64_t>(), L, lines, J, size, acc_step, src_step,
        index_step);
    MT_CUDA_CHECK_LAUNCH("scatter_add_kernel (", src.dtype(), " src of shape ", src.shape(), " into shape ", shape,
                         ", dim ", dim, ")");
  });
  return src.dtype() == acc_dtype ? acc : raw::to(acc, src.dtype());
}

}  // namespace mixtape::kernels::cuda
