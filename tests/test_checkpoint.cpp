// tests/test_checkpoint.cpp — training checkpoints (data/checkpoint.h): parts, step and generator round trip; an
// independent reader (Python over torch) reads what mixtape wrote; resuming is bitwise exact in f32 and in f16 with
// the loss scaler; and a writer killed with SIGKILL at random moments, 100 times, always leaves a checkpoint that
// loads and resumes, never a partial file under the final name.
#include <boost/test/unit_test.hpp>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include <mixtape/mixtape.h>

#include "checkpoint_run.h"
#include "compare.h"
#include "test_util.h"

extern char** environ;

namespace mt = mixtape;
namespace fs = std::filesystem;
using checkpoint_test::TinyRun;
using mt::Tensor;
using mt::data::Checkpoint;
using mt::data::load_checkpoint;
using mt::data::save_checkpoint;
using mt::test::expect_error;
using mt::test::expect_same_bits;

namespace {

/// A scratch directory of this suite.
struct TempDir : mt::test::TempDir {
  TempDir() : mt::test::TempDir("mixtape_checkpoint_") {}
};

/// Every tensor of `a` and `b` (same keys, same order) bit for bit.
void expect_same_state(const mt::StateDict& a, const mt::StateDict& b, const std::string& what) {
  BOOST_TEST_REQUIRE(a.keys() == b.keys(), what << ": different keys");
  for (const auto& [key, t] : a) expect_same_bits(t, b.at(key), what + " '" + key + "'");
}

/// A python3 that can import torch (MIXTAPE_PYTHON, Debian's /usr/bin/python3, the one on PATH), or "".
std::string python_with_torch() {
  std::vector<std::string> candidates;
  if (const char* p = std::getenv("MIXTAPE_PYTHON")) candidates.emplace_back(p);
  candidates.insert(candidates.end(), {"/usr/bin/python3", "python3"});
  for (const auto& py : candidates)
    if (std::system((py + " -c 'import torch' >/dev/null 2>&1").c_str()) == 0) return py;
  return "";
}

/// A deep copy of `sd` (a state_dict's tensors may be the live state).
mt::StateDict copy_of(const mt::StateDict& sd) {
  mt::StateDict out;
  for (const auto& [key, t] : sd) out.insert(key, t.clone());
  return out;
}

/// What a resume restores: TinyRun in fp16 (model, AdamW, GradScaler, the generator) and a schedule with nested
/// ones (linear warm-up for 3 epochs, then cosine), as examples/mnist keeps them.
struct Resumable {
  explicit Resumable(uint64_t seed)
      : run(/*fp16=*/true, seed),
        schedule(run.opt,
                 {std::make_shared<mt::optim::LinearLR>(run.opt, 0.5, 1.0, 3),
                  std::make_shared<mt::optim::CosineAnnealingLR>(run.opt, 10)},
                 {3}) {}
  TinyRun run;
  mt::optim::SequentialLR schedule;
};

}  // namespace

BOOST_AUTO_TEST_SUITE(checkpoint)

