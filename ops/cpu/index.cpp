// ops/cpu/index.cpp — gather, scatter_add, index_select, index_add and randperm on the CPU.
//
// Index values are checked against the indexed size here as well as in the
// op (these kernels also serve internal callers, and a CPU pass can throw).
// Selections move bytes, so they take any dtype; the adds accumulate in
// opmath and round once per output. Outputs are freshly allocated and
// overwritten.
#include <mixtape/ops/backend/kernels.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include <mixtape/core/random.h>
#include <mixtape/core/strided_loop.h>
#include <mixtape/ops/cpu/loops.h>

namespace mixtape::kernels::cpu {

namespace {

/// Throws when an index value is outside [0, size) (index is contiguous kI64).
void check_indices(const char* op, const Tensor& index, int64_t dim, int64_t size) {
  const int64_t* p = index.data<int64_t>();
  for (int64_t i = 0; i < index.numel(); ++i)
    MT_CHECK(p[i] >= 0 && p[i] < size, op, ": index ", p[i], " is out of bounds for dim ", dim, " of size ", size,
             " (index shape ", index.shape(), ")");
}

/// `strides` with the entry of `dim` zeroed: a pointer built from them lands
/// on coordinate 0 along dim, and the index value adds the rest.
Shape without_dim(const Shape& strides, int64_t dim) {
  Shape s = strides;
  if (!s.empty()) s[dim] = 0;
  return s;
}

template <int N>
struct Bytes {
  unsigned char b[N];
};

}  // namespace

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index_in) {
  const Tensor index = raw::contiguous(index_in);
  Tensor out = empty(index.shape(), x.dtype());
  if (out.numel() == 0) return out;
  const int64_t size = x.dim() == 0 ? 1 : x.size(dim);
  check_indices("gather", index, dim, size);
  const int64_t step = x.dim() == 0 ? 0 : x.stride(dim) * static_cast<int64_t>(x.itemsize());
  const Shape x_strides = without_dim(x.strides(), dim);
  const auto item = static_cast<int64_t>(x.itemsize());
  const auto L = make_strided_layout<3>(index.shape(), {&out.strides(), &index.strides(), &x_strides},
                                        {item, static_cast<int64_t>(sizeof(int64_t)), item});
  const std::array<char*, 3> base{static_cast<char*>(out.data_ptr()), static_cast<char*>(index.data_ptr()),
                                  static_cast<char*>(x.data_ptr())};
  // A copy of itemsize bytes: gather moves elements of any dtype without converting them.
  auto copy_runs = [&](auto bytes_tag) {
    using E = decltype(bytes_tag);
    auto run = [&](const std::array<char*, 3>& p, const std::array<int64_t, 3>& s, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t k = *reinterpret_cast<const int64_t*>(p[1] + i * s[1]);
        std::memcpy(p[0] + i * s[0], p[2] + i * s[2] + k * step, sizeof(E));
      }
    };
    const int64_t chunks = (L.numel + kParallelMin - 1) / kParallelMin;
    parallel_items(chunks, chunks > 1, [&](int64_t c) {
      for_each_run<3>(L, base, c * kParallelMin, std::min(L.numel, (c + 1) * kParallelMin), run);
    });
  };
  switch (item) {
    case 1: copy_runs(Bytes<1>{}); break;
    case 2: copy_runs(Bytes<2>{}); break;
    case 4: copy_runs(Bytes<4>{}); break;
    default: copy_runs(Bytes<8>{}); break;
  }
  return out;
}

Tensor scatter_add(const Shape& shape, int64_t dim, const Tensor& index_in, const Tensor& src) {
  const Tensor index = raw::contiguous(index_in);
  Tensor out = zeros(shape, src.dtype());
  if (index.numel() == 0) return out;
  const int64_t size = shape.empty() ? 1 : shape[dim];
  check_indices("scatter_add", index, dim, size);
  dispatch_floating(src.dtype(), "scatter_add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = opmath_t<T>;
    // Sums in Acc, rounded once: colliding indices do not round after every add.
    std::vector<Acc> acc(static_cast<size_t>(shape.numel()), Acc(0));
    const Shape acc_strides = without_dim(contiguous_strides(shape), dim);
    const int64_t step = shape.empty() ? 0 : contiguous_strides(shape)[dim] * static_cast<int64_t>(sizeof(Acc));
    const auto L = make_strided_layout<3>(index.shape(), {&src.strides(), &index.strides(), &acc_strides},
                                          {static_cast<int64_t>(sizeof(T)), static_cast<int64_t>(sizeof(int64_t)),
                                           static_cast<int64_t>(sizeof(Acc))});
    const std::array<char*, 3> base{static_cast<char*>(src.data_ptr()), static_cast<char*>(index.data_ptr()),
                                    reinterpret_cast<char*>(acc.data())};
    // One thread: different index elements may add into the same slot.
    auto run = [&](const std::array<char*, 3>& p, const std::array<int64_t, 3>& s, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t k = *reinterpret_cast<const int64_t*>(p[1] + i * s[1]);
        const T v = *reinterpret_cast<const T*>(p[0] + i * s[0]);
        *reinterpret_cast<Acc*>(p[2] + i * s[2] + k * step) += static_cast<Acc>(v);
      }
    };
    for_each_run<3>(L, base, 0, L.numel, run);
    T* o = out.data<T>();
    for (size_t i = 0; i < acc.size(); ++i) o[i] = convert<T>(acc[i]);
  });
  return out;
}

