// tests/test_safetensors.cpp — checkpoints as safetensors files (data/safetensors.h): bit-exact round trips of
// every dtype, files written byte by byte as the reference implementation (Python's `safetensors`) writes them,
// every validation error on corrupt files, and the crash safety of saving (the old file survives a failed save,
// no temporary file is left behind).
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include <mixtape/core/atomic_file.h>
#include <mixtape/core/half.h>
#include <mixtape/core/state_dict.h>
#include <mixtape/core/tensor.h>
#include <mixtape/data/safetensors.h>

#include "compare.h"
#include "test_util.h"

namespace mt = mixtape;
namespace fs = std::filesystem;
using mt::DType;
using mt::Shape;
using mt::StateDict;
using mt::Tensor;
using mt::data::load_safetensors;
using mt::data::save_safetensors;
using mt::test::expect_error;
using mt::test::expect_same_bits;

namespace {

/// A scratch directory of this suite.
struct TempDir : mt::test::TempDir {
  TempDir() : mt::test::TempDir("mixtape_safetensors_") {}
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  BOOST_REQUIRE_MESSAGE(in, "cannot open " << path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  BOOST_REQUIRE_MESSAGE(out, "cannot write " << path);
}

/// n as 8 little-endian bytes.
std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

/// A file as the format has it: the header length, the header (padded with spaces to 8 bytes, as the reference
/// writes it), the data.
std::string safetensors_bytes(std::string header, const std::string& data) {
  header.resize((header.size() + 7) / 8 * 8, ' ');
  return le64(header.size()) + header + data;
}

/// A tensor of `dtype` and `shape` holding exactly these bit patterns (row-major).
template <class Bits>
Tensor from_bits(const std::vector<Bits>& bits, const Shape& shape, DType dtype) {
  BOOST_REQUIRE_EQUAL(sizeof(Bits), mt::itemsize(dtype));
  BOOST_REQUIRE_EQUAL(static_cast<int64_t>(bits.size()), shape.numel());
  Tensor t = mt::empty(shape, dtype);
  if (!bits.empty()) std::memcpy(t.data_ptr(), bits.data(), bits.size() * sizeof(Bits));
  return t;
}

/// One tensor of each dtype, holding the bit patterns a conversion would lose: NaN payloads (quiet and
/// signalling), -0, infinities, subnormals, the extremes of the integers.
StateDict every_dtype() {
  StateDict sd;
  sd.insert("f64", from_bits<uint64_t>({0x7ff8000000000001, 0x7ff4000000000000, 0x8000000000000000,
                                        0xfff0000000000000, 0x0000000000000001, 0x3ff8000000000000},
                                       {2, 3}, mt::kF64));
  sd.insert("f32", from_bits<uint32_t>({0x7fc00001, 0xffc12345, 0x7fa00000, 0x80000000, 0x00000001, 0x7f800000},
                                       {3, 2}, mt::kF32));
  sd.insert("f16", from_bits<uint16_t>({0x7e01, 0x7d00, 0xfc00, 0x8000, 0x0001, 0x7bff}, {6}, mt::kF16));
  sd.insert("bf16", from_bits<uint16_t>({0x7fc1, 0xff81, 0x7f81, 0x8000, 0x0001, 0x7f7f}, {1, 6}, mt::kBF16));
  sd.insert("i64", from_bits<int64_t>({std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), -1,
                                       0, 1, 42},
                                      {6, 1}, mt::kI64));
  sd.insert("i32", from_bits<int32_t>({std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(), -1,
                                       0, 7, -7},
                                      {2, 3}, mt::kI32));
  sd.insert("u8", from_bits<uint8_t>({0, 1, 127, 128, 254, 255}, {2, 1, 3}, mt::kU8));
  sd.insert("bool", from_bits<uint8_t>({0, 1, 1, 0, 0, 1}, {3, 2}, mt::kBool));
  return sd;
}

void expect_same_dict(const StateDict& got, const StateDict& want, const std::string& what) {
  BOOST_TEST(got.keys() == want.keys(), what << ": keys (in order)");
  for (const auto& [key, t] : want) {
    if (!got.contains(key)) continue;
    const Tensor& g = got.at(key);
    BOOST_TEST(g.device().is_cpu(), what << ": " << key << " on the CPU");
    BOOST_TEST(g.is_contiguous(), what << ": " << key << " contiguous");
    expect_same_bits(g, t, what + ": " + key);
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(safetensors)

// ---- round trips -----------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(every_dtype_round_trips_bit_exact, MT_CPU_TEST) {
  TempDir dir;
  const std::string path = dir.file("all.safetensors");
  const StateDict sd = every_dtype();
  save_safetensors(path, sd);
  const auto file = load_safetensors(path);
  expect_same_dict(file.tensors, sd, "every dtype");
  BOOST_TEST(file.metadata.empty());
  // The header names each dtype as the format does, and is padded to 8 bytes.
  const std::string bytes = read_bytes(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  BOOST_TEST(n % 8 == 0);
  const std::string header = bytes.substr(8, n);
  for (const char* name : {"\"F64\"", "\"F32\"", "\"F16\"", "\"BF16\"", "\"I64\"", "\"I32\"", "\"U8\"", "\"BOOL\""})
    BOOST_TEST(header.find(name) != std::string::npos, name << " in " << header);
  BOOST_TEST(header.find("__metadata__") == std::string::npos, "no metadata given, none written: " << header);
  BOOST_TEST(dir.entries() == std::vector<std::string>{"all.safetensors"}, "no temporary file left");
}

BOOST_AUTO_TEST_CASE(zero_dim_and_empty_tensors, MT_CPU_TEST) {
  TempDir dir;
  const std::string path = dir.file("shapes.safetensors");
  StateDict sd;
  sd.insert("scalar", mt::scalar_tensor(-3.25));
  sd.insert("empty", mt::empty({0}, mt::kF32));
  sd.insert("empty_mid", mt::empty({2, 0, 3}, mt::kI64));
  sd.insert("step", mt::scalar_tensor(12, mt::kI64));
  sd.insert("empty_bf16", mt::empty({0, 4}, mt::kBF16));
  sd.insert("last", mt::tensor({1.f, 2.f}));
  save_safetensors(path, sd);
  const auto file = load_safetensors(path);
  expect_same_dict(file.tensors, sd, "0-d and empty");
  BOOST_TEST(file.tensors.at("scalar").dim() == 0);
  BOOST_TEST(file.tensors.at("scalar").item<double>() == -3.25);
  BOOST_TEST(file.tensors.at("step").item<int64_t>() == 12);
  BOOST_TEST((file.tensors.at("empty_mid").shape() == Shape{2, 0, 3}));
  BOOST_TEST(read_bytes(path).find("\"shape\":[]") != std::string::npos);

  // A file of no tensors at all: "{}" and nothing else.
  save_safetensors(dir.file("none.safetensors"), StateDict{});
  BOOST_TEST(read_bytes(dir.file("none.safetensors")) == le64(8) + "{}      ");
  BOOST_TEST(load_safetensors(dir.file("none.safetensors")).tensors.empty());
}

BOOST_AUTO_TEST_CASE(non_contiguous_tensors_are_written_in_row_major_order, MT_CPU_TEST) {
  TempDir dir;
  const std::string path = dir.file("views.safetensors");
  const Tensor base = mt::arange(0.0, 12.0, 1.0, mt::kF32).reshape({3, 4});
  StateDict sd;
  sd.insert("transposed", base.t());                       // (4, 3), strides (1, 4)
  sd.insert("stepped", base.slice(1, 0, 4, 2));            // (3, 2), strides (4, 2)
  sd.insert("expanded", mt::tensor({5, 6}).unsqueeze(1).expand({2, 3}));  // stride 0
  sd.insert("offset", base.select(0, 2));                  // a view at offset 8
  for (const auto& [key, t] : sd) BOOST_REQUIRE(key == "offset" || !t.is_contiguous());
  save_safetensors(path, sd);
  const auto file = load_safetensors(path);
  expect_same_dict(file.tensors, sd, "views");
  BOOST_TEST(file.tensors.at("transposed").to_vector<float>() ==
             (std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  BOOST_TEST(file.tensors.at("expanded").to_vector<int32_t>() == (std::vector<int32_t>{5, 5, 5, 6, 6, 6}));
}

BOOST_AUTO_TEST_CASE(metadata_round_trips, MT_CPU_TEST) {
  TempDir dir;
  const std::string path = dir.file("meta.safetensors");
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"step", "1000"}, {"empty", ""}, {"quote \"and\" \\ slash", "line\nbreak\ttab"},
      {"unicode", "\xce\xbb=0.9 \xe2\x9c\x93"}};
  StateDict sd;
  sd.insert("w", mt::tensor({1.f, 2.f, 3.f}));
  save_safetensors(path, sd, metadata);
  const auto file = load_safetensors(path);
  BOOST_TEST((file.metadata == metadata));
  expect_same_dict(file.tensors, sd, "with metadata");
  // "__metadata__" comes first in the header, as the reference writes it.
  BOOST_TEST(read_bytes(path).substr(8, 17) == "{\"__metadata__\":{");
}

BOOST_AUTO_TEST_CASE(saving_over_a_file_replaces_it, MT_CPU_TEST) {
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  StateDict first, second;
  first.insert("a", mt::tensor({1.f, 2.f}));
  second.insert("b", mt::tensor({int64_t{3}}));
  save_safetensors(path, first);
  save_safetensors(path, second, {{"step", "2"}});
  const auto file = load_safetensors(path);
  expect_same_dict(file.tensors, second, "second save");
  BOOST_TEST(file.metadata.at("step") == "2");
  BOOST_TEST(dir.entries() == std::vector<std::string>{"ckpt.safetensors"});
}

// ---- byte-exact golden files: what Python's safetensors writes -------------------------------------------

// torch: save_file({"a": tensor([1., -2.]), "b": tensor(7), "c": tensor([[1.5], [-0.]], dtype=bfloat16)},
// path, metadata={"format": "pt"}). The reference orders tensors by descending dtype alignment, then by name
// (b: I64, a: F32, c: BF16), writes compact JSON with "__metadata__" first, and pads the header with spaces to
// a multiple of 8: 196 bytes of JSON + 4 spaces = 200 = 0xc8.
BOOST_AUTO_TEST_CASE(loads_a_file_written_by_the_reference_layout, MT_CPU_TEST) {
  TempDir dir;
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
      R"("c":{"dtype":"BF16","shape":[2,1],"data_offsets":[16,20]}})";
  BOOST_REQUIRE_EQUAL(header.size(), 196u);
  const std::string file_bytes = std::string("\xc8\0\0\0\0\0\0\0", 8) + header + "    " +
                                 std::string("\x07\0\0\0\0\0\0\0", 8) +            // b = 7
                                 std::string("\0\0\x80\x3f" "\0\0\0\xc0", 8) +     // a = 1.0, -2.0
                                 std::string("\xc0\x3f" "\x00\x80", 4);            // c = 1.5, -0.0 (bf16)
  BOOST_REQUIRE_EQUAL(file_bytes.size(), 8u + 200u + 20u);
  const std::string path = dir.file("golden.safetensors");
  write_bytes(path, file_bytes);

  const auto file = load_safetensors(path);
  BOOST_TEST(file.tensors.keys() == (std::vector<std::string>{"b", "a", "c"}), "in the order of their bytes");
  BOOST_TEST((file.metadata == std::map<std::string, std::string>{{"format", "pt"}}));
  expect_same_bits(file.tensors.at("b"), from_bits<int64_t>({7}, {}, mt::kI64), "b");
  expect_same_bits(file.tensors.at("a"), from_bits<uint32_t>({0x3f800000, 0xc0000000}, {2}, mt::kF32), "a");
  expect_same_bits(file.tensors.at("c"), from_bits<uint16_t>({0x3fc0, 0x8000}, {2, 1}, mt::kBF16), "c");

  // The header may list its tensors in another order than their bytes (neither by name nor as written): the bytes'
  // order still. 107 bytes of JSON + 5 spaces = 112 = 0x70.
  const std::string swapped = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
                              R"("b":{"dtype":"I64","shape":[],"data_offsets":[0,8]}})";
  BOOST_REQUIRE_EQUAL(swapped.size(), 107u);
  write_bytes(path, std::string("\x70\0\0\0\0\0\0\0", 8) + swapped + "     " + std::string("\x07\0\0\0\0\0\0\0", 8) +
                        std::string("\0\0\x80\x3f" "\0\0\0\xc0", 8));
  const auto reordered = load_safetensors(path);
  BOOST_TEST(reordered.tensors.keys() == (std::vector<std::string>{"b", "a"}), "in the order of their bytes");
  expect_same_bits(reordered.tensors.at("a"), from_bits<uint32_t>({0x3f800000, 0xc0000000}, {2}, mt::kF32), "a");
}

// mixtape writes tensors in StateDict order (the format allows any order) with the reference's header layout:
// 138 bytes of JSON + 6 spaces = 144 = 0x90.
BOOST_AUTO_TEST_CASE(writes_the_reference_layout_byte_for_byte, MT_CPU_TEST) {
  TempDir dir;
  const std::string path = dir.file("out.safetensors");
  StateDict sd;
  sd.insert("a", from_bits<uint32_t>({0x3f800000, 0xc0000000}, {2}, mt::kF32));
  sd.insert("b", from_bits<int64_t>({7}, {}, mt::kI64));
  save_safetensors(path, sd, {{"format", "pt"}});
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"I64","shape":[],"data_offsets":[8,16]}})";
  BOOST_REQUIRE_EQUAL(header.size(), 138u);
  const std::string expected = std::string("\x90\0\0\0\0\0\0\0", 8) + header + "      " +
                               std::string("\0\0\x80\x3f" "\0\0\0\xc0", 8) + std::string("\x07\0\0\0\0\0\0\0", 8);
  BOOST_TEST(read_bytes(path) == expected);
}