BOOST_AUTO_TEST_CASE(parts_step_generator_and_metadata_round_trip, MT_CPU_TEST) {
  TempDir dir;
  Checkpoint c{.step = 1234, .rng = {.seed = 0xFFFF'FFFF'FFFF'FFFFull, .offset = 42}};
  c.parts["model"].insert("fc.weight", mt::randn({3, 4}));
  c.parts["model"].insert("fc.bias", mt::randn({3}).to(mt::kF16));
  c.parts["scaler"];  // a disabled scaler's state is empty: the part must still come back
  c.parts["optimizer"].insert("param_groups.0.lr", mt::full({}, 1e-3, mt::TensorOptions(mt::kF64)));
  c.metadata = {{"epoch", "3"}, {"note", "ünïcode"}};
  save_checkpoint(dir.file("c.safetensors"), c);

  const Checkpoint back = load_checkpoint(dir.file("c.safetensors"));
  BOOST_TEST(back.step == 1234);
  BOOST_TEST(back.rng.seed == c.rng.seed);
  BOOST_TEST(back.rng.offset == c.rng.offset);
  BOOST_TEST((back.metadata == c.metadata));
  BOOST_TEST(back.parts.size() == 3u);
  BOOST_TEST(back.part("scaler").empty());
  expect_same_state(back.part("model"), c.parts["model"], "model");
  expect_same_state(back.part("optimizer"), c.parts["optimizer"], "optimizer");
  expect_error([&] { (void)back.part("scheduler"); }, {"Checkpoint::part", "'scheduler'", "model", "optimizer"});
}

BOOST_AUTO_TEST_CASE(bad_names_and_foreign_files_are_errors, MT_CPU_TEST) {
  TempDir dir;
  const std::string path = dir.file("c.safetensors");
  Checkpoint c;
  c.parts["a.b"];
  expect_error([&] { save_checkpoint(path, c); }, {"save_checkpoint", "part name 'a.b'"});
  c.parts.clear();
  c.parts[""];
  expect_error([&] { save_checkpoint(path, c); }, {"save_checkpoint", "part name ''"});
  c.parts.clear();
  c.metadata["mixtape.step"] = "7";
  expect_error([&] { save_checkpoint(path, c); }, {"save_checkpoint", "'mixtape.step'", "keep for themselves"});
  c.metadata.clear();
  c.step = -1;
  expect_error([&] { save_checkpoint(path, c); }, {"save_checkpoint", "step is -1", "not a count of steps"});
  BOOST_TEST(!fs::exists(path));
  // Refused over an existing checkpoint: that one stays, whole, and no temporary file is left beside it.
  Checkpoint good;
  good.step = 3;
  good.parts["model"].insert("w", mt::ones({2}));
  save_checkpoint(path, good);
  expect_error([&] { save_checkpoint(path, c); }, {"save_checkpoint", "step is -1"});
  c.step = 0;
  c.parts["a.b"];
  expect_error([&] { save_checkpoint(path, c); }, {"save_checkpoint", "part name 'a.b'"});
  c.parts.clear();
  const Checkpoint kept = load_checkpoint(path);
  BOOST_TEST(kept.step == 3);
  BOOST_TEST(kept.part("model").at("w").to_vector<float>() == std::vector<float>({1, 1}));
  BOOST_TEST(dir.entries() == std::vector<std::string>{"c.safetensors"});

  // A safetensors file that is not a checkpoint, and one whose tensors lie outside its listed parts.
  mt::StateDict plain;
  plain.insert("w", mt::zeros({2}));
  mt::data::save_safetensors(path, plain);
  expect_error([&] { (void)load_checkpoint(path); }, {"load_checkpoint", path, "mixtape.step", "not a checkpoint"});
  // A checkpoint's metadata with its step and generator offset as given (the part 'model' holds no tensor 'w').
  auto write = [&](const std::string& step, const std::string& offset) {
    mt::data::save_safetensors(path, plain, {{"mixtape.step", step}, {"mixtape.rng.seed", "1"},
                                             {"mixtape.rng.offset", offset}, {"mixtape.parts", "model"}});
  };
  write("x1", "2");
  expect_error([&] { (void)load_checkpoint(path); }, {"load_checkpoint", "'mixtape.step'", "'x1'", "not an integer"});
  // A number with something after it (from_chars stops at the 'a'), and one too large for the generator's offset.
  write("12abc", "2");
  expect_error([&] { (void)load_checkpoint(path); }, {"load_checkpoint", "'mixtape.step' is '12abc'", "not an integer"});
  write("1", "18446744073709551616");
  expect_error([&] { (void)load_checkpoint(path); }, {"load_checkpoint", "'mixtape.rng.offset'", "not an integer"});
  write("-2", "2");
  expect_error([&] { (void)load_checkpoint(path); }, {"load_checkpoint", "'mixtape.step' is -2", "not a count"});
  write("1", "2");
  expect_error([&] { (void)load_checkpoint(path); }, {"load_checkpoint", "tensor 'w'", "belongs to no part"});
}

BOOST_AUTO_TEST_CASE(an_independent_reader_reads_every_dtype, MT_CPU_TEST) {
  const std::string python = python_with_torch();
  if (python.empty()) {
    BOOST_TEST_MESSAGE("skipping the independent reader: no python3 with torch (MIXTAPE_PYTHON, /usr/bin/python3)");
    return;
  }
  TempDir dir;
  Checkpoint c{.step = 77, .rng = {.seed = 5, .offset = 6}};
  mt::manual_seed(3);
  const Tensor x = mt::randn({2, 3, 4}) * 100.0;
  c.parts["model"].insert("f64", x.to(mt::kF64));
  c.parts["model"].insert("f32", x.transpose(0, 2));  // a view: written in row-major order
  c.parts["model"].insert("f16", x.to(mt::kF16));
  c.parts["model"].insert("bf16", x.to(mt::kBF16));
  c.parts["optimizer"].insert("i64", mt::from_vector<int64_t>({-(int64_t{1} << 40), 0, 7}));
  c.parts["optimizer"].insert("i32", mt::from_vector<int32_t>({-5, 2147483647}));
  c.parts["optimizer"].insert("u8", mt::from_vector<uint8_t>({0, 255, 17}));
  c.parts["optimizer"].insert("bool", mt::from_vector<uint8_t>({1, 0, 1}).to(mt::kBool));
  c.parts["optimizer"].insert("empty", mt::zeros({0, 3}));
  c.parts["optimizer"].insert("scalar", mt::full({}, 2.5));
  c.metadata["epoch"] = "9";
  save_checkpoint(dir.file("c.safetensors"), c);

  nlohmann::json expected;
  expected["metadata"] = {{"epoch", "9"}, {"mixtape.step", "77"}, {"mixtape.rng.seed", "5"},
                          {"mixtape.rng.offset", "6"}, {"mixtape.parts", "model\noptimizer"}};
  const std::map<mt::DType, std::string> names = {
      {mt::kF64, "F64"}, {mt::kF32, "F32"}, {mt::kF16, "F16"}, {mt::kBF16, "BF16"}, {mt::kI64, "I64"},
      {mt::DType::kI32, "I32"}, {mt::DType::kU8, "U8"}, {mt::DType::kBool, "BOOL"}};
  for (const auto& [part, sd] : c.parts)
    for (const auto& [key, t] : sd) {
      std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
      expected["tensors"][part + "." + key] = {{"dtype", names.at(t.dtype())},
                                               {"shape", shape},
                                               {"values", t.to(mt::kF64).contiguous().to_vector<double>()}};
    }
  std::ofstream(dir.file("expected.json")) << expected.dump();
  const std::string command = python + " " + MIXTAPE_TESTS_DIR "/read_checkpoint.py " + dir.file("c.safetensors") +
                              " " + dir.file("expected.json");
  BOOST_TEST(std::system(command.c_str()) == 0, command);
}

BOOST_AUTO_TEST_CASE(resuming_is_bitwise_exact_in_f32_and_f16_with_the_scaler, MT_CPU_TEST) {
  for (const bool fp16 : {false, true}) {
    const std::string what = fp16 ? "f16 + GradScaler" : "f32";
    TempDir dir;
    constexpr int kBefore = 25, kAfter = 25;
    // Straight through, with a checkpoint taken on the way.
    TinyRun straight(fp16);
    for (int i = 0; i < kBefore; ++i) straight.train_step();
    save_checkpoint(dir.file("c.safetensors"), straight.checkpoint());
    for (int i = 0; i < kAfter; ++i) straight.train_step();
    const mt::StateDict want_model = straight.net.state_dict(), want_opt = straight.opt.state_dict();
    const double want_scale = straight.scaler.get_scale();

    // A fresh process's view: other weights, the generator elsewhere; then the checkpoint, and the same steps.
    TinyRun resumed(fp16, /*seed=*/99);
    mt::manual_seed(12345);
    resumed.restore(load_checkpoint(dir.file("c.safetensors")));
    for (int i = 0; i < kAfter; ++i) resumed.train_step();
    expect_same_state(resumed.net.state_dict(), want_model, what + " model");
    expect_same_state(resumed.opt.state_dict(), want_opt, what + " optimizer");
    BOOST_TEST(resumed.scaler.get_scale() == want_scale, what);
    if (fp16) BOOST_TEST(want_scale != 1024.0, "the scale never moved: the test would not cover the scaler's state");

    // Without the generator's state the dropout masks differ, and so do the weights: the test can tell.
    TinyRun no_rng(fp16, 99);
    Checkpoint c = load_checkpoint(dir.file("c.safetensors"));
    no_rng.restore(c);
    mt::manual_seed(12345);
    for (int i = 0; i < kAfter; ++i) no_rng.train_step();
    BOOST_TEST(no_rng.net.fc1.weight.to_vector<float>() != straight.net.fc1.weight.to_vector<float>(), what);
  }
}

BOOST_AUTO_TEST_CASE(a_damaged_checkpoint_is_refused_or_resumes_and_a_refused_part_changes_nothing, MT_CPU_TEST) {
  // A checkpoint of 12 fp16 steps (the scale has grown and backed off) and 4 epochs of schedule, damaged one way at
  // a time: every byte of its JSON header changed three ways, every 8-byte tensor (the optimizer's and the
  // scheduler's options, step counts, the scaler's state) overwritten with awkward numbers. For each, reading the
  // file is a mixtape::Error or a checkpoint; each owner's load_state_dict is then a mixtape::Error that leaves the
  // owner as it was, or a load; and when all four load, training and the schedule go on without an exception.
  TempDir dir;
  const std::string good = dir.file("good.safetensors"), path = dir.file("damaged.safetensors");
  {
    Resumable r(0);
    for (int i = 0; i < 12; ++i) {
      r.run.train_step();
      if (i % 3 == 2) r.schedule.step();
    }
    Checkpoint c = r.run.checkpoint();
    c.parts["scheduler"] = r.schedule.state_dict();
    save_checkpoint(good, c);
  }
  std::vector<char> bytes;
  {
    std::ifstream in(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  uint64_t header_length = 0;
  std::memcpy(&header_length, bytes.data(), 8);
  const auto header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(header_length));

  std::vector<std::pair<std::string, std::vector<char>>> variants;
  for (size_t at = 8; at < 8 + header_length; ++at)
    for (const char to : {static_cast<char>(bytes[at] ^ 1), '9', '-'}) {
      if (to == bytes[at]) continue;
      variants.emplace_back("header byte " + std::to_string(at) + " '" + bytes[at] + "' -> '" + to + "'", bytes);
      variants.back().second[at] = to;
    }
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const int64_t lowest = std::numeric_limits<int64_t>::min(), highest = std::numeric_limits<int64_t>::max();
  int64_t eight_byte_tensors = 0;
  for (const auto& [key, entry] : header.items()) {
    if (key == "__metadata__") continue;
    const auto begin = entry["data_offsets"][0].get<size_t>(), end = entry["data_offsets"][1].get<size_t>();
    if (end - begin != 8) continue;
    ++eight_byte_tensors;
    const size_t at = 8 + header_length + begin;
    auto overwrite = [&](const std::string& value, const void* bits) {
      variants.emplace_back(key + " = " + value, bytes);
      std::memcpy(variants.back().second.data() + at, bits, 8);
    };
    for (const double v : {nan, inf, -inf, 0.0, -0.0, -1.0, 0.5, 1.0, 2.0, 1e308, 4e-320})
      overwrite(std::to_string(v) + " (f64)", &v);
    for (const int64_t v : {int64_t{0}, int64_t{-1}, int64_t{1}, int64_t{2}, int64_t{INT32_MAX},
                            int64_t{INT32_MAX} + 1, lowest, highest})
      overwrite(std::to_string(v) + " (i64)", &v);
  }
  BOOST_TEST_REQUIRE(eight_byte_tensors >= 20, "the file has too few 8-byte tensors to damage");

  int64_t refused_files = 0, refused_loads = 0, resumed = 0;
  for (const auto& [what, damaged] : variants) {
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out.write(damaged.data(), static_cast<std::streamsize>(damaged.size()));
    }
    Checkpoint c;
    try {
      c = load_checkpoint(path);
    } catch (const mt::Error&) {
      ++refused_files;
      continue;
    } catch (const std::exception& e) {
      BOOST_ERROR(what << ": load_checkpoint threw something other than mixtape::Error: " << e.what());
      continue;
    }
    BOOST_TEST(c.step >= 0, what << ": a negative step count was loaded: " << c.step);

    Resumable fresh(99);
    // Loads one part into its owner; a refusal must leave the owner's state as it was.
    auto load = [&](const std::string& part, auto state_of, auto load_into) {
      const mt::StateDict before = copy_of(state_of());
      try {
        load_into(c.part(part));
        return true;
      } catch (const mt::Error&) {
        ++refused_loads;
        expect_same_state(state_of(), before, what + ": the " + part + " after refusing it");
      } catch (const std::exception& e) {
        BOOST_ERROR(what << ": loading the " << part << " threw something other than mixtape::Error: " << e.what());
      }
      return false;
    };
    bool all = load("model", [&] { return fresh.run.net.state_dict(); },
                    [&](const mt::StateDict& sd) { fresh.run.net.load_state_dict(sd); });
    all &= load("optimizer", [&] { return fresh.run.opt.state_dict(); },
                [&](const mt::StateDict& sd) { fresh.run.opt.load_state_dict(sd); });
    all &= load("scaler", [&] { return fresh.run.scaler.state_dict(); },
                [&](const mt::StateDict& sd) { fresh.run.scaler.load_state_dict(sd); });
    all &= load("scheduler", [&] { return fresh.schedule.state_dict(); },
                [&](const mt::StateDict& sd) { fresh.schedule.load_state_dict(sd); });
    if (!all) continue;
    ++resumed;
    try {
      mt::default_generator().set_state(c.rng);
      for (int i = 0; i < 3; ++i) {
        fresh.run.train_step();
        fresh.schedule.step();
      }
    } catch (const std::exception& e) {
      BOOST_ERROR(what << ": every part loaded, then training threw: " << e.what());
    }
  }
  BOOST_TEST_MESSAGE(variants.size() << " damaged checkpoints: " << refused_files << " refused by load_checkpoint, "
                                     << refused_loads << " refusals of a part, " << resumed << " resumed");
  BOOST_TEST(refused_files > 0);
  BOOST_TEST(refused_loads > 0);
  BOOST_TEST(resumed > 0);
}

BOOST_AUTO_TEST_CASE(a_writer_killed_at_random_moments_always_leaves_a_checkpoint_that_resumes, MT_CPU_TEST) {
  TempDir dir;
  const std::string path = dir.file("last.safetensors");
  std::mt19937 rng(2026);
  int64_t last_step = 0, stale_temporaries = 0;
  for (int round = 0; round < 100; ++round) {
    const std::string writer = MIXTAPE_CHECKPOINT_WRITER;
    std::vector<std::string> args = {writer, path, "1000000"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    BOOST_REQUIRE(posix_spawn(&pid, writer.c_str(), nullptr, nullptr, argv.data(), environ) == 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(20, 250)(rng)));
    ::kill(pid, SIGKILL);
    int status = 0;
    BOOST_REQUIRE(::waitpid(pid, &status, 0) == pid);
    BOOST_TEST_REQUIRE((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL),
                       "round " << round << ": the writer ended on its own (status " << status << ")");

    // Under the final name only whole checkpoints; a write cut short leaves its temporary beside it.
    for (const auto& e : fs::directory_iterator(dir.path)) {
      const std::string name = e.path().filename().string();
      if (name == "last.safetensors") continue;
      BOOST_TEST_REQUIRE(name.rfind("last.safetensors.tmp.", 0) == 0, "round " << round << ": stray file " << name);
      ++stale_temporaries;
      fs::remove(e.path());
    }
    if (!fs::exists(path)) continue;  // killed before its first save
    Checkpoint c;
    BOOST_REQUIRE_NO_THROW(c = load_checkpoint(path));
    BOOST_TEST_REQUIRE(c.step >= last_step, "round " << round << ": the checkpoint went back to step " << c.step);
    last_step = c.step;
  }
  BOOST_TEST_MESSAGE("100 kills: the last checkpoint at step " << last_step << ", " << stale_temporaries
                                                               << " writes cut short");
  BOOST_TEST(last_step > 100, "the writers made too little progress for the test to mean much");
  TinyRun run(false);
  run.restore(load_checkpoint(path));
  run.train_step();  // and training goes on from there
  BOOST_TEST(run.step == last_step + 1);
}

BOOST_AUTO_TEST_SUITE_END()
