// data/safetensors.cpp — reading and writing safetensors files (data/safetensors.h).
//
// The file: u64 header length N (little-endian), N bytes of JSON padded with spaces to a multiple of 8, then the
// data, each tensor's bytes at [begin, end) of it. The writer lays tensors out in StateDict order and writes the
// header as the reference implementation does (compact JSON, "__metadata__" first, fields dtype, shape,
// data_offsets); the reader trusts nothing in the file: every number it will index memory with is checked (in
// 64 bits, multiplications overflow-checked) before a tensor is allocated, and the byte ranges must tile the data
// exactly, as the format's spec requires. Tensors are read straight into their storage with pread, so loading
// costs one copy of the checkpoint in memory, not two. One parser serves a file and bytes in memory (the fuzz
// target's way in, fuzz/fuzz_safetensors.cpp): it asks its source for byte ranges it has already checked.
#include <mixtape/data/safetensors.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>
#include <span>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <mixtape/core/atomic_file.h>
#include <mixtape/core/error.h>
#include <mixtape/core/raw.h>
#include <mixtape/core/tensor.h>

// safetensors stores little-endian bytes, and both directions copy memory as it is.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace mixtape::data {

namespace {

using json = nlohmann::json;                  // the reader's: std::map objects, O(log n) lookups
using ordered_json = nlohmann::ordered_json;  // the writer's: keys in the order written

constexpr uint64_t kHeaderLengthBytes = 8;
constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's MAX_HEADER_SIZE
constexpr const char* kMetadataKey = "__metadata__";

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kDTypeNames[] = {{kF64, "F64"}, {kF32, "F32"}, {kF16, "F16"}, {kBF16, "BF16"},
                                     {kI64, "I64"}, {kI32, "I32"}, {kU8, "U8"},   {kBool, "BOOL"}};
static_assert(std::size(kDTypeNames) == kNumDTypes, "every mixtape dtype has a safetensors name");

const char* safetensors_name(DType t) {
  for (const auto& d : kDTypeNames)
    if (d.dtype == t) return d.name;
  MT_ERROR("safetensors: dtype ", t, " has no safetensors name");
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& d : kDTypeNames)
    if (name == d.name) return d.dtype;
  return std::nullopt;
}

std::string errno_text(int err) { return std::strerror(err); }

/// A JSON value for an error message, cut short when long.
std::string brief(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() <= 80 ? s : s.substr(0, 77) + "...";
}

/// Closes a file descriptor when the scope ends.
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

// ---- writing ------------------------------------------------------------------------------------------

/// Throws unless `s` is valid UTF-8 (JSON strings must be; nlohmann would throw mid-dump, naming no key).
void check_utf8(const std::string& who, const char* what, const std::string& s) {
  try {
    (void)json(s).dump();
  } catch (const json::type_error&) {
    MT_ERROR(who, ": the ", what, " ", json(s).dump(-1, ' ', false, json::error_handler_t::replace),
             " is not valid UTF-8");
  }
}

// ---- reading ------------------------------------------------------------------------------------------

/// Where a safetensors file's bytes come from: `size` of them, `read(out, n, offset, what)` copying exactly `n` at
/// `offset` (which the parser has checked lie inside) or throwing naming `what`.
/// The file: pread, straight into each tensor's storage.
struct FileBytes {
  const std::string& who;
  int fd;
  uint64_t size;

  void read(void* out, uint64_t n, uint64_t offset, const std::string& what) const {
    auto* p = static_cast<char*>(out);
    while (n > 0) {
      const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, uint64_t{1} << 30));
      const ssize_t k = ::pread(fd, p, chunk, static_cast<off_t>(offset));
      if (k < 0 && errno == EINTR) continue;
      MT_CHECK(k >= 0, who, ": reading ", what, " failed: ", errno_text(errno));
      MT_CHECK(k > 0, who, ": the file ended at byte ", offset, " while reading ", what,
               " (was it truncated while being read?)");
      p += k;
      n -= static_cast<uint64_t>(k);
      offset += static_cast<uint64_t>(k);
    }
  }
};

