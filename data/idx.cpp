// data/idx.cpp — the IDX reader: the file's bytes (gunzipped with zlib when they start 1f 8b), then a header
// checked field by field against those bytes, then one conversion from big-endian into a CPU tensor.
//
// Decompression uses zlib's inflate directly rather than gzread: gzread stops quietly at a truncated stream and
// skips trailing garbage, and both must be errors here (a half-downloaded file must not become a smaller
// dataset).
#include <mixtape/data/idx.h>

#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include <mixtape/core/error.h>

namespace mixtape::data {

namespace {

std::string hex(uint32_t v, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*x", digits, v);
  return buf;
}

std::vector<uint8_t> read_file(const std::string& path) {
  std::error_code ec;
  MT_CHECK(!std::filesystem::is_directory(path, ec), "read_idx: '", path, "' is a directory, not a file");
  errno = 0;
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  MT_CHECK(f != nullptr, "read_idx: cannot open '", path, "' (", std::strerror(errno), ")");
  std::vector<uint8_t> bytes;
  uint8_t buf[1 << 16];
  for (;;) {
    size_t n = std::fread(buf, 1, sizeof buf, f.get());
    bytes.insert(bytes.end(), buf, buf + n);
    if (n < sizeof buf) {
      MT_CHECK(!std::ferror(f.get()), "read_idx: error reading '", path, "' (", std::strerror(errno), ")");
      break;
    }
  }
  return bytes;
}

bool is_gzip(const std::vector<uint8_t>& b, size_t at = 0) {
  return b.size() >= at + 2 && b[at] == 0x1f && b[at + 1] == 0x8b;
}

// Inflates every gzip member of `in`. A stream that ends early, fails its CRC/length check or is followed by
// anything but another member is an error.
std::vector<uint8_t> gunzip(const std::vector<uint8_t>& in, const std::string& path) {
  z_stream s{};
  MT_CHECK(inflateInit2(&s, 16 + MAX_WBITS) == Z_OK, "read_idx: zlib could not start inflating '", path, "'");
  std::unique_ptr<z_stream, int (*)(z_stream*)> guard(&s, &inflateEnd);

  // The last 4 bytes hold the last member's length mod 2^32: a good first guess for the output size, but only a
  // guess, since a truncated or corrupt file has anything there. Capped at what deflate can make of these bytes
  // (1032 out for each byte in, its largest ratio): a 30-byte file must not cost a gigabyte before it fails.
  size_t guess = in.size() >= 4 ? (size_t{in[in.size() - 4]} | size_t{in[in.size() - 3]} << 8 |
                                   size_t{in[in.size() - 2]} << 16 | size_t{in[in.size() - 1]} << 24)
                                : 0;
  const size_t most = std::min<size_t>(in.size() * 1032, size_t{1} << 30);
  std::vector<uint8_t> out(std::clamp<size_t>(guess, std::min<size_t>(1 << 16, most), most));
  size_t produced = 0, fed = 0;
  for (;;) {
    if (s.avail_in == 0 && fed < in.size()) {
      size_t n = std::min<size_t>(in.size() - fed, UINT_MAX);
      s.next_in = const_cast<Bytef*>(in.data() + fed);
      s.avail_in = static_cast<uInt>(n);
      fed += n;
    }
    if (produced == out.size()) out.resize(out.size() * 2);
    uInt room = static_cast<uInt>(std::min<size_t>(out.size() - produced, UINT_MAX));
    s.next_out = out.data() + produced;
    s.avail_out = room;
    int ret = inflate(&s, Z_NO_FLUSH);
    produced += room - s.avail_out;
    if (ret == Z_STREAM_END) {
      size_t rest = s.avail_in + (in.size() - fed);
      if (rest == 0) break;
      size_t at = in.size() - rest;
      MT_CHECK(is_gzip(in, at), "read_idx: '", path, "' has ", rest, " bytes of trailing data after the gzip stream ",
               "(at byte ", at, " of ", in.size(), ")");
      MT_CHECK(inflateReset(&s) == Z_OK, "read_idx: zlib could not reset while inflating '", path, "'");
    } else if (ret == Z_BUF_ERROR) {
      // No progress possible: with every input byte consumed, the stream stopped before its end.
      MT_CHECK(!(s.avail_in == 0 && fed == in.size()), "read_idx: '", path, "' is a truncated gzip stream (",
               in.size(), " bytes end before the gzip end marker, after ", produced, " decompressed bytes)");
    } else if (ret == Z_MEM_ERROR) {
      MT_ERROR("read_idx: out of memory inflating '", path, "'");
    } else if (ret != Z_OK) {
      MT_ERROR("read_idx: '", path, "' is a corrupt gzip stream (zlib: ", s.msg ? s.msg : "error " + std::to_string(ret),
               ", after ", produced, " decompressed bytes)");
    }
  }
  out.resize(produced);
  return out;
}

uint32_t load_be32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | uint32_t{p[3]};
}

template <class U>
U load_be(const uint8_t* p) {
  U v;
  std::memcpy(&v, p, sizeof v);
  if constexpr (std::endian::native == std::endian::little) {
    if constexpr (sizeof(U) == 2) v = __builtin_bswap16(v);
    if constexpr (sizeof(U) == 4) v = __builtin_bswap32(v);
    if constexpr (sizeof(U) == 8) v = __builtin_bswap64(v);
  }
  return v;
}

struct IdxType {
  const char* name;
  size_t bytes;  // per element in the file
  DType dtype;   // in the tensor
};

bool idx_type(uint8_t code, IdxType& t) {
  switch (code) {
    case 0x08: t = {"u8", 1, DType::kU8}; return true;
    case 0x09: t = {"i8", 1, DType::kI32}; return true;
    case 0x0B: t = {"i16", 2, DType::kI32}; return true;
    case 0x0C: t = {"i32", 4, DType::kI32}; return true;
    case 0x0D: t = {"f32", 4, DType::kF32}; return true;
    case 0x0E: t = {"f64", 8, DType::kF64}; return true;
    default: return false;
  }
}

}  // namespace