// ---- validation: every corrupt file is an error naming the file, the key and what is wrong ----------------

namespace {

/// Writes `bytes` to a file and expects loading it to fail with a message containing the file's path and `parts`.
void expect_load_error(const TempDir& dir, const std::string& bytes, std::vector<std::string> parts) {
  const std::string path = dir.file("corrupt.safetensors");
  write_bytes(path, bytes);
  parts.push_back(path);
  parts.push_back("load_safetensors");
  expect_error([&] { load_safetensors(path); }, parts);
}

/// A header of one F32 tensor "w" with `shape` and `offsets` (JSON text), and `data_size` bytes of data.
std::string one_tensor(const std::string& dtype, const std::string& shape, const std::string& offsets,
                       size_t data_size) {
  return safetensors_bytes(R"({"w":{"dtype":)" + dtype + R"(,"shape":)" + shape + R"(,"data_offsets":)" + offsets +
                               "}}",
                           std::string(data_size, '\0'));
}

}  // namespace

BOOST_AUTO_TEST_CASE(errors_in_the_header_length, MT_CPU_TEST) {
  TempDir dir;
  expect_load_error(dir, "", {"holds 0 bytes, fewer than the 8"});
  expect_load_error(dir, std::string("\x10\0\0\0\0", 5), {"holds 5 bytes, fewer than the 8"});
  expect_load_error(dir, le64(100) + "{}", {"header length 100 reaches beyond the end of the file (10 bytes)"});
  expect_load_error(dir, le64(200'000'000) + "{}", {"header length 200000000 is absurd"});
  expect_load_error(dir, le64(~uint64_t{0}) + "{}", {"is absurd"});
  expect_error([&] { load_safetensors(dir.file("missing.safetensors")); },
               {dir.file("missing.safetensors"), "cannot open", "No such file or directory"});
  expect_error([&] { load_safetensors(dir.path.string()); }, {dir.path.string(), "not a regular file"});
}

