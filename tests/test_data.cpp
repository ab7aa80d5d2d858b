// tests/test_data.cpp — the data layer: the IDX reader's every refusal (each message names the file and the
// fault), MNIST's checks and find_mnist's search, the DataLoader's batches, shuffling and prefetch thread, and
// the real MNIST when $MIXTAPE_MNIST_DIR points at it.
//
// Every file a case reads is made by the case in a scratch directory, raw or gzip (zlib's gzopen), so the
// failures are exact: a header field changed, a byte cut off, a CRC flipped.
#include <boost/test/unit_test.hpp>

#include <sys/resource.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <mixtape/data/data.h>

#include "compare.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace mixtape;
using namespace mixtape::data;
using mixtape::test::expect_error;

namespace {

using Bytes = std::vector<uint8_t>;

// A directory under the system temp dir, removed with everything in it when the case ends.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "mixtape_test_data_XXXXXX").string();
    BOOST_REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

void put_be32(Bytes& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s));
}

// An IDX file: magic (0, 0, type, rank), the dims big-endian, then `payload` as given.
Bytes idx(uint8_t type, const std::vector<uint32_t>& dims, const Bytes& payload) {
  Bytes b{0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) put_be32(b, d);
  b.insert(b.end(), payload.begin(), payload.end());
  return b;
}

Bytes iota_bytes(size_t n, int start = 0) {
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(start + i);
  return b;
}

void write_raw(const std::string& path, const Bytes& b) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  BOOST_REQUIRE(f.good());
}

void write_gz(const std::string& path, const Bytes& b) {
  gzFile f = gzopen(path.c_str(), "wb");
  BOOST_REQUIRE(f != nullptr);
  if (!b.empty()) BOOST_REQUIRE(gzwrite(f, b.data(), static_cast<unsigned>(b.size())) == static_cast<int>(b.size()));
  BOOST_REQUIRE(gzclose(f) == Z_OK);
}

Bytes read_raw(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), {});
}

// The gzip bytes of `b` (one member).
Bytes gz_bytes(const TempDir& dir, const Bytes& b) {
  write_gz(dir / "scratch.gz", b);
  return read_raw(dir / "scratch.gz");
}

// Sets (or, with nullptr, unsets) an environment variable for a scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : m_name(name) {
    if (const char* old = std::getenv(name)) m_old = old, m_had = true;
    if (value) setenv(name, value, 1); else unsetenv(name);
  }
  ~ScopedEnv() {
    if (m_had) setenv(m_name, m_old.c_str(), 1); else unsetenv(m_name);
  }

 private:
  const char* m_name;
  std::string m_old;
  bool m_had = false;
};

// A small MNIST: `n` images of 28 × 28 (pixel (i, r, c) = i + r + c mod 256) and labels i mod 10, both splits.
void write_fake_mnist(const TempDir& dir, uint32_t n, bool gz) {
  Bytes pixels(size_t{n} * 784), labels(n);
  for (uint32_t i = 0; i < n; ++i) {
    labels[i] = static_cast<uint8_t>(i % 10);
    for (int r = 0; r < 28; ++r)
      for (int c = 0; c < 28; ++c) pixels[i * 784 + r * 28 + c] = static_cast<uint8_t>(i + r + c);
  }
  for (const char* split : {"train", "t10k"}) {
    auto write = gz ? write_gz : write_raw;
    const std::string suffix = gz ? ".gz" : "";
    write(dir / (std::string(split) + "-images-idx3-ubyte" + suffix), idx(0x08, {n, 28, 28}, pixels));
    write(dir / (std::string(split) + "-labels-idx1-ubyte" + suffix), idx(0x01 + 0x07, {n}, labels));
  }
}