/// Bytes the caller holds in memory.
struct MemoryBytes {
  std::span<const uint8_t> bytes;
  uint64_t size;

  void read(void* out, uint64_t n, uint64_t offset, const std::string&) const {
    std::memcpy(out, bytes.data() + offset, static_cast<size_t>(n));
  }
};

/// A JSON number that is a non-negative integer (2.0 is not one), as u64.
std::optional<uint64_t> as_u64(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
  return std::nullopt;
}

/// One tensor of the header, checked against itself (not yet against the others).
struct Entry {
  std::string key;
  DType dtype;
  Shape shape;
  uint64_t begin, end;  // in the data, which starts after the header
};

Entry parse_entry(const std::string& who, const std::string& key, const json& value, uint64_t data_size) {
  const std::string what = who + ": tensor '" + key + "'";
  MT_CHECK(!key.empty(), who, ": a tensor has an empty name");
  MT_CHECK(value.is_object(), what, ": the entry is not an object but ", value.type_name(), " ", brief(value));
  auto field = [&](const char* name) -> const json& {
    auto it = value.find(name);
    MT_CHECK(it != value.end(), what, ": the entry has no \"", name, "\" (", brief(value), ")");
    return *it;
  };

  Entry e{key, kF32, {}, 0, 0};
  const json& dtype = field("dtype");
  MT_CHECK(dtype.is_string(), what, ": dtype ", brief(dtype), " is not a string");
  const std::optional<DType> t = dtype_from_name(dtype.get<std::string>());
  MT_CHECK(t.has_value(), what, ": unknown dtype ", brief(dtype),
           " (mixtape reads F64, F32, F16, BF16, I64, I32, U8, BOOL)");
  e.dtype = *t;

  // numel × itemsize in 64 bits, each product checked: a hostile shape must not wrap around to a small size.
  const json& shape = field("shape");
  MT_CHECK(shape.is_array(), what, ": shape ", brief(shape), " is not a list of non-negative integers");
  MT_CHECK(shape.size() <= static_cast<size_t>(Shape::kMaxDims), what, ": shape ", brief(shape), " has ",
           shape.size(), " dims, more than mixtape's ", Shape::kMaxDims);
  // extent: the product with each 0 taken as 1, which a tensor's strides are, so it must fit them too.
  constexpr uint64_t kMaxCount = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  uint64_t numel = 1, extent = 1;
  for (const json& d : shape) {
    const std::optional<uint64_t> size = as_u64(d);
    MT_CHECK(size.has_value(), what, ": shape ", brief(shape), " is not a list of non-negative integers");
    MT_CHECK(!__builtin_mul_overflow(numel, *size, &numel) && numel <= kMaxCount, what, ": shape ", brief(shape),
             " has more elements than 64 bits count");
    MT_CHECK(!__builtin_mul_overflow(extent, std::max<uint64_t>(*size, 1), &extent) && extent <= kMaxCount, what,
             ": shape ", brief(shape), " has no elements, but its other dims multiply past a tensor's 64-bit strides");
    e.shape.push_back(static_cast<int64_t>(*size));
  }
  uint64_t nbytes = 0;
  MT_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(itemsize(e.dtype)), &nbytes), what, ": shape ",
           brief(shape), " × ", itemsize(e.dtype), " bytes (", dtype.get<std::string>(), ") overflows 64 bits");

  const json& offsets = field("data_offsets");
  MT_CHECK(offsets.is_array() && offsets.size() == 2 && as_u64(offsets[0]) && as_u64(offsets[1]), what,
           ": data_offsets ", brief(offsets), " is not two non-negative integers [begin, end]");
  e.begin = *as_u64(offsets[0]);
  e.end = *as_u64(offsets[1]);
  MT_CHECK(e.begin <= e.end, what, ": data_offsets [", e.begin, ", ", e.end, "] begin after they end");
  MT_CHECK(e.end <= data_size, what, ": data_offsets [", e.begin, ", ", e.end, "] reach beyond the data, which holds ",
           data_size, " bytes");
  MT_CHECK(e.end - e.begin == nbytes, what, ": data_offsets [", e.begin, ", ", e.end, "] hold ", e.end - e.begin,
           " bytes, but shape ", brief(shape), " of ", dtype.get<std::string>(), " needs ", nbytes);
  return e;
}