BOOST_AUTO_TEST_CASE(errors_in_the_json, MT_CPU_TEST) {
  TempDir dir;
  expect_load_error(dir, le64(0), {"the header is not valid JSON"});
  expect_load_error(dir, safetensors_bytes(R"({"w": {"dtype": "F32",)", ""), {"the header is not valid JSON"});
  expect_load_error(dir, safetensors_bytes("{\"w\xff\": {}}", ""), {"the header is not valid JSON"});
  expect_load_error(dir, safetensors_bytes("[1, 2]", ""), {"the header is not a JSON object but array [1,2]"});
  expect_load_error(dir, safetensors_bytes("\"text\"", ""), {"not a JSON object but string"});
  expect_load_error(dir,
                    safetensors_bytes(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                                      R"("w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                                      "ab"),
                    {"the key 'w' appears twice in the header"});
  expect_load_error(dir,
                    safetensors_bytes(R"({"w":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "a"),
                    {"the entry 'w' holds \"dtype\" twice"});
  expect_load_error(dir, safetensors_bytes(R"({"w": 5})", ""),
                    {"tensor 'w'", "the entry is not an object but number 5"});
  expect_load_error(dir, safetensors_bytes(R"({"w":{"shape":[1],"data_offsets":[0,1]}})", "a"),
                    {"tensor 'w'", "the entry has no \"dtype\""});
  expect_load_error(dir, safetensors_bytes(R"({"w":{"dtype":"U8","data_offsets":[0,1]}})", "a"),
                    {"tensor 'w'", "has no \"shape\""});
  expect_load_error(dir, safetensors_bytes(R"({"w":{"dtype":"U8","shape":[1]}})", "a"),
                    {"tensor 'w'", "has no \"data_offsets\""});
  expect_load_error(dir, safetensors_bytes(R"({"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "a"),
                    {"a tensor has an empty name"});
}

BOOST_AUTO_TEST_CASE(errors_in_dtype_and_shape, MT_CPU_TEST) {
  TempDir dir;
  expect_load_error(dir, one_tensor(R"("F8_E4M3")", "[1]", "[0,1]", 1), {"tensor 'w'", "unknown dtype \"F8_E4M3\""});
  expect_load_error(dir, one_tensor(R"("f32")", "[1]", "[0,4]", 4), {"tensor 'w'", "unknown dtype \"f32\""});
  expect_load_error(dir, one_tensor("32", "[1]", "[0,4]", 4), {"tensor 'w'", "dtype 32 is not a string"});
  for (const char* shape : {"5", "[-1]", "[2.5]", "[\"2\"]", "[[2]]", "null", "{}"})
    expect_load_error(dir, one_tensor(R"("F32")", shape, "[0,4]", 4),
                      {"tensor 'w'", "is not a list of non-negative integers"});
  expect_load_error(dir, one_tensor(R"("F32")", "[1,1,1,1,1,1,1,1,1]", "[0,4]", 4),
                    {"tensor 'w'", "has 9 dims, more than mixtape's 8"});
  // numel overflows, and numel fits but numel × itemsize does not: checked multiplies, no wrap-around to 0.
  expect_load_error(dir, one_tensor(R"("U8")", "[4294967296,4294967296]", "[0,0]", 0),
                    {"tensor 'w'", "has more elements than 64 bits count"});
  expect_load_error(dir, one_tensor(R"("I64")", "[2305843009213693952,2]", "[0,0]", 0),
                    {"tensor 'w'", "× 8 bytes (I64) overflows 64 bits"});
}

BOOST_AUTO_TEST_CASE(errors_in_data_offsets, MT_CPU_TEST) {
  TempDir dir;
  for (const char* offsets : {"4", "[0]", "[0,4,8]", "[-1,3]", "[0,4.0]", "[\"0\",\"4\"]", "null"})
    expect_load_error(dir, one_tensor(R"("F32")", "[1]", offsets, 4),
                      {"tensor 'w'", "is not two non-negative integers [begin, end]"});
  expect_load_error(dir, one_tensor(R"("F32")", "[1]", "[4,0]", 4), {"tensor 'w'", "[4, 0] begin after they end"});
  expect_load_error(dir, one_tensor(R"("F32")", "[2]", "[0,8]", 4),
                    {"tensor 'w'", "[0, 8] reach beyond the data, which holds 4 bytes"});
  expect_load_error(dir, one_tensor(R"("F32")", "[2]", "[0,4]", 4),
                    {"tensor 'w'", "[0, 4] hold 4 bytes, but shape [2] of F32 needs 8"});
  expect_load_error(dir, one_tensor(R"("F16")", "[2,3]", "[0,6]", 6),
                    {"hold 6 bytes, but shape [2,3] of F16 needs 12"});
}

BOOST_AUTO_TEST_CASE(errors_in_coverage_of_the_data, MT_CPU_TEST) {
  TempDir dir;
  const std::string two = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)";
  expect_load_error(dir, safetensors_bytes(two + R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                           std::string(12, '\0')),
                    {"tensors 'a' [0, 8) and 'b' [4, 12) overlap"});
  expect_load_error(dir, safetensors_bytes(two + R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                                           std::string(8, '\0')),
                    {"overlap"});
  // An empty tensor inside another one's bytes overlaps it too (the reference refuses it as well).
  expect_load_error(dir, safetensors_bytes(two + R"("b":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
                                           std::string(8, '\0')),
                    {"tensors 'a' [0, 8) and 'b' [4, 4) overlap"});
  expect_load_error(dir, safetensors_bytes(two + R"("b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
                                           std::string(16, '\0')),
                    {"the data bytes [8, 12) belong to no tensor (a gap before 'b')"});
  expect_load_error(dir, one_tensor(R"("F32")", "[1]", "[4,8]", 8),
                    {"the data bytes [0, 4) belong to no tensor (a gap before 'w')"});
  const std::string ok = one_tensor(R"("F32")", "[1]", "[0,4]", 4);
  expect_load_error(dir, ok + "xy", {"2 trailing bytes after the last tensor"});
  expect_load_error(dir, safetensors_bytes("{}", "z"), {"1 trailing bytes after the last tensor"});
  // Empty tensors at the end of the data, and several at one offset, tile it fine.
  write_bytes(dir.file("ok.safetensors"),
              safetensors_bytes(two + R"("b":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},)"
                                      R"("c":{"dtype":"I64","shape":[3,0],"data_offsets":[8,8]}})",
                                std::string(8, '\0')));
  BOOST_TEST(load_safetensors(dir.file("ok.safetensors")).tensors.keys() == (std::vector<std::string>{"a", "b", "c"}));
}