// The labels of every batch of one epoch, in order.
std::vector<int64_t> epoch_labels(DataLoader& loader) {
  std::vector<int64_t> out;
  for (auto& [x, y] : loader) {
    auto v = y.to_vector<int64_t>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

TensorDataset counting_dataset(int64_t n, int64_t h = 2, int64_t w = 3) {
  std::vector<uint8_t> px(static_cast<size_t>(n * h * w));
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(i * 7);
  return TensorDataset(from_vector(px, {n, h, w}), arange(n));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(idx_reader)

BOOST_AUTO_TEST_CASE(reads_every_element_type_raw_and_gzip, MT_CPU_TEST) {
  TempDir dir;
  for (bool gz : {false, true}) {
    auto write = gz ? write_gz : write_raw;
    BOOST_TEST_CONTEXT((gz ? "gzip" : "raw")) {
      write(dir / "u8", idx(0x08, {2, 3}, iota_bytes(6, 250)));
      Tensor u8 = read_idx(dir / "u8");
      BOOST_TEST(u8.dtype() == DType::kU8);
      BOOST_TEST(u8.shape() == (Shape{2, 3}));
      BOOST_TEST(u8.to_vector<int>() == (std::vector<int>{250, 251, 252, 253, 254, 255}),
                 boost::test_tools::per_element());

      Bytes p;
      for (int32_t v : {1, -2, 0x01020304, INT32_MIN}) put_be32(p, static_cast<uint32_t>(v));
      write(dir / "i32", idx(0x0C, {4}, p));
      Tensor i32 = read_idx(dir / "i32");
      BOOST_TEST(i32.dtype() == DType::kI32);
      BOOST_TEST(i32.to_vector<int64_t>() == (std::vector<int64_t>{1, -2, 0x01020304, INT32_MIN}),
                 boost::test_tools::per_element());

      p.clear();
      for (float v : {1.5f, -0.25f, 3.0e38f}) put_be32(p, std::bit_cast<uint32_t>(v));
      write(dir / "f32", idx(0x0D, {1, 3, 1}, p));
      Tensor f32 = read_idx(dir / "f32");
      BOOST_TEST(f32.dtype() == DType::kF32);
      BOOST_TEST(f32.shape() == (Shape{1, 3, 1}));
      BOOST_TEST(f32.to_vector<float>() == (std::vector<float>{1.5f, -0.25f, 3.0e38f}),
                 boost::test_tools::per_element());

      p.clear();
      for (double v : {0.1, -1e300}) {
        uint64_t bits = std::bit_cast<uint64_t>(v);
        put_be32(p, static_cast<uint32_t>(bits >> 32));
        put_be32(p, static_cast<uint32_t>(bits));
      }
      write(dir / "f64", idx(0x0E, {2}, p));
      Tensor f64 = read_idx(dir / "f64");
      BOOST_TEST(f64.dtype() == DType::kF64);
      BOOST_TEST(f64.to_vector<double>() == (std::vector<double>{0.1, -1e300}), boost::test_tools::per_element());

      write(dir / "i8", idx(0x09, {3}, {0x7f, 0x80, 0xff}));
      BOOST_TEST(read_idx(dir / "i8").dtype() == DType::kI32);  // no i8 or i16 dtype: widened
      BOOST_TEST(read_idx(dir / "i8").to_vector<int>() == (std::vector<int>{127, -128, -1}),
                 boost::test_tools::per_element());
      write(dir / "i16", idx(0x0B, {2}, {0x80, 0x00, 0x01, 0x02}));
      BOOST_TEST(read_idx(dir / "i16").dtype() == DType::kI32);
      BOOST_TEST(read_idx(dir / "i16").to_vector<int>() == (std::vector<int>{-32768, 258}),
                 boost::test_tools::per_element());

      write(dir / "empty", idx(0x08, {0, 28, 28}, {}));
      BOOST_TEST(read_idx(dir / "empty").shape() == (Shape{0, 28, 28}));
    }
  }
}

BOOST_AUTO_TEST_CASE(reads_a_multi_member_gzip_file, MT_CPU_TEST) {
  TempDir dir;
  Bytes whole = idx(0x08, {4, 5}, iota_bytes(20));
  Bytes a = gz_bytes(dir, Bytes(whole.begin(), whole.begin() + 9));
  Bytes b = gz_bytes(dir, Bytes(whole.begin() + 9, whole.end()));
  a.insert(a.end(), b.begin(), b.end());
  write_raw(dir / "two.gz", a);
  std::vector<int> want(20);
  std::iota(want.begin(), want.end(), 0);
  BOOST_TEST(read_idx(dir / "two.gz").to_vector<int>() == want, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(refuses_a_missing_or_unreadable_file_naming_it, MT_CPU_TEST) {
  TempDir dir;
  expect_error([&] { read_idx(dir / "nope-idx1-ubyte"); }, {"read_idx", "cannot open", dir / "nope-idx1-ubyte",
                                                             "No such file or directory"});
  expect_error([&] { read_idx(dir.path.string()); }, {"read_idx", dir.path.string(), "is a directory"});
}

BOOST_AUTO_TEST_CASE(refuses_every_broken_header_naming_the_file_and_the_fault, MT_CPU_TEST) {
  TempDir dir;
  struct Case {
    const char* name;
    Bytes bytes;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"empty", {}, {"is 0 bytes, too short for the 4-byte IDX magic number"}},
      {"three_bytes", {0, 0, 8}, {"is 3 bytes, too short"}},
      {"bad_magic", {0x1f, 0x00, 0x08, 0x01, 0, 0, 0, 0}, {"is not an IDX file", "magic number 0x1f000801"}},
      {"text", {'h', 'e', 'l', 'l', 'o'}, {"is not an IDX file", "0x68656c6c"}},
      {"bad_type", idx(0x0A, {1}, {7}), {"unknown element type code 0x0a", "magic number 0x00000a01"}},
      {"rank0", {0, 0, 8, 0}, {"declares 0 dims", "1 to 8"}},
      {"rank9", idx(0x08, {1, 1, 1, 1, 1, 1, 1, 1, 1}, {7}), {"declares 9 dims"}},
      {"short_header", {0, 0, 8, 3, 0, 0, 0, 2, 0, 0}, {"is truncated: 10 bytes", "header of 3 dims is 16 bytes"}},
      {"short_data", idx(0x08, {2, 3}, iota_bytes(5)),
       {"is truncated", "dims [2, 3] of u8 need 6 data bytes after the 12-byte header", "the file has 5 (1 short)"}},
      {"short_f64", idx(0x0E, {2}, iota_bytes(15)), {"dims [2] of f64 need 16 data bytes", "(1 short)"}},
      {"trailing", idx(0x08, {2, 3}, iota_bytes(9)), {"has 3 trailing bytes after the data of dims [2, 3]",
                                                        "18 bytes expected, the file has 21"}},
      {"overflow", idx(0x08, {0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, {}),
       {"absurd dims [4294967295, 4294967295, 4294967295]", "overflows 64 bits"}},
      {"overflow_bytes", idx(0x0E, {0x80000000, 0x80000000, 1}, {}), {"absurd dims", "(f64)", "overflows 64 bits"}},
      {"huge_but_no_overflow", idx(0x08, {60000, 60000, 28}, iota_bytes(100)),
       {"is truncated", "dims [60000, 60000, 28] of u8 need 100800000000 data bytes"}},
  };
  for (bool gz : {false, true}) {
    for (const Case& c : cases) {
      BOOST_TEST_CONTEXT(c.name << (gz ? " (gzip)" : " (raw)")) {
        const std::string path = dir / (std::string(c.name) + (gz ? ".gz" : ""));
        (gz ? write_gz : write_raw)(path, c.bytes);
        std::vector<std::string> parts = c.parts;
        parts.push_back("read_idx: '" + path + "'");
        expect_error([&] { read_idx(path); }, parts);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(refuses_truncated_corrupt_and_trailing_gzip, MT_CPU_TEST) {
  TempDir dir;
  const Bytes good = gz_bytes(dir, idx(0x08, {50, 40}, iota_bytes(2000)));

  Bytes cut(good.begin(), good.end() - 10);  // inside the CRC/length trailer
  write_raw(dir / "cut.gz", cut);
  expect_error([&] { read_idx(dir / "cut.gz"); }, {dir / "cut.gz", "is a truncated gzip stream"});

  Bytes half(good.begin(), good.begin() + good.size() / 2);  // inside the deflate data
  write_raw(dir / "half.gz", half);
  expect_error([&] { read_idx(dir / "half.gz"); }, {dir / "half.gz", "is a truncated gzip stream"});

  Bytes header_only(good.begin(), good.begin() + 5);
  write_raw(dir / "header_only.gz", header_only);
  expect_error([&] { read_idx(dir / "header_only.gz"); }, {dir / "header_only.gz", "truncated gzip stream"});

  Bytes crc = good;
  crc[crc.size() - 8] ^= 0xFF;  // the CRC-32 of the data
  write_raw(dir / "crc.gz", crc);
  expect_error([&] { read_idx(dir / "crc.gz"); }, {dir / "crc.gz", "is a corrupt gzip stream", "incorrect data check"});

  Bytes len = good;
  len[len.size() - 1] ^= 0x01;  // ISIZE, the length mod 2^32
  write_raw(dir / "len.gz", len);
  expect_error([&] { read_idx(dir / "len.gz"); }, {dir / "len.gz", "is a corrupt gzip stream", "incorrect length check"});

  Bytes method = good;
  method[2] = 7;  // compression method: only 8 (deflate) exists
  write_raw(dir / "method.gz", method);
  expect_error([&] { read_idx(dir / "method.gz"); }, {dir / "method.gz", "is a corrupt gzip stream", "zlib:"});

  Bytes trailing = good;
  for (char c : std::string("junk")) trailing.push_back(static_cast<uint8_t>(c));
  write_raw(dir / "trailing.gz", trailing);
  expect_error([&] { read_idx(dir / "trailing.gz"); },
               {dir / "trailing.gz", "has 4 bytes of trailing data after the gzip stream"});
}

BOOST_AUTO_TEST_SUITE_END()

// ---- MNIST and find_mnist ---------------------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(mnist_files)

BOOST_AUTO_TEST_CASE(loads_a_small_mnist_raw_or_gzip, MT_CPU_TEST) {
  for (bool gz : {false, true}) {
    BOOST_TEST_CONTEXT((gz ? "gzip" : "raw")) {
      TempDir dir;
      write_fake_mnist(dir, 13, gz);
      DatasetLocation where = find_mnist(dir.path.string());
      BOOST_TEST(where.dir == dir.path.string());
      BOOST_TEST(where.name == "MNIST");
      for (Split split : {Split::kTrain, Split::kTest}) {
        MNIST m(where, split);
        BOOST_TEST(m.size() == 13);
        BOOST_TEST(m.name() == "MNIST");
        BOOST_TEST(m.images().dtype() == DType::kU8);
        BOOST_TEST(m.images().shape() == (Shape{13, 28, 28}));
        BOOST_TEST(m.labels().dtype() == DType::kI64);
        BOOST_TEST(m.labels().shape() == (Shape{13}));
        BOOST_TEST(m.labels().at<int64_t>({12}) == 2);
        BOOST_TEST(m.images().at<int>({5, 3, 4}) == 12);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(refuses_what_is_not_mnist_naming_the_file, MT_CPU_TEST) {
  TempDir dir;
  write_fake_mnist(dir, 5, false);
  const DatasetLocation where{dir.path.string(), "MNIST"};
  const std::string images = dir / "train-images-idx3-ubyte", labels = dir / "train-labels-idx1-ubyte";
  const Bytes good_images = read_raw(images), good_labels = read_raw(labels);

  write_raw(images, idx(0x08, {5, 28, 27}, iota_bytes(5 * 28 * 27)));
  expect_error([&] { MNIST(where, Split::kTrain); }, {"MNIST: '" + images + "'", "has dims [5, 28, 27]",
                                                      "MNIST images are (N, 28, 28)"});
  write_raw(images, idx(0x08, {5, 784}, iota_bytes(5 * 784)));
  expect_error([&] { MNIST(where, Split::kTrain); }, {images, "has dims [5, 784]"});
  write_raw(images, idx(0x0D, {1, 28, 28}, Bytes(4 * 784)));
  expect_error([&] { MNIST(where, Split::kTrain); }, {images, "holds f32 elements; MNIST images are u8"});
  write_raw(images, good_images);

  write_raw(labels, idx(0x08, {5, 1}, {1, 2, 3, 4, 5}));
  expect_error([&] { MNIST(where, Split::kTrain); }, {labels, "has dims [5, 1]; MNIST labels are (N)"});
  write_raw(labels, idx(0x0C, {5}, Bytes(20)));
  expect_error([&] { MNIST(where, Split::kTrain); }, {labels, "holds i32 elements; MNIST labels are u8"});
  write_raw(labels, idx(0x08, {5}, {1, 2, 3, 10, 4}));
  expect_error([&] { MNIST(where, Split::kTrain); }, {labels, "has label 10 at index 3; labels are 0 to 9"});
  write_raw(labels, idx(0x08, {4}, {1, 2, 3, 4}));
  expect_error([&] { MNIST(where, Split::kTrain); }, {"'" + images + "' has 5 images but '" + labels + "' has 4 labels"});
  write_raw(labels, idx(0x08, {6}, {1, 2, 3, 4, 5, 6}));
  expect_error([&] { MNIST(where, Split::kTrain); },
               {"'" + images + "' has 5 images but '" + labels + "' has 6 labels"});
  write_raw(labels, idx(0x08, {5}, {1, 2, 3, 4}));  // one byte short
  expect_error([&] { MNIST(where, Split::kTrain); }, {labels, "is truncated"});
  write_raw(labels, good_labels);
  BOOST_TEST(MNIST(where, Split::kTrain).size() == 5);

  fs::remove(dir / "t10k-labels-idx1-ubyte");
  expect_error([&] { MNIST(where, Split::kTest); }, {"MNIST: no file '" + (dir / "t10k-labels-idx1-ubyte") + "' (or .gz)"});
}

BOOST_AUTO_TEST_CASE(find_mnist_searches_in_order_and_lists_every_place_tried, MT_CPU_TEST) {
  TempDir dir, fashion_parent;
  write_fake_mnist(dir, 3, true);

  {  // $MIXTAPE_MNIST_DIR wins when no dir is given
    ScopedEnv env("MIXTAPE_MNIST_DIR", dir.path.string().c_str());
    DatasetLocation where = find_mnist();
    BOOST_TEST(where.dir == dir.path.string());
    BOOST_TEST(where.name == "MNIST");
  }

  const std::string fashion = fashion_parent / "Fashion-mnist";
  fs::create_directory(fashion);
  for (const auto& e : fs::directory_iterator(dir.path)) fs::copy_file(e.path(), fs::path(fashion) / e.path().filename());
  BOOST_TEST(find_mnist(fashion).name == "Fashion-MNIST");

  // A given dir must hold the files: no fallback.
  fs::remove(dir / "t10k-images-idx3-ubyte.gz");
  expect_error([&] { find_mnist(dir.path.string()); },
               {"find_mnist: '" + dir.path.string() + "' does not hold MNIST (missing t10k-images-idx3-ubyte[.gz])"});
  expect_error([&] { find_mnist(dir / "absent"); }, {dir / "absent", "not a directory"});

  // Nothing anywhere: the message lists the places (unless this machine has data/mnist or the Debian package).
  std::error_code ec;
  if (fs::exists("data/mnist", ec)) {
    BOOST_TEST_MESSAGE("find_mnist: the working directory has data/mnist; not checking the fallbacks");
  } else if (fs::exists(kDebianFashionMnistDir, ec)) {
    BOOST_TEST_MESSAGE("find_mnist: " << kDebianFashionMnistDir << " is installed: checking it is the last resort");
    ScopedEnv env("MIXTAPE_MNIST_DIR", dir.path.string().c_str());
    const DatasetLocation where = find_mnist();
    BOOST_TEST(where.dir == kDebianFashionMnistDir);
    BOOST_TEST(where.name == "Fashion-MNIST");
  } else {
    ScopedEnv env("MIXTAPE_MNIST_DIR", dir.path.string().c_str());
    expect_error([&] { find_mnist(); }, {"find_mnist: no MNIST found; tried:",
                                         "$MIXTAPE_MNIST_DIR '" + dir.path.string() + "': missing t10k-images",
                                         "the default 'data/mnist': not a directory",
                                         "Debian's dataset-fashion-mnist '/usr/share/datasets/fashion-mnist'",
                                         "scripts/get_mnist.sh"});
    ScopedEnv unset("MIXTAPE_MNIST_DIR", nullptr);
    expect_error([&] { find_mnist(); }, {"$MIXTAPE_MNIST_DIR: not set"});
  }
}

BOOST_AUTO_TEST_SUITE_END()

// ---- DataLoader --------------------------------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(dataloader)

BOOST_AUTO_TEST_CASE(batches_have_the_right_sizes_with_and_without_drop_last, MT_CPU_TEST) {
  const TensorDataset data = counting_dataset(10);
  struct Case {
    int64_t batch;
    bool drop_last;
    std::vector<int64_t> sizes;
  };
  for (const Case& c : std::vector<Case>{{4, false, {4, 4, 2}}, {4, true, {4, 4}}, {5, false, {5, 5}},
                                         {5, true, {5, 5}}, {10, false, {10}}, {11, false, {10}}, {11, true, {}},
                                         {1, false, std::vector<int64_t>(10, 1)}}) {
    for (bool prefetch : {true, false}) {
      BOOST_TEST_CONTEXT("batch_size " << c.batch << " drop_last " << c.drop_last << " prefetch " << prefetch) {
        DataLoader loader(data, {.batch_size = c.batch, .drop_last = c.drop_last, .prefetch = prefetch});
        BOOST_TEST(loader.size() == static_cast<int64_t>(c.sizes.size()));
        BOOST_TEST(loader.num_samples() == 10);
        std::vector<int64_t> sizes, labels;
        for (auto& [x, y] : loader) {
          sizes.push_back(x.size(0));
          BOOST_TEST(x.shape() == (Shape{x.size(0), 1, 2, 3}));
          BOOST_TEST(x.dtype() == DType::kF32);
          BOOST_TEST(y.shape() == (Shape{x.size(0)}));
          BOOST_TEST(y.dtype() == DType::kI64);
          for (int64_t v : y.to_vector<int64_t>()) labels.push_back(v);
        }
        BOOST_TEST(sizes == c.sizes, boost::test_tools::per_element());
        std::vector<int64_t> want(labels.size());
        std::iota(want.begin(), want.end(), 0);
        BOOST_TEST(labels == want, boost::test_tools::per_element());  // no shuffle: in order
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(normalises_exactly_to_f32_rounding, MT_CPU_TEST) {
  const int64_t n = 300;  // every u8 value appears
  const TensorDataset data = counting_dataset(n, 1, 1);
  for (auto [mean, stdev] : {std::pair{0.1307, 0.3081}, std::pair{0.5, 0.25}, std::pair{0.0, 1.0}}) {
    DataLoader loader(data, {.batch_size = 128, .mean = mean, .std = stdev});
    for (auto it = loader.begin(); it != loader.end(); ++it) {
      const auto xs = it->x.to_vector<float>();
      const auto ys = it->y.to_vector<int64_t>();
      for (size_t k = 0; k < xs.size(); ++k) {
        const uint8_t pixel = static_cast<uint8_t>(ys[k] * 7);
        const float want = static_cast<float>((pixel / 255.0 - mean) / stdev);
        BOOST_TEST(xs[k] == want, "pixel " << int{pixel} << " mean " << mean << " std " << stdev);
      }
    }
  }
  // f32 inputs are not divided by 255.
  TensorDataset floats(from_vector<float>({0.5f, 2.0f, -1.0f}, {3, 1}), tensor<int64_t>({0, 1, 2}));
  DataLoader loader(floats, {.batch_size = 3, .mean = 0.5, .std = 2.0});
  BOOST_TEST(loader.begin()->x.to_vector<float>() == (std::vector<float>{0.0f, 0.75f, -0.75f}),
             boost::test_tools::per_element());
  BOOST_TEST(loader.begin()->x.shape() == (Shape{3, 1}));
  // f64 inputs neither, computed in f64 and rounded once to f32 (in f32, 0.5 + 1e-12 would be 0.5, and give 0);
  // i32 targets arrive as i64.
  TensorDataset doubles(from_vector<double>({0.5, 2.0, -1.0, 0.5 + 1e-12}, {4, 1}), tensor<int32_t>({3, 2, 1, 0}));
  DataLoader f64_loader(doubles, {.batch_size = 4, .mean = 0.5, .std = 2.0});
  BOOST_TEST(f64_loader.options().batch_size == 4);
  BOOST_TEST(f64_loader.begin()->x.to_vector<float>() ==
                 (std::vector<float>{0.0f, 0.75f, -0.75f, static_cast<float>((0.5 + 1e-12 - 0.5) / 2.0)}),
             boost::test_tools::per_element());
  BOOST_TEST(f64_loader.begin()->y.to_vector<int64_t>() == (std::vector<int64_t>{3, 2, 1, 0}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(an_empty_dataset_gives_no_batches, MT_CPU_TEST) {
  const TensorDataset empty(zeros({0, 2, 3}, DType::kU8), arange(0));
  for (bool drop_last : {false, true}) {
    DataLoader loader(empty, {.batch_size = 4, .shuffle = true, .drop_last = drop_last});
    BOOST_TEST(loader.size() == 0);
    BOOST_TEST(loader.num_samples() == 0);
    int64_t batches = 0;
    for (auto& batch : loader) batches += batch.x.size(0) + 1;
    BOOST_TEST(batches == 0);
  }
}

BOOST_AUTO_TEST_CASE(shuffles_reproducibly_a_new_permutation_each_epoch, MT_CPU_TEST) {
  const int64_t n = 257;
  const TensorDataset data = counting_dataset(n);
  std::vector<int64_t> all(n);
  std::iota(all.begin(), all.end(), 0);

  DataLoader a(data, {.batch_size = 32, .shuffle = true, .seed = 42});
  DataLoader b(data, {.batch_size = 32, .shuffle = true, .seed = 42, .prefetch = false});
  DataLoader c(data, {.batch_size = 32, .shuffle = true, .seed = 43});
  std::set<std::vector<int64_t>> seen;
  for (int epoch = 0; epoch < 3; ++epoch) {
    BOOST_TEST_CONTEXT("epoch " << epoch) {
      std::vector<int64_t> ea = epoch_labels(a), eb = epoch_labels(b), ec = epoch_labels(c);
      BOOST_TEST(ea == eb, boost::test_tools::per_element());  // same seed, same epoch: same order
      BOOST_TEST((ea != ec));                                   // another seed: another order
      BOOST_TEST((ea != all));                                  // shuffled
      std::vector<int64_t> sorted = ea;
      std::sort(sorted.begin(), sorted.end());
      BOOST_TEST(sorted == all, boost::test_tools::per_element());  // every sample exactly once
      BOOST_TEST(seen.insert(ea).second);                         // differs from every earlier epoch
    }
  }
  BOOST_TEST(a.epochs_begun() == 3u);

  // A batch's images follow its labels (the gather is one permutation for both).
  DataLoader d(data, {.batch_size = 7, .shuffle = true, .seed = 5, .mean = 0.0, .std = 1.0});
  for (auto& [x, y] : d) {
    const auto xs = x.to_vector<float>();
    const auto ys = y.to_vector<int64_t>();
    for (size_t k = 0; k < ys.size(); ++k)
      BOOST_TEST(xs[k * 6] == static_cast<float>(static_cast<uint8_t>(ys[k] * 6 * 7) / 255.0));
  }
}

// Fisher–Yates draws j from [0, i]; drawing it from [0, i) (Sattolo's algorithm, a one-character slip) still gives
// a new permutation each epoch, but only the (n − 1)! cyclic ones: no sample ever keeps its place. Over 6,000 epochs
// of three samples each of the 3! orders must come about 1,000 times: Pearson's χ² with 5 degrees of freedom is
// below 25 with probability 1 − 1.4e-4 (the seed is fixed, so the test is too; these seeds give 1.9 and 3.3).
BOOST_AUTO_TEST_CASE(shuffles_uniformly_over_every_permutation, MT_CPU_TEST) {
  const TensorDataset data = counting_dataset(3, 1, 1);
  for (uint64_t seed : {0u, 7u}) {
    BOOST_TEST_CONTEXT("seed " << seed) {
      DataLoader loader(data, {.batch_size = 3, .shuffle = true, .seed = seed, .prefetch = false});
      constexpr int kEpochs = 6000;
      std::map<std::vector<int64_t>, int> count;
      for (int epoch = 0; epoch < kEpochs; ++epoch) ++count[epoch_labels(loader)];
      BOOST_TEST(count.size() == 6u);  // every order, the identity and those with a fixed sample among them
      BOOST_TEST(count.count({0, 1, 2}) == 1u);
      const double expected = kEpochs / 6.0;
      double chi2 = 0;
      for (const auto& [order, k] : count) chi2 += (k - expected) * (k - expected) / expected;
      BOOST_TEST(chi2 < 25.0);
    }
  }
}

BOOST_AUTO_TEST_CASE(an_abandoned_epoch_and_a_new_one_work, MT_CPU_TEST) {
  const TensorDataset data = counting_dataset(100);
  DataLoader loader(data, {.batch_size = 10, .shuffle = true, .seed = 3});
  for (int round = 0; round < 5; ++round) {
    int taken = 0;
    for (auto& [x, y] : loader) {
      (void)x;
      (void)y;
      if (++taken == 2) break;  // the worker is left holding batch 3
    }
    BOOST_TEST(taken == 2);
  }
  BOOST_TEST(epoch_labels(loader).size() == 100u);
  BOOST_TEST(loader.epochs_begun() == 6u);

  // An iterator of an earlier epoch is refused once a new one has begun.
  auto old = loader.begin();
  auto fresh = loader.begin();
  expect_error([&] { ++old; }, {"DataLoader: this iterator belongs to epoch 6, but begin() has started epoch 7"});
  ++fresh;
  BOOST_TEST(fresh.index() == 1);
}

BOOST_AUTO_TEST_CASE(destroying_a_loader_mid_epoch_joins_its_worker, MT_CPU_TEST) {
  const TensorDataset data = counting_dataset(20000, 28, 28);
  for (int i = 0; i < 20; ++i) {
    DataLoader loader(data, {.batch_size = 1000, .shuffle = true, .seed = static_cast<uint64_t>(i)});
    auto it = loader.begin();
    if (i % 2) ++it;
  }  // the worker is mid-batch or waiting on a full slot: both must end
  DataLoader loader(data, {.batch_size = 1000});
  DataLoader moved = std::move(loader);
  BOOST_TEST(epoch_labels(moved).size() == 20000u);
}

BOOST_AUTO_TEST_CASE(the_worker_s_exception_reaches_the_loop, MT_CPU_TEST) {
  // Device cuda:97 does not exist (with or without CUDA): the copy on the worker throws.
  const TensorDataset data = counting_dataset(10);
  DataLoader loader(data, {.batch_size = 4, .device = Device::cuda(97)});
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::string msg = expect_error([&] { loader.begin(); }, {});
    std::transform(msg.begin(), msg.end(), msg.begin(), [](unsigned char ch) { return std::tolower(ch); });
    BOOST_TEST(msg.find("cuda") != std::string::npos, msg);
  }
  // And the loader is still destroyed cleanly.
}

BOOST_AUTO_TEST_CASE(refuses_bad_options, MT_CPU_TEST) {
  const TensorDataset data = counting_dataset(10);
  expect_error([&] { DataLoader(data, {.batch_size = 0}); }, {"DataLoader: batch_size must be at least 1, got 0"});
  expect_error([&] { DataLoader(data, {.std = 0.0}); }, {"DataLoader: mean (0.1307) must be finite and std (0)"});
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (const double std_ : {-0.3081, inf, nan})
    expect_error([&] { DataLoader(data, {.std = std_}); }, {"DataLoader: mean (0.1307) must be finite and std"});
  for (const double mean : {inf, nan})
    expect_error([&] { DataLoader(data, {.mean = mean}); }, {"DataLoader: mean", "must be finite and std (0.3081)"});
  expect_error([&] { DataLoader(TensorDataset(zeros({3, 2}, DType::kI32), arange(3))); },
               {"DataLoader: inputs of dtype i32 are not supported"});
  expect_error([&] { DataLoader(TensorDataset(zeros({3, 2}), zeros({3}))); },
               {"DataLoader: targets must be integers (class indices), got f32"});
  const std::string msg = expect_error([&] { TensorDataset(zeros({3, 2}), arange(4)); },
                                      {"TensorDataset: 3 inputs but 4 targets"});
  BOOST_TEST(!msg.empty());
}

BOOST_AUTO_TEST_CASE(batches_move_to_the_gpu_on_the_worker, MT_GPU_TEST) {
  const TensorDataset data = counting_dataset(50, 28, 28);
  DataLoader cpu(data, {.batch_size = 16, .shuffle = true, .seed = 9});
  DataLoader gpu(data, {.batch_size = 16, .shuffle = true, .seed = 9, .device = Device::cuda()});
  auto c = cpu.begin();
  int batches = 0;
  for (auto& [x, y] : gpu) {
    BOOST_TEST(x.device() == Device::cuda());
    BOOST_TEST(y.device() == Device::cuda());
    BOOST_TEST(mixtape::test::expect_same_bits(x, c->x, "x"));
    BOOST_TEST(mixtape::test::expect_same_bits(y, c->y, "y"));
    ++c;
    ++batches;
  }
  BOOST_TEST(batches == 4);
}

BOOST_AUTO_TEST_SUITE_END()

// ---- the real MNIST ---------------------------------------------------------------------------------------------

namespace {
struct mnist_dir_set {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    const char* dir = std::getenv("MIXTAPE_MNIST_DIR");
    boost::test_tools::assertion_result r(dir != nullptr && *dir != '\0');
    if (!r) r.message() << "MIXTAPE_MNIST_DIR is not set: skipping the real-MNIST checks (scripts/get_mnist.sh)";
    return r;
  }
};
}  // namespace

BOOST_AUTO_TEST_SUITE(real_mnist)

BOOST_AUTO_TEST_CASE(loads_both_splits_with_the_published_statistics,
                     *boost::unit_test::precondition(mnist_dir_set()) * boost::unit_test::label("cpu")) {
  const DatasetLocation where = find_mnist();
  BOOST_TEST(where.name == "MNIST");
  struct Want {
    Split split;
    int64_t n;
    std::vector<int64_t> first, histogram;
    double mean_pixel;
  };
  const std::vector<Want> wants = {
      {Split::kTrain, 60000, {5, 0, 4, 1, 9, 2, 1, 3, 1, 4},
       {5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949}, 33.3184},
      {Split::kTest, 10000, {7, 2, 1, 0, 4, 1, 4, 9, 5, 9}, {980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009},
       33.7912}};
  for (const Want& w : wants) {
    BOOST_TEST_CONTEXT((w.split == Split::kTrain ? "train" : "test")) {
      const auto t0 = std::chrono::steady_clock::now();
      MNIST m(where, w.split);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      BOOST_TEST_MESSAGE("MNIST " << (w.split == Split::kTrain ? "train" : "test") << ": " << m.size()
                                  << " samples read and checked in " << ms << " ms");
      BOOST_TEST(m.size() == w.n);
      BOOST_TEST(m.images().shape() == (Shape{w.n, 28, 28}));
      const auto labels = m.labels().to_vector<int64_t>();
      BOOST_TEST(std::vector<int64_t>(labels.begin(), labels.begin() + 10) == w.first,
                 boost::test_tools::per_element());
      std::vector<int64_t> histogram(10);
      for (int64_t l : labels) ++histogram[l];
      BOOST_TEST(histogram == w.histogram, boost::test_tools::per_element());
      const uint8_t* px = m.images().data<uint8_t>();
      double sum = 0;
      for (int64_t i = 0; i < m.images().numel(); ++i) sum += px[i];
      BOOST_TEST(std::abs(sum / m.images().numel() - w.mean_pixel) < 1e-4);

      // One shuffled epoch through the loader sees every sample once, with the mean and std it normalised by.
      DataLoader loader(m, {.batch_size = 128, .shuffle = true, .seed = 1});
      BOOST_TEST(loader.size() == (w.n + 127) / 128);
      std::vector<int64_t> seen(10);
      double xsum = 0;
      int64_t count = 0;
      const auto t1 = std::chrono::steady_clock::now();
      for (auto& [x, y] : loader) {
        for (int64_t l : y.to_vector<int64_t>()) ++seen[l];
        const float* xd = x.data<float>();
        for (int64_t i = 0; i < x.numel(); ++i) xsum += xd[i];
        count += x.size(0);
      }
      const double ms1 = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
      BOOST_TEST_MESSAGE("one epoch of " << loader.size() << " batches in " << ms1 << " ms");
      BOOST_TEST(count == w.n);
      BOOST_TEST(seen == w.histogram, boost::test_tools::per_element());
      BOOST_TEST(std::abs(xsum / (w.n * 784.0) - (w.mean_pixel / 255.0 - 0.1307) / 0.3081) < 1e-4);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

// ---- found by fuzz/fuzz_idx.cpp (each input is also in fuzz/corpus/idx/) ----------------------------------------

BOOST_AUTO_TEST_SUITE(idx_fuzz_findings)

// The peak resident memory of this process so far, in MiB.
double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024;
}

BOOST_AUTO_TEST_CASE(a_corrupt_gzip_trailer_costs_no_more_memory_than_its_bytes_inflate_to, MT_CPU_TEST) {
  // A truncated file ends anywhere, so its last 4 bytes, where a whole file keeps its length, can say 4 GiB: the
  // reader took them as the size to allocate (up to 1 GiB) before finding the stream short.
  TempDir dir;
  Bytes cut = gz_bytes(dir, idx(0x08, {50, 40}, iota_bytes(2000)));
  cut.resize(cut.size() / 2);
  std::fill(cut.end() - 4, cut.end(), 0xFF);
  write_raw(dir / "cut.gz", cut);
  const double before = peak_rss_mib();
  expect_error([&] { read_idx(dir / "cut.gz"); }, {dir / "cut.gz", "gzip stream"});
  BOOST_TEST(peak_rss_mib() - before < 256, "peak memory grew by " << peak_rss_mib() - before << " MiB reading "
                                                                     << cut.size() << " bytes");
}

BOOST_AUTO_TEST_CASE(a_zero_dim_does_not_hide_dims_past_the_strides, MT_CPU_TEST) {
  // No elements, so no byte count overflows, but the strides of [0, 2^28, 2^28, 2^28] would (2^84).
  TempDir dir;
  write_raw(dir / "strides", idx(0x08, {0, 1u << 28, 1u << 28, 1u << 28}, {}));
  expect_error([&] { read_idx(dir / "strides"); },
               {dir / "strides", "absurd dims [0, 268435456, 268435456, 268435456]", "64-bit strides"});
  // The largest that fit are read: an empty tensor of that shape.
  write_raw(dir / "fits", idx(0x08, {0, 1u << 31, 1u << 31}, {}));
  BOOST_TEST(read_idx(dir / "fits").shape() == Shape({0, int64_t{1} << 31, int64_t{1} << 31}));
}

BOOST_AUTO_TEST_CASE(maybe_gunzip_is_read_idx_without_the_file, MT_CPU_TEST) {
  TempDir dir;
  const Bytes raw = idx(0x08, {2, 3}, iota_bytes(6));
  BOOST_TEST(maybe_gunzip(raw, "raw") == raw);
  BOOST_TEST(maybe_gunzip(gz_bytes(dir, raw), "gz") == raw);
  Bytes cut = gz_bytes(dir, raw);
  cut.resize(cut.size() - 3);
  expect_error([&] { maybe_gunzip(cut, "the buffer"); }, {"'the buffer' is a truncated gzip stream"});
}

BOOST_AUTO_TEST_SUITE_END()