std::map<std::string, std::string> parse_metadata(const std::string& who, const json& value) {
  std::map<std::string, std::string> out;
  if (value.is_null()) return out;  // what a writer given no metadata may put there
  MT_CHECK(value.is_object(), who, ": __metadata__ is not an object of strings but ", value.type_name(), " ",
           brief(value));
  for (const auto& [k, v] : value.items()) {
    MT_CHECK(v.is_string(), who, ": __metadata__ '", k, "' is not a string but ", v.type_name(), " ", brief(v));
    out.emplace(k, v.get<std::string>());
  }
  return out;
}

/// Parses the header, refusing a key that appears twice in one object (a std::map would keep one silently).
json parse_header(const std::string& who, const std::string& text) {
  std::vector<std::set<std::string>> open_objects;  // the keys seen in each object being parsed
  std::string top_key, duplicate;                   // the current top-level key; the first duplicate found
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      open_objects.pop_back();
    } else if (event == json::parse_event_t::key) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (depth == 1) top_key = key;
      if (!open_objects.back().insert(key).second && duplicate.empty())
        duplicate = depth == 1 ? "the key '" + key + "' appears twice in the header"
                               : "the entry '" + top_key + "' holds \"" + key + "\" twice";
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text, callback);
  } catch (const json::parse_error& e) {
    MT_ERROR(who, ": the header is not valid JSON: ", e.what());
  } catch (const json::exception& e) {  // valid JSON nlohmann cannot hold: a number beyond a double (1e400)
    MT_ERROR(who, ": the header cannot be parsed: ", e.what());
  }
  MT_CHECK(duplicate.empty(), who, ": ", duplicate);
  MT_CHECK(header.is_object(), who, ": the header is not a JSON object but ", header.type_name(), " ", brief(header));
  return header;
}

}  // namespace