BOOST_AUTO_TEST_CASE(errors_in_metadata_and_values, MT_CPU_TEST) {
  TempDir dir;
  const std::string w = R"("w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]})";
  expect_load_error(dir, safetensors_bytes(R"({"__metadata__":{"format":"pt","step":1000},)" + w + "}", "a"),
                    {"__metadata__ 'step' is not a string but number 1000"});
  expect_load_error(dir, safetensors_bytes(R"({"__metadata__":{"tags":["a"]},)" + w + "}", "a"),
                    {"__metadata__ 'tags' is not a string but array"});
  expect_load_error(dir, safetensors_bytes(R"({"__metadata__":["pt"],)" + w + "}", "a"),
                    {"__metadata__ is not an object of strings but array"});
  expect_load_error(dir, safetensors_bytes(R"({"w":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})",
                                           std::string("\x01\x00\x02", 3)),
                    {"tensor 'w'", "BOOL element 2 is the byte 2, not 0 or 1"});
  // A null __metadata__ is no metadata.
  write_bytes(dir.file("ok.safetensors"), safetensors_bytes(R"({"__metadata__":null,)" + w + "}", "a"));
  BOOST_TEST(load_safetensors(dir.file("ok.safetensors")).metadata.empty());
}

// ---- saving: errors, and crash safety ---------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(a_failed_save_leaves_the_old_file_and_no_temporary_file, MT_CPU_TEST) {
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  StateDict good;
  good.insert("w", mt::tensor({1.f, 2.f}));
  save_safetensors(path, good, {{"step", "1"}});
  const std::string before = read_bytes(path);

  StateDict reserved;
  reserved.insert("w", mt::tensor({3.f}));
  reserved.insert("__metadata__", mt::tensor({4.f}));
  expect_error([&] { save_safetensors(path, reserved); },
               {"save_safetensors", path, "'__metadata__' cannot name a tensor"});
  BOOST_TEST(read_bytes(path) == before);
  BOOST_TEST(dir.entries() == std::vector<std::string>{"ckpt.safetensors"});

  StateDict not_utf8;
  not_utf8.insert("bad\xff", mt::tensor({3.f}));
  expect_error([&] { save_safetensors(path, not_utf8); }, {path, "the tensor name", "is not valid UTF-8"});
  expect_error([&] { save_safetensors(path, good, {{"k", "\xc3"}}); }, {path, "the metadata value", "not valid UTF-8"});
  BOOST_TEST(read_bytes(path) == before);
  BOOST_TEST(dir.entries() == std::vector<std::string>{"ckpt.safetensors"});

  // A failure after the temporary file is written (the rename: the target is a directory) removes it too.
  fs::create_directory(dir.path / "taken");
  expect_error([&] { save_safetensors(dir.file("taken"), good); },
               {"save_safetensors", dir.file("taken"), "renaming", "Is a directory"});
  BOOST_TEST(dir.entries() == (std::vector<std::string>{"ckpt.safetensors", "taken"}));
  BOOST_TEST(fs::is_empty(dir.path / "taken"));

  BOOST_TEST(load_safetensors(path).metadata.at("step") == "1");
}

