// ops/cpu/nn2.cpp — convolution columns, pooling, dropout masks and index
// kernels on the CPU.
//
// The one design idea: work one (n, c) plane at a time (one outer slice for
// the index kernels), planes in parallel with OpenMP. A plane's scatter-adds
// (col2im, the pooling backwards, index_add) then never race, and each sum
// goes into an opmath_t<T> buffer the size of one plane that is rounded to T
// once per output (STYLE.md §2). Inputs of any layout are made contiguous
// first; outputs are freshly allocated and overwritten.
#include <mixtape/ops/cpu/nn2_kernels.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include <mixtape/core/random.h>

namespace mixtape::kernels::cpu {

namespace {

// Elements touched below which OpenMP's fork costs more than it saves.
constexpr int64_t kParallelWork = 32768;

/// The sizes of an (N, C, H, W) problem and its window's output plane.
struct Planes {
  int64_t n, c, h, w;    // input (N, C, H, W)
  int64_t ho, wo;        // output plane (H_out, W_out)
  int64_t count() const { return n * c; }
  int64_t in_plane() const { return h * w; }
  int64_t out_plane() const { return ho * wo; }
};

Planes planes_of(const Shape& input_shape, const Window2d& w) {
  return {input_shape[0], input_shape[1], input_shape[2], input_shape[3],
          window_output_size(input_shape[2], w, 0), window_output_size(input_shape[3], w, 1)};
}

/// The outputs o in [0, n_out) whose tap o·stride + offset lands inside [0, n_in): [lo, hi).
struct Valid {
  int64_t lo, hi;
};
Valid valid_outputs(int64_t offset, int64_t stride, int64_t n_in, int64_t n_out) {
  const int64_t lo = std::min(n_out, offset >= 0 ? int64_t{0} : (-offset + stride - 1) / stride);
  const int64_t last = n_in - 1 - offset;  // o·stride <= last
  const int64_t hi = last < 0 ? lo : std::clamp(last / stride + 1, lo, n_out);
  return {lo, hi};
}

/// Calls `visit(input_pos, output_pos)` for each tap of each window of one plane
/// that lands inside the input (padding taps are skipped).
template <class F>
void for_each_tap(const Planes& p, const Window2d& w, F&& visit) {
  for (int64_t oh = 0; oh < p.ho; ++oh)
    for (int64_t ow = 0; ow < p.wo; ++ow)
      for (int64_t kh = 0; kh < w.kernel[0]; ++kh) {
        const int64_t ih = oh * w.stride[0] - w.padding[0] + kh * w.dilation[0];
        if (ih < 0 || ih >= p.h) continue;
        for (int64_t kw = 0; kw < w.kernel[1]; ++kw) {
          const int64_t iw = ow * w.stride[1] - w.padding[1] + kw * w.dilation[1];
          if (iw < 0 || iw >= p.w) continue;
          visit(ih * p.w + iw, oh * p.wo + ow);
        }
      }
}

/// Runs `add(acc)` on a zeroed opmath buffer of `n` elements, then stores it
/// into out[0, n) with one rounding. For f32/f64 the buffer is `out` itself.
template <class T, class F>
void accumulate_into(T* out, int64_t n, std::vector<opmath_t<T>>& scratch, F&& add) {
  using M = opmath_t<T>;
  if constexpr (std::is_same_v<T, M>) {
    std::fill(out, out + n, M(0));
    add(out);
  } else {
    scratch.assign(static_cast<size_t>(n), M(0));
    add(scratch.data());
    for (int64_t i = 0; i < n; ++i) out[i] = convert<T>(scratch[static_cast<size_t>(i)]);
  }
}

/// Index values as int64 (kI64 or kI32, any layout).
std::vector<int64_t> index_values(const Tensor& index) {
  const Tensor i64 = raw::contiguous(raw::to(index, DType::kI64));
  const int64_t* p = i64.data<int64_t>();
  return std::vector<int64_t>(p, p + i64.numel());
}

/// Sizes of x around `dim`: (outer, size, inner).
struct Around {
  int64_t outer = 1, size = 1, inner = 1;
};
Around around(const Shape& shape, int64_t dim) {
  Around a;
  for (int64_t d = 0; d < dim; ++d) a.outer *= shape[d];
  a.size = shape.size() == 0 ? 1 : shape[dim];
  for (int64_t d = dim + 1; d < shape.size(); ++d) a.inner *= shape[d];
  return a;
}

}  // namespace

// ---- convolution columns -------------------------------------------------------------

Tensor im2col(const Tensor& x_in, const Window2d& w) {
  const Tensor x = raw::contiguous(x_in);
  const Planes p = planes_of(x.shape(), w);
  const int64_t kk = w.kernel[0] * w.kernel[1], L = p.out_plane();
  Tensor cols = empty({p.n, p.c * kk, L}, x.dtype());  // (N, C·kH·kW, L)
  if (cols.numel() == 0) return cols;
  dispatch_floating(x.dtype(), "im2col", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xp = x.data<T>();
    T* cp = cols.data<T>();
    const T zero = convert<T>(0.0f);
    // Rows (c·kH + kh)·kW + kw of sample n: plane (n, c) owns kH·kW consecutive rows.
#pragma omp parallel for schedule(static) if (cols.numel() >= kParallelWork)
    for (int64_t nc = 0; nc < p.count(); ++nc) {
      const T* src = xp + nc * p.in_plane();
      for (int64_t kh = 0; kh < w.kernel[0]; ++kh)
        for (int64_t kw = 0; kw < w.kernel[1]; ++kw) {
          T* row = cp + (nc * kk + kh * w.kernel[1] + kw) * L;
          const int64_t off_w = kw * w.dilation[1] - w.padding[1];
          const Valid cols_in = valid_outputs(off_w, w.stride[1], p.w, p.wo);
          for (int64_t oh = 0; oh < p.ho; ++oh) {
            T* dst = row + oh * p.wo;
            const int64_t ih = oh * w.stride[0] - w.padding[0] + kh * w.dilation[0];
            if (ih < 0 || ih >= p.h) {
              std::fill(dst, dst + p.wo, zero);
              continue;
            }
            // Padding on the left and right of the row, the input's pixels in between.
            std::fill(dst, dst + cols_in.lo, zero);
            const T* line = src + ih * p.w;
            if (w.stride[1] == 1) {
              std::copy(line + cols_in.lo + off_w, line + cols_in.hi + off_w, dst + cols_in.lo);
            } else {
              for (int64_t ow = cols_in.lo; ow < cols_in.hi; ++ow) dst[ow] = line[ow * w.stride[1] + off_w];
            }
            std::fill(dst + cols_in.hi, dst + p.wo, zero);
          }
        }
    }
  });
  return cols;
}