void save_safetensors(const std::string& path, const StateDict& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const std::string who = "save_safetensors: '" + path + "'";

  // 1. Every check, and the header, before a file exists.
  ordered_json header = ordered_json::object();
  if (!metadata.empty()) {
    ordered_json m = ordered_json::object();
    for (const auto& [k, v] : metadata) {
      check_utf8(who, "metadata key", k);
      check_utf8(who, "metadata value", v);
      m[k] = v;
    }
    header[kMetadataKey] = std::move(m);
  }
  uint64_t offset = 0;
  for (const auto& [key, t] : tensors) {
    MT_CHECK(!key.empty(), who, ": a tensor has an empty name");
    MT_CHECK(key != kMetadataKey, who, ": '", key, "' cannot name a tensor (the header's metadata has that key)");
    MT_CHECK(t.defined(), who, ": tensor '", key, "' is undefined");
    check_utf8(who, "tensor name", key);
    ordered_json entry = ordered_json::object();
    entry["dtype"] = safetensors_name(t.dtype());
    entry["shape"] = t.shape().vec();
    entry["data_offsets"] = ordered_json::array({offset, offset + t.nbytes()});
    header[key] = std::move(entry);
    offset += t.nbytes();
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');  // the reference pads to 8 bytes, so the data starts aligned
  uint8_t length[kHeaderLengthBytes];
  const uint64_t n = text.size();
  std::memcpy(length, &n, sizeof n);  // little-endian (static_assert above)

  // 2. The temporary file: header, then each tensor copied to the host in turn (one host copy alive at a time).
  AtomicFile tmp(who, path);
  tmp.write(length, sizeof length);
  tmp.write(text.data(), text.size());
  for (const auto& [key, t] : tensors) {
    const Tensor host = raw::contiguous(raw::to(t, Device::cpu()));
    if (host.nbytes() != 0) tmp.write(host.data_ptr(), host.nbytes());
  }

  // 3. Durable, then visible: fsync, rename over `path`, fsync the directory.
  tmp.commit();
}

namespace {

/// The whole reader, over the bytes of a file or of memory: header, validation, then the tensors.
template <class Bytes>
SafetensorsFile parse(const std::string& who, const Bytes& in) {
  const uint64_t file_size = in.size;

  // 1. The header length, then the header.
  MT_CHECK(file_size >= kHeaderLengthBytes, who, ": the file holds ", file_size,
           " bytes, fewer than the 8 of the header length");
  uint8_t length_bytes[kHeaderLengthBytes];
  in.read(length_bytes, sizeof length_bytes, 0, "the header length");
  uint64_t header_size = 0;
  std::memcpy(&header_size, length_bytes, sizeof header_size);  // little-endian (static_assert above)
  MT_CHECK(header_size <= kMaxHeaderBytes, who, ": the header length ", header_size,
           " is absurd (over 100 MB; not a safetensors file?)");
  MT_CHECK(header_size <= file_size - kHeaderLengthBytes, who, ": the header length ", header_size,
           " reaches beyond the end of the file (", file_size, " bytes)");
  std::string text(header_size, '\0');
  in.read(text.data(), header_size, kHeaderLengthBytes, "the header");
  const json header = parse_header(who, text);

  // 2. Each entry by itself, then all of them together: sorted by position, they must tile the data exactly.
  const uint64_t data_start = kHeaderLengthBytes + header_size;
  const uint64_t data_size = file_size - data_start;
  SafetensorsFile out;
  std::vector<Entry> entries;
  entries.reserve(header.size());
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey)
      out.metadata = parse_metadata(who, value);
    else
      entries.push_back(parse_entry(who, key, value, data_size));
  }
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;  // the data [0, covered) belongs to the entries so far
  const Entry* last = nullptr;
  for (const Entry& e : entries) {
    MT_CHECK(e.begin >= covered, who, ": tensors '", last->key, "' [", last->begin, ", ", last->end, ") and '",
             e.key, "' [", e.begin, ", ", e.end, ") overlap");
    MT_CHECK(e.begin == covered, who, ": the data bytes [", covered, ", ", e.begin,
             ") belong to no tensor (a gap before '", e.key, "')");
    covered = e.end;
    last = &e;
  }
  MT_CHECK(covered == data_size, who, ": ", data_size - covered,
           " trailing bytes after the last tensor (the tensors end at ", data_start + covered, ", the file at ",
           file_size, ")");

  // 3. The bytes, straight into each tensor's storage.
  for (const Entry& e : entries) {
    Tensor t = empty(e.shape, TensorOptions(e.dtype));
    const std::string what = "tensor '" + e.key + "'";
    if (e.end > e.begin) in.read(t.data_ptr(), e.end - e.begin, data_start + e.begin, what);
    if (e.dtype == kBool) {  // a bool holding another byte is undefined behaviour in C++
      const auto* bytes = static_cast<const uint8_t*>(t.data_ptr());
      for (uint64_t i = 0; i < e.end - e.begin; ++i)
        MT_CHECK(bytes[i] <= 1, who, ": ", what, ": BOOL element ", i, " is the byte ", static_cast<int>(bytes[i]),
                 ", not 0 or 1");
    }
    out.tensors.insert(e.key, std::move(t));
  }
  return out;
}

}  // namespace

SafetensorsFile load_safetensors(const std::string& path) {
  const std::string who = "load_safetensors: '" + path + "'";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MT_CHECK(fd >= 0, who, ": cannot open the file: ", errno_text(errno));
  FdCloser closer{fd};
  struct stat st {};
  MT_CHECK(::fstat(fd, &st) == 0, who, ": fstat failed: ", errno_text(errno));
  MT_CHECK(S_ISREG(st.st_mode), who, ": not a regular file");
  return parse(who, FileBytes{who, fd, static_cast<uint64_t>(st.st_size)});
}

SafetensorsFile parse_safetensors(std::span<const uint8_t> bytes, const std::string& what) {
  return parse("parse_safetensors: '" + what + "'", MemoryBytes{bytes, bytes.size()});
}

}  // namespace mixtape::data