BOOST_AUTO_TEST_CASE(an_atomic_file_is_the_old_one_until_it_commits, MT_CPU_TEST) {
  // core/atomic_file.h, which save_safetensors and the inspector's write_json write through.
  TempDir dir;
  const std::string path = dir.file("report.txt");
  mt::write_file_atomically("test", path, "old\n");
  try {
    mt::AtomicFile f("test", path);
    f.write("new, but");
    BOOST_TEST(read_bytes(path) == "old\n");
    throw std::runtime_error("the writer's own failure");
  } catch (const std::runtime_error&) {
  }
  BOOST_TEST(read_bytes(path) == "old\n");
  BOOST_TEST(dir.entries() == std::vector<std::string>{"report.txt"}, "the temporary file went with the writer");
  mt::AtomicFile f("test: 'report.txt'", path);
  f.write("new\n");
  f.commit();
  BOOST_TEST(read_bytes(path) == "new\n");
  expect_error([&] { f.write("more"); }, {"test: 'report.txt'", "after commit()"});
  BOOST_TEST(dir.entries() == std::vector<std::string>{"report.txt"});
}

BOOST_AUTO_TEST_CASE(saving_into_a_missing_or_unwritable_directory, MT_CPU_TEST) {
  TempDir dir;
  StateDict sd;
  sd.insert("w", mt::tensor({1.f}));
  const std::string path = dir.file("no/such/dir/ckpt.safetensors");
  expect_error([&] { save_safetensors(path, sd); },
               {"save_safetensors", path, "cannot create the temporary file", "No such file or directory"});
  BOOST_TEST(dir.entries().empty());
  if (::geteuid() != 0) {  // root writes anywhere
    fs::create_directory(dir.path / "readonly");
    fs::permissions(dir.path / "readonly", fs::perms::owner_read | fs::perms::owner_exec);
    const std::string ro = dir.file("readonly/ckpt.safetensors");
    expect_error([&] { save_safetensors(ro, sd); }, {ro, "Permission denied"});
    fs::permissions(dir.path / "readonly", fs::perms::owner_all);
  }
}