Tensor col2im(const Tensor& cols_in, const Shape& input_shape, const Window2d& w) {
  const Tensor cols = raw::contiguous(cols_in);
  const Planes p = planes_of(input_shape, w);
  const int64_t kk = w.kernel[0] * w.kernel[1], L = p.out_plane();
  Tensor x = empty(input_shape, cols.dtype());  // (N, C, H, W)
  if (x.numel() == 0) return x;
  dispatch_floating(cols.dtype(), "col2im", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = opmath_t<T>;
    const T* cp = cols.data<T>();
    T* xp = x.data<T>();
#pragma omp parallel if (cols.numel() >= kParallelWork)
    {
      std::vector<M> scratch;
#pragma omp for schedule(static)
      for (int64_t nc = 0; nc < p.count(); ++nc) {
        accumulate_into(xp + nc * p.in_plane(), p.in_plane(), scratch, [&](M* acc) {
          for (int64_t kh = 0; kh < w.kernel[0]; ++kh)
            for (int64_t kw = 0; kw < w.kernel[1]; ++kw) {
              const T* row = cp + (nc * kk + kh * w.kernel[1] + kw) * L;
              const int64_t off_w = kw * w.dilation[1] - w.padding[1];
              const Valid cols_in = valid_outputs(off_w, w.stride[1], p.w, p.wo);
              for (int64_t oh = 0; oh < p.ho; ++oh) {
                const int64_t ih = oh * w.stride[0] - w.padding[0] + kh * w.dilation[0];
                if (ih < 0 || ih >= p.h) continue;
                M* line = acc + ih * p.w;
                const T* g = row + oh * p.wo;
                for (int64_t ow = cols_in.lo; ow < cols_in.hi; ++ow)
                  line[ow * w.stride[1] + off_w] += static_cast<M>(g[ow]);
              }
            }
        });
      }
    }
  });
  return x;
}

// ---- pooling ---------------------------------------------------------------------------

