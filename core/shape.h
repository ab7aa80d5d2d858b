// core/shape.h — Shape: a small fixed-capacity list of sizes or strides.
//
// Shapes and strides are built for every op the tape records, so they live
// inline (no heap allocation); kMaxDims bounds the rank, and exceeding it is
// a mixtape::Error, never an overflow.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <span>
#include <vector>

#include <mixtape/core/error.h>

namespace mixtape {

class Shape {
 public:
  static constexpr int kMaxDims = 8;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) { assign(dims.begin(), dims.size()); }
  explicit Shape(std::span<const int64_t> dims) { assign(dims.data(), dims.size()); }
  explicit Shape(const std::vector<int64_t>& dims) { assign(dims.data(), dims.size()); }
  /// `n` copies of `value`.
  static Shape filled(int64_t n, int64_t value) {
    Shape s;
    s.resize(n);
    for (int64_t i = 0; i < n; ++i) s.m_dims[i] = value;
    return s;
  }

  int64_t size() const { return m_size; }
  bool empty() const { return m_size == 0; }
  int64_t& operator[](int64_t i) { return m_dims[i]; }
  int64_t operator[](int64_t i) const { return m_dims[i]; }
  int64_t back() const { return m_dims[m_size - 1]; }
  int64_t* begin() { return m_dims; }
  int64_t* end() { return m_dims + m_size; }
  const int64_t* begin() const { return m_dims; }
  const int64_t* end() const { return m_dims + m_size; }
  const int64_t* data() const { return m_dims; }

  void resize(int64_t n) {
    MT_CHECK(n >= 0 && n <= kMaxDims, "Shape: rank ", n, " exceeds the maximum of ", kMaxDims, " dims");
    for (int64_t i = m_size; i < n; ++i) m_dims[i] = 0;
    m_size = static_cast<int>(n);
  }
  void push_back(int64_t v) {
    MT_CHECK(m_size < kMaxDims, "Shape: rank exceeds the maximum of ", kMaxDims, " dims");
    m_dims[m_size++] = v;
  }
  void insert(int64_t pos, int64_t v) {
    MT_CHECK(m_size < kMaxDims, "Shape: rank exceeds the maximum of ", kMaxDims, " dims");
    for (int64_t i = m_size; i > pos; --i) m_dims[i] = m_dims[i - 1];
    m_dims[pos] = v;
    ++m_size;
  }
  void erase(int64_t pos) {
    for (int64_t i = pos; i + 1 < m_size; ++i) m_dims[i] = m_dims[i + 1];
    --m_size;
  }

  /// Product of the sizes (1 for a scalar shape).
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < m_size; ++i) n *= m_dims[i];
    return n;
  }
  std::vector<int64_t> vec() const { return {begin(), end()}; }

  friend bool operator==(const Shape& a, const Shape& b) {
    if (a.m_size != b.m_size) return false;
    for (int i = 0; i < a.m_size; ++i)
      if (a.m_dims[i] != b.m_dims[i]) return false;
    return true;
  }

  friend std::ostream& operator<<(std::ostream& os, const Shape& s) {
    os << '[';
    for (int i = 0; i < s.m_size; ++i) os << (i ? ", " : "") << s.m_dims[i];
    return os << ']';
  }

 private:
  void assign(const int64_t* p, size_t n) {
    MT_CHECK(n <= static_cast<size_t>(kMaxDims), "Shape: rank ", n, " exceeds the maximum of ", kMaxDims, " dims");
    m_size = static_cast<int>(n);
    for (size_t i = 0; i < n; ++i) m_dims[i] = p[i];
  }

  int64_t m_dims[kMaxDims] = {};
  int m_size = 0;
};

/// The number of elements of `shape`, checked: a negative size or a product beyond int64 is an error naming `op`
/// and the shape (Shape::numel() trusts a shape that already backs a tensor).
inline int64_t checked_numel(const Shape& shape, const char* op) {
  int64_t n = 1, extent = 1;  // extent: the product of the dims but zeros, what contiguous_strides multiplies
  for (int64_t i = 0; i < shape.size(); ++i) {
    MT_CHECK(shape[i] >= 0, op, ": negative size ", shape[i], " at dim ", i, " (shape ", shape, ")");
    MT_CHECK(!__builtin_mul_overflow(n, shape[i], &n), op, ": shape ", shape,
             " has more elements than a 64-bit count holds");
    // An empty shape too: {0, 2^62, 4} holds nothing, but its strides would not fit in 64 bits.
    MT_CHECK(!__builtin_mul_overflow(extent, shape[i] > 1 ? shape[i] : 1, &extent), op, ": shape ", shape,
             " has dims whose product overflows the 64-bit strides");
  }
  return n;
}

/// Row-major (C-contiguous) strides for `shape`, in elements.
inline Shape contiguous_strides(const Shape& shape) {
  Shape strides = Shape::filled(shape.size(), 1);
  int64_t acc = 1;
  for (int64_t i = shape.size() - 1; i >= 0; --i) {
    strides[i] = acc;
    acc *= shape[i] > 1 ? shape[i] : 1;
  }
  return strides;
}

/// Wraps a possibly negative `dim` into [0, ndim); throws naming `op` and `shape` when out of range.
inline int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op, const Shape& shape) {
  int64_t lo = ndim == 0 ? -1 : -ndim, hi = ndim == 0 ? 0 : ndim - 1;
  MT_CHECK(dim >= lo && dim <= hi, op, ": dim ", dim, " is out of range for a tensor of ", ndim,
           " dims (shape ", shape, "); expected a dim in [", lo, ", ", hi, "]");
  return dim < 0 ? dim + (ndim == 0 ? 1 : ndim) : dim;
}

/// The shape two shapes broadcast to (NumPy rules); throws naming `op` when they do not.
inline Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  int64_t n = a.size() > b.size() ? a.size() : b.size();
  Shape out = Shape::filled(n, 1);
  for (int64_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    MT_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", a, " and ", b,
             " cannot be broadcast together (dim ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

}  // namespace mixtape