// ---- bytes in memory, and what fuzz/fuzz_safetensors.cpp found (each input is also in fuzz/corpus/) -----------

BOOST_AUTO_TEST_CASE(parses_bytes_in_memory_as_it_loads_a_file, MT_CPU_TEST) {
  TempDir dir;
  const StateDict sd = every_dtype();
  save_safetensors(dir.file("a.safetensors"), sd, {{"step", "7"}});
  const std::string bytes = read_bytes(dir.file("a.safetensors"));
  auto span = [](const std::string& b) { return std::span(reinterpret_cast<const uint8_t*>(b.data()), b.size()); };
  const mt::data::SafetensorsFile f = mt::data::parse_safetensors(span(bytes), "the buffer");
  expect_same_dict(f.tensors, sd, "parse_safetensors");
  BOOST_TEST((f.metadata == std::map<std::string, std::string>{{"step", "7"}}));
  const std::string bad = one_tensor(R"("F32")", "[2]", "[0,8]", 4);
  expect_error([&] { mt::data::parse_safetensors(span(bad), "the buffer"); },
               {"parse_safetensors: 'the buffer'", "tensor 'w'", "reach beyond the data, which holds 4 bytes"});
}

BOOST_AUTO_TEST_CASE(a_number_beyond_a_double_is_an_error, MT_CPU_TEST) {
  // Valid JSON that nlohmann cannot hold: its out_of_range escaped the reader, which promises mixtape::Error.
  TempDir dir;
  expect_load_error(dir, safetensors_bytes("1e400", ""), {"the header cannot be parsed", "number overflow"});
  expect_load_error(dir, one_tensor(R"("F32")", "[1e400]", "[0,4]", 4), {"the header cannot be parsed"});
}

BOOST_AUTO_TEST_CASE(a_zero_dim_does_not_hide_dims_past_the_strides, MT_CPU_TEST) {
  // No elements, so numel and the byte count are 0, but the strides of [0, 2^62, 3] would be 3 × 2^62.
  TempDir dir;
  expect_load_error(dir, one_tensor(R"("F32")", "[0,4611686018427387904,3]", "[0,0]", 0),
                    {"tensor 'w'", "has no elements, but its other dims multiply past a tensor's 64-bit strides"});
  const std::string fits = one_tensor(R"("F32")", "[0,4611686018427387904,1]", "[0,0]", 0);
  write_bytes(dir.file("fits.safetensors"), fits);
  BOOST_TEST(load_safetensors(dir.file("fits.safetensors")).tensors.at("w").shape() ==
             Shape({0, int64_t{1} << 62, 1}));
}

BOOST_AUTO_TEST_SUITE_END()