MaxPoolResult max_pool2d(const Tensor& x_in, const Window2d& w) {
  const Tensor x = raw::contiguous(x_in);
  const Planes p = planes_of(x.shape(), w);
  MaxPoolResult r{empty({p.n, p.c, p.ho, p.wo}, x.dtype()), empty({p.n, p.c, p.ho, p.wo}, DType::kI64)};
  if (r.y.numel() == 0) return r;
  dispatch_floating(x.dtype(), "max_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = opmath_t<T>;
    const T* xp = x.data<T>();
    T* yp = r.y.data<T>();
    int64_t* ip = r.indices.data<int64_t>();
#pragma omp parallel for schedule(static) if (x.numel() >= kParallelWork)
    for (int64_t nc = 0; nc < p.count(); ++nc) {
      const T* src = xp + nc * p.in_plane();
      // Padding is -inf that never wins: only taps inside the plane are compared. NaN wins (and stays).
      std::vector<M> best(static_cast<size_t>(p.out_plane()), -std::numeric_limits<M>::infinity());
      int64_t* idx = ip + nc * p.out_plane();
      std::fill(idx, idx + p.out_plane(), int64_t{-1});
      for_each_tap(p, w, [&](int64_t in, int64_t out) {
        const M v = static_cast<M>(src[in]);
        M& b = best[static_cast<size_t>(out)];
        if (std::isnan(b) && idx[out] >= 0) return;
        if (idx[out] < 0 || v > b || std::isnan(v)) {
          b = v;
          idx[out] = in;
        }
      });
      T* dst = yp + nc * p.out_plane();
      // A window whose every tap is padding (only possible with a dilation wider than the input) gives -inf, index -1.
      for (int64_t o = 0; o < p.out_plane(); ++o)
        dst[o] = idx[o] >= 0 ? src[idx[o]] : convert<T>(best[static_cast<size_t>(o)]);
    }
  });
  return r;
}

Tensor max_pool2d_backward(const Tensor& dy_in, const Tensor& indices_in, const Shape& input_shape, const Window2d&) {
  const Tensor dy = raw::contiguous(dy_in), indices = raw::contiguous(indices_in);
  Tensor dx = empty(input_shape, dy.dtype());  // (N, C, H, W)
  if (dx.numel() == 0) return dx;
  const int64_t count = input_shape[0] * input_shape[1], in_plane = input_shape[2] * input_shape[3];
  const int64_t out_plane = dy.size(2) * dy.size(3);
  dispatch_floating(dy.dtype(), "max_pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = opmath_t<T>;
    const T* gp = dy.data<T>();
    const int64_t* ip = indices.data<int64_t>();
    T* xp = dx.data<T>();
#pragma omp parallel if (dx.numel() >= kParallelWork)
    {
      std::vector<M> scratch;
#pragma omp for schedule(static)
      for (int64_t nc = 0; nc < count; ++nc) {
        const T* g = gp + nc * out_plane;
        const int64_t* idx = ip + nc * out_plane;
        accumulate_into(xp + nc * in_plane, in_plane, scratch, [&](M* acc) {
          for (int64_t o = 0; o < out_plane; ++o)
            if (idx[o] >= 0) acc[idx[o]] += static_cast<M>(g[o]);
        });
      }
    }
  });
  return dx;
}

Tensor avg_pool2d(const Tensor& x_in, const Window2d& w) {
  const Tensor x = raw::contiguous(x_in);
  const Planes p = planes_of(x.shape(), w);
  Tensor y = empty({p.n, p.c, p.ho, p.wo}, x.dtype());
  if (y.numel() == 0) return y;
  dispatch_floating(x.dtype(), "avg_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = opmath_t<T>;
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    const M divisor = static_cast<M>(w.kernel[0] * w.kernel[1]);  // count_include_pad: padding counts as zeros
#pragma omp parallel if (x.numel() >= kParallelWork)
    {
      std::vector<M> sums;
#pragma omp for schedule(static)
      for (int64_t nc = 0; nc < p.count(); ++nc) {
        const T* src = xp + nc * p.in_plane();
        sums.assign(static_cast<size_t>(p.out_plane()), M(0));
        for_each_tap(p, w, [&](int64_t in, int64_t out) { sums[static_cast<size_t>(out)] += static_cast<M>(src[in]); });
        T* dst = yp + nc * p.out_plane();
        for (int64_t o = 0; o < p.out_plane(); ++o) dst[o] = convert<T>(sums[static_cast<size_t>(o)] / divisor);
      }
    }
  });
  return y;
}