namespace {

/// Index values as int64 (kI64 or kI32, any layout); throws when one is outside [0, size).
std::vector<int64_t> index_values(const char* op, const Tensor& index, int64_t dim, int64_t size) {
  const Tensor i64 = raw::contiguous(raw::to(index, DType::kI64));
  check_indices(op, i64, dim, size);
  const int64_t* p = i64.data<int64_t>();
  return std::vector<int64_t>(p, p + i64.numel());
}

}  // namespace

Tensor index_select(const Tensor& x_in, int64_t dim, const Tensor& index) {
  const Tensor x = raw::contiguous(x_in);
  const std::vector<int64_t> idx = index_values("index_select", index, dim, x.size(dim));
  const int64_t k = static_cast<int64_t>(idx.size());
  Shape out_shape = x.shape();
  out_shape[dim] = k;
  Tensor out = empty(out_shape, x.dtype());
  if (out.numel() == 0) return out;
  const RowLayout a = row_layout(x.shape(), dim);
  const size_t row_bytes = static_cast<size_t>(a.inner) * x.itemsize();
  const char* src = static_cast<const char*>(x.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  // A selection moves bytes: any dtype, no rounding.
#pragma omp parallel for schedule(static) if (out.numel() >= kParallelMin)
  for (int64_t r = 0; r < a.outer * k; ++r) {
    const int64_t o = r / k, j = r % k;
    std::memcpy(dst + static_cast<size_t>(r) * row_bytes,
                src + static_cast<size_t>(o * a.C + idx[static_cast<size_t>(j)]) * row_bytes, row_bytes);
  }
  return out;
}

Tensor index_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src_in) {
  const Tensor src = raw::contiguous(src_in);
  const std::vector<int64_t> idx = index_values("index_add", index, dim, shape[dim]);
  const int64_t k = static_cast<int64_t>(idx.size());
  Tensor out = empty(shape, src.dtype());
  if (out.numel() == 0) return out;
  const RowLayout a = row_layout(shape, dim);
  dispatch_floating(src.dtype(), "index_add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = opmath_t<T>;
    const T* sp = src.data<T>();
    T* op = out.data<T>();
    // Outer slices are independent (a repeated index only repeats within one), so they run in parallel.
#pragma omp parallel if (out.numel() + src.numel() >= kParallelMin)
    {
      std::vector<M> scratch;
#pragma omp for schedule(static)
      for (int64_t o = 0; o < a.outer; ++o) {
        // Captured by value: clang 16 rejects a reference to the function's locals from a lambda in an OpenMP region.
        accumulate_into(op + o * a.C * a.inner, a.C * a.inner, scratch, [sp, o, k, a, ip = idx.data()](M* acc) {
          for (int64_t j = 0; j < k; ++j) {
            const T* s = sp + (o * k + j) * a.inner;
            M* d = acc + ip[j] * a.inner;
            for (int64_t i = 0; i < a.inner; ++i) d[i] += static_cast<M>(s[i]);
          }
        });
      }
    }
  });
  return out;
}

Tensor randperm(int64_t n, uint64_t seed, uint64_t offset, Device) {
  Tensor out = empty({n}, TensorOptions(DType::kI64));
  std::vector<std::pair<uint64_t, int64_t>> keyed(static_cast<size_t>(n));
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) keyed[static_cast<size_t>(i)] = {permutation_key(seed, offset, i), i};
  std::sort(keyed.begin(), keyed.end());  // by key, then position: CUDA's stable radix sort gives the same order
  int64_t* o = out.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) o[i] = keyed[static_cast<size_t>(i)].second;
  return out;
}

}  // namespace mixtape::kernels::cpu