std::vector<uint8_t> maybe_gunzip(std::vector<uint8_t> bytes, const std::string& what) {
  if (!is_gzip(bytes)) return bytes;  // moved out, not copied
  return gunzip(bytes, what);
}

std::vector<uint8_t> read_maybe_gzip(const std::string& path) { return maybe_gunzip(read_file(path), path); }

Tensor parse_idx(const std::vector<uint8_t>& b, const std::string& what) {
  const size_t n = b.size();
  MT_CHECK(n >= 4, "read_idx: '", what, "' is ", n, " bytes, too short for the 4-byte IDX magic number");
  const uint32_t magic = load_be32(b.data());
  MT_CHECK(b[0] == 0 && b[1] == 0, "read_idx: '", what, "' is not an IDX file (magic number ", hex(magic, 8),
           "; IDX starts with two zero bytes, then the type code and the rank)");
  IdxType type;
  MT_CHECK(idx_type(b[2], type), "read_idx: '", what, "' has an unknown element type code ", hex(b[2], 2),
           " (magic number ", hex(magic, 8), "; IDX knows 0x08 u8, 0x09 i8, 0x0b i16, 0x0c i32, 0x0d f32, 0x0e f64)");
  const int rank = b[3];
  MT_CHECK(rank >= 1 && rank <= Shape::kMaxDims, "read_idx: '", what, "' declares ", rank, " dims (magic number ",
           hex(magic, 8), "); a tensor has 1 to ", Shape::kMaxDims);
  const size_t header = 4 + 4 * static_cast<size_t>(rank);
  MT_CHECK(n >= header, "read_idx: '", what, "' is truncated: ", n, " bytes, but a header of ", rank, " dims is ",
           header, " bytes");

  std::vector<int64_t> dims(rank);
  for (int d = 0; d < rank; ++d) dims[d] = load_be32(b.data() + 4 + 4 * d);
  const Shape shape(dims);
  // The data size, overflow-checked: a corrupt header must not wrap round to a size that happens to match.
  uint64_t count = 1, data_bytes = 0, total = 0;
  bool overflow = false;
  for (int64_t d : dims) overflow |= __builtin_mul_overflow(count, static_cast<uint64_t>(d), &count);
  overflow |= __builtin_mul_overflow(count, static_cast<uint64_t>(type.bytes), &data_bytes);
  overflow |= __builtin_add_overflow(data_bytes, static_cast<uint64_t>(header), &total);
  overflow |= count > static_cast<uint64_t>(INT64_MAX);
  MT_CHECK(!overflow, "read_idx: '", what, "' has absurd dims ", shape, " (", type.name,
           "): their byte count overflows 64 bits");
  // With a 0 among them the count is 0, but the tensor's strides are still the products of the other dims.
  uint64_t extent = 1;
  for (int64_t d : dims) overflow |= __builtin_mul_overflow(extent, static_cast<uint64_t>(std::max<int64_t>(d, 1)),
                                                            &extent);
  MT_CHECK(!overflow && extent <= static_cast<uint64_t>(INT64_MAX), "read_idx: '", what, "' has absurd dims ", shape,
           ": no elements, but the other dims multiply past the 64-bit strides of a tensor");
  MT_CHECK(n >= total, "read_idx: '", what, "' is truncated: dims ", shape, " of ", type.name, " need ", data_bytes,
           " data bytes after the ", header, "-byte header, the file has ", n - header, " (", total - n, " short)");
  MT_CHECK(n == total, "read_idx: '", what, "' has ", n - total, " trailing bytes after the data of dims ", shape,
           " (", type.name, "; ", total, " bytes expected, the file has ", n, ")");

  Tensor out = empty(shape, TensorOptions(type.dtype));
  const uint8_t* src = b.data() + header;
  const size_t numel = static_cast<size_t>(count);
  if (numel == 0) return out;
  switch (b[2]) {
    case 0x08: std::memcpy(out.data<uint8_t>(), src, numel); break;
    case 0x09: {
      int32_t* dst = out.data<int32_t>();
      for (size_t i = 0; i < numel; ++i) dst[i] = static_cast<int8_t>(src[i]);
      break;
    }
    case 0x0B: {
      int32_t* dst = out.data<int32_t>();
      for (size_t i = 0; i < numel; ++i) dst[i] = static_cast<int16_t>(load_be<uint16_t>(src + 2 * i));
      break;
    }
    case 0x0C: {
      int32_t* dst = out.data<int32_t>();
      for (size_t i = 0; i < numel; ++i) dst[i] = static_cast<int32_t>(load_be<uint32_t>(src + 4 * i));
      break;
    }
    case 0x0D: {
      float* dst = out.data<float>();
      for (size_t i = 0; i < numel; ++i) dst[i] = std::bit_cast<float>(load_be<uint32_t>(src + 4 * i));
      break;
    }
    case 0x0E: {
      double* dst = out.data<double>();
      for (size_t i = 0; i < numel; ++i) dst[i] = std::bit_cast<double>(load_be<uint64_t>(src + 8 * i));
      break;
    }
  }
  return out;
}

Tensor read_idx(const std::string& path) { return parse_idx(read_maybe_gzip(path), path); }

}  // namespace mixtape::data