Tensor avg_pool2d_backward(const Tensor& dy_in, const Shape& input_shape, const Window2d& w) {
  const Tensor dy = raw::contiguous(dy_in);
  const Planes p = planes_of(input_shape, w);
  Tensor dx = empty(input_shape, dy.dtype());  // (N, C, H, W)
  if (dx.numel() == 0) return dx;
  dispatch_floating(dy.dtype(), "avg_pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = opmath_t<T>;
    const T* gp = dy.data<T>();
    T* xp = dx.data<T>();
    const M divisor = static_cast<M>(w.kernel[0] * w.kernel[1]);
#pragma omp parallel if (dx.numel() >= kParallelWork)
    {
      std::vector<M> scratch;
#pragma omp for schedule(static)
      for (int64_t nc = 0; nc < p.count(); ++nc) {
        const T* g = gp + nc * p.out_plane();
        accumulate_into(xp + nc * p.in_plane(), p.in_plane(), scratch, [&](M* acc) {
          for_each_tap(p, w, [&](int64_t in, int64_t out) { acc[in] += static_cast<M>(g[out]) / divisor; });
        });
      }
    }
  });
  return dx;
}

// ---- dropout -----------------------------------------------------------------------------

Tensor dropout_mask(const Shape& shape, double p, uint64_t seed, uint64_t offset, Device device) {
  Tensor mask = empty(shape, DType::kBool);
  bool* m = mask.data<bool>();
  const int64_t n = mask.numel();
  // One Philox counter per element (its first word): the mask of element i
  // depends on (seed, offset + i) only, never on the thread count or device.
#pragma omp parallel for schedule(static) if (n >= kParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    uint32_t words[4];
    philox4x32_10(seed, 0, offset + static_cast<uint64_t>(i), words);
    m[i] = static_cast<double>(uniform_float(words[0])) >= p;
  }
  return raw::to(mask, device);
}

// ---- indexing ----------------------------------------------------------------------------

Tensor index_select(const Tensor& x_in, int64_t dim, const Tensor& index) {
  const Tensor x = raw::contiguous(x_in);
  const std::vector<int64_t> idx = index_values(index);
  const int64_t k = static_cast<int64_t>(idx.size());
  Shape out_shape = x.shape();
  out_shape[dim] = k;
  Tensor out = empty(out_shape, x.dtype());
  if (out.numel() == 0) return out;
  const Around a = around(x.shape(), dim);
  const size_t row_bytes = static_cast<size_t>(a.inner) * x.itemsize();
  const char* src = static_cast<const char*>(x.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  // A selection moves bytes: any dtype, no rounding.
#pragma omp parallel for schedule(static) if (out.numel() >= kParallelWork)
  for (int64_t r = 0; r < a.outer * k; ++r) {
    const int64_t o = r / k, j = r % k;
    std::memcpy(dst + static_cast<size_t>(r) * row_bytes,
                src + static_cast<size_t>(o * a.size + idx[static_cast<size_t>(j)]) * row_bytes, row_bytes);
  }
  return out;
}

Tensor index_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src_in) {
  const Tensor src = raw::contiguous(src_in);
  const std::vector<int64_t> idx = index_values(index);
  const int64_t k = static_cast<int64_t>(idx.size());
  Tensor out = empty(shape, src.dtype());
  if (out.numel() == 0) return out;
  const Around a = around(shape, dim);
  dispatch_floating(src.dtype(), "index_add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = opmath_t<T>;
    const T* sp = src.data<T>();
    T* op = out.data<T>();
    // Outer slices are independent (a repeated index only repeats within one), so they run in parallel.
#pragma omp parallel if (out.numel() + src.numel() >= kParallelWork)
    {
      std::vector<M> scratch;
#pragma omp for schedule(static)
      for (int64_t o = 0; o < a.outer; ++o) {
        accumulate_into(op + o * a.size * a.inner, a.size * a.inner, scratch, [&](M* acc) {
          for (int64_t j = 0; j < k; ++j) {
            const T* s = sp + (o * k + j) * a.inner;
            M* d = acc + idx[static_cast<size_t>(j)] * a.inner;
            for (int64_t i = 0; i < a.inner; ++i) d[i] += static_cast<M>(s[i]);
          }
        });
      }
    }
  });
  return out;
}

}  // namespace mixtape::kernels::cpu
