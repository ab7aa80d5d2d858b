// tests/test_cuda_allocator.cpp — the caching allocator, streams and events, asynchronous copies and the
// runtime's debug counters.
//
// The allocator is observed through cuda::memory_stats: a freed block must come back without a cudaMalloc,
// sizes must round to their class, the cache must empty and out-of-memory must leave the process usable.
// Each case starts from an empty cache so that its counts do not depend on the cases before it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <mixtape/cuda/testing.h>
#include <mixtape/core/tensor.h>
#include <mixtape/cuda/runtime.h>
#include <mixtape/cuda/stream.h>

#include "test_util.h"

namespace mt = mixtape;
namespace cu = mixtape::cuda;
using mt::Device;
using mt::Tensor;
using mt::TensorOptions;

namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

TensorOptions on_gpu(mt::DType dtype = mt::kF32) { return TensorOptions(dtype).device(Device::cuda()); }

bool mentions(const mt::Error& e, const std::string& text) {
  return std::string(e.what()).find(text) != std::string::npos;
}

/// Turns poisoning on for a scope, and off again even when a check throws.
struct PoisonScope {
  PoisonScope() { cu::set_poison_allocations(true); }
  ~PoisonScope() { cu::set_poison_allocations(false); }
};

}  // namespace

// ---- what every machine must do ----------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(cuda_allocator_cpu, *boost::unit_test::label("cpu"))

BOOST_AUTO_TEST_CASE(statistics_and_controls_never_throw) {
  BOOST_CHECK_NO_THROW(cu::memory_stats());
  BOOST_CHECK_NO_THROW(cu::memory_stats(0));
  BOOST_CHECK_NO_THROW(cu::memory_stats(1000));
  BOOST_CHECK_NO_THROW(cu::reset_peak_memory_stats());
  BOOST_CHECK_NO_THROW(cu::debug_counters());
  BOOST_CHECK_NO_THROW(cu::reset_debug_counters());
  BOOST_CHECK_NO_THROW(cu::set_poison_allocations(false));
  BOOST_CHECK_NO_THROW(cu::Stream());
  BOOST_TEST(cu::memory_stats(1000).reserved_bytes == 0);  // a device nobody used
  cu::Event never_recorded;
  BOOST_TEST(!never_recorded.recorded());
  BOOST_TEST(never_recorded.query());
  BOOST_CHECK_NO_THROW(never_recorded.synchronize());
  if (!cu::is_available()) {
    // Nothing was ever allocated or copied, and asking for a stream is a clear error.
    BOOST_CHECK_NO_THROW(cu::empty_cache());
    const cu::MemoryStats s = cu::memory_stats();
    BOOST_TEST(s.allocated_bytes == 0);
    BOOST_TEST(s.reserved_bytes == 0);
    BOOST_TEST(s.num_cuda_malloc == 0);
    BOOST_TEST(cu::debug_counters().device_to_host_copies == 0);
    auto mentions_cuda = [](const mt::Error& e) { return mentions(e, "CUDA"); };
    BOOST_CHECK_EXCEPTION(cu::current_stream(), mt::Error, mentions_cuda);
    BOOST_CHECK_EXCEPTION(cu::Stream::create(), mt::Error, mentions_cuda);
    BOOST_CHECK_EXCEPTION(cu::StreamGuard{cu::Stream()}, mt::Error, mentions_cuda);
    BOOST_CHECK_EXCEPTION(never_recorded.record(), mt::Error, mentions_cuda);
  }
}

BOOST_AUTO_TEST_SUITE_END()

// ---- the device ------------------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(cuda_allocator_gpu)

BOOST_AUTO_TEST_CASE(freed_block_is_reused_without_cuda_malloc, MT_GPU_TEST) {
  cu::empty_cache();
  const cu::MemoryStats s0 = cu::memory_stats(0);
  void* first = nullptr;
  {
    const Tensor t = mt::empty({1000}, on_gpu());
    first = t.data_ptr();
  }
  const cu::MemoryStats s1 = cu::memory_stats(0);
  BOOST_TEST(s1.num_cuda_malloc == s0.num_cuda_malloc + 1);
  BOOST_TEST(s1.allocated_bytes == s0.allocated_bytes);
  BOOST_TEST(s1.reserved_bytes == s0.reserved_bytes + 4096);  // 4000 bytes round up to 8 x 512
  const Tensor again = mt::empty({1000}, on_gpu());
  const cu::MemoryStats s2 = cu::memory_stats(0);
  BOOST_TEST(again.data_ptr() == first);
  BOOST_TEST(s2.num_cuda_malloc == s1.num_cuda_malloc);
  BOOST_TEST(s2.num_cache_hits == s1.num_cache_hits + 1);
  BOOST_TEST(s2.allocated_bytes == s0.allocated_bytes + 4096);
}

BOOST_AUTO_TEST_CASE(requests_round_to_their_size_class, MT_GPU_TEST) {
  cu::empty_cache();
  struct Case {
    int64_t bytes, expect;
  };
  const Case cases[] = {
      {0, 512},  {1, 512},  {512, 512}, {513, 1024}, {kMiB - 1, kMiB}, {kMiB, kMiB}, {kMiB + 1, 2 * kMiB},
      {2 * kMiB, 2 * kMiB}, {3 * kMiB, 4 * kMiB}, {9 * kMiB + 7, 10 * kMiB},
  };
  std::vector<Tensor> alive;  // held, so that no case is served from another's freed block
  const int64_t start = cu::memory_stats(0).requested_bytes;
  for (const Case& c : cases) {
    const cu::MemoryStats before = cu::memory_stats(0);
    alive.push_back(mt::empty({c.bytes}, on_gpu(mt::kU8)));
    const cu::MemoryStats after = cu::memory_stats(0);
    BOOST_TEST(after.allocated_bytes - before.allocated_bytes == c.expect, "a request of " << c.bytes << " bytes");
    BOOST_TEST(after.requested_bytes - before.requested_bytes == c.bytes, "a request of " << c.bytes << " bytes");
  }
  const cu::MemoryStats s = cu::memory_stats(0);
  BOOST_TEST(s.reserved_bytes == s.allocated_bytes);  // everything reserved is in use
  alive.clear();
  BOOST_TEST(cu::memory_stats(0).requested_bytes == start);  // each free gave back what its tensor asked for
}

BOOST_AUTO_TEST_CASE(peak_is_tracked_and_reset, MT_GPU_TEST) {
  cu::empty_cache();
  cu::reset_peak_memory_stats(0);
  const int64_t base = cu::memory_stats(0).allocated_bytes;
  BOOST_TEST(cu::memory_stats(0).peak_allocated_bytes == base);
  const cu::MemoryStats before = cu::memory_stats(0);
  BOOST_TEST(before.peak_requested_bytes == before.requested_bytes);
  BOOST_TEST(before.peak_reserved_bytes == before.reserved_bytes);
  { const Tensor big = mt::empty({8 * kMiB + 100}, on_gpu(mt::kU8)); }  // a block of 10 MiB, new: the cache was emptied
  const cu::MemoryStats after = cu::memory_stats(0);
  BOOST_TEST(after.allocated_bytes == base);
  BOOST_TEST(after.peak_allocated_bytes == base + 10 * kMiB);
  BOOST_TEST(after.peak_requested_bytes == before.requested_bytes + 8 * kMiB + 100);
  BOOST_TEST(after.peak_reserved_bytes == before.reserved_bytes + 10 * kMiB);
  BOOST_TEST(after.reserved_bytes == before.reserved_bytes + 10 * kMiB);  // cached
  cu::empty_cache();
  cu::reset_peak_memory_stats(0);
  const cu::MemoryStats reset = cu::memory_stats(0);
  BOOST_TEST(reset.peak_allocated_bytes == base);
  BOOST_TEST(reset.peak_requested_bytes == reset.requested_bytes);
  BOOST_TEST(reset.peak_reserved_bytes == reset.reserved_bytes);
}

BOOST_AUTO_TEST_CASE(empty_cache_returns_reserved_to_allocated, MT_GPU_TEST) {
  const Tensor kept = mt::full({1234}, 5.0, on_gpu());
  {
    const Tensor a = mt::empty({3 * kMiB}, on_gpu(mt::kU8));
    const Tensor b = mt::empty({100}, on_gpu());
  }
  BOOST_TEST(cu::memory_stats(0).reserved_bytes > cu::memory_stats(0).allocated_bytes);
  cu::empty_cache();
  const cu::MemoryStats s = cu::memory_stats(0);
  BOOST_TEST(s.reserved_bytes == s.allocated_bytes);
  BOOST_TEST(kept.to_vector<float>() == std::vector<float>(1234, 5.0f), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(out_of_memory_names_the_request_and_recovers, MT_GPU_TEST MT_OOM_TEST) {
  const Tensor kept = mt::full({4096}, -1.5, on_gpu());
  { const Tensor cached = mt::empty({4 * kMiB}, on_gpu(mt::kU8)); }  // a block in the cache, freed by the retry
  const int64_t too_many = static_cast<int64_t>(cu::device_properties(0).total_memory) * 2;
  BOOST_CHECK_EXCEPTION(mt::empty({too_many}, on_gpu(mt::kU8)), mt::Error, [&](const mt::Error& e) {
    BOOST_TEST_MESSAGE("out-of-memory error: " << e.what());
    return mentions(e, "out of memory") && mentions(e, std::to_string(too_many)) && mentions(e, "cuda:0");
  });
  const cu::MemoryStats s = cu::memory_stats(0);
  BOOST_TEST(s.reserved_bytes == s.allocated_bytes);  // the cache was freed before the retry
  const Tensor small = mt::full({16}, 3.0, on_gpu());
  BOOST_TEST(small.to_vector<float>() == std::vector<float>(16, 3.0f), boost::test_tools::per_element());
  BOOST_TEST(kept.to_vector<float>() == std::vector<float>(4096, -1.5f), boost::test_tools::per_element());
  BOOST_CHECK_NO_THROW(cu::synchronize());
}

BOOST_AUTO_TEST_CASE(reuse_across_streams_waits_for_the_free_event, MT_GPU_TEST) {
  cu::empty_cache();
  const cu::Stream s1 = cu::Stream::create(), s2 = cu::Stream::create();
  BOOST_TEST(!(s1 == s2));
  BOOST_TEST((cu::current_stream() == cu::Stream::legacy_default()));
  const int64_t n = kMiB;  // 4 MiB of f32
  void* block = nullptr;
  {
    cu::StreamGuard on(s1);
    BOOST_TEST((cu::current_stream() == s1));
    const Tensor a = mt::full({n}, 1.0, on_gpu());
    block = a.data_ptr();
  }
  BOOST_TEST((cu::current_stream() == cu::Stream::legacy_default()));  // the guard restored it
  {
    // Same stream: taken back at once, whatever s1 still has queued.
    cu::StreamGuard on(s1);
    const Tensor b = mt::empty({n}, on_gpu());
    BOOST_TEST(b.data_ptr() == block);
  }
  {
    // Another stream, with s1 busy: the block may be taken only if its free event completed, which s1 still
    // being busy after the allocation rules out.
    Tensor busy = mt::empty({128 * kMiB}, on_gpu());  // 512 MiB: each fill takes a good fraction of a millisecond
    {
      cu::StreamGuard on(s1);
      for (int i = 0; i < 20; ++i) busy.fill_(i);
      const Tensor c = mt::empty({n}, on_gpu());
      BOOST_TEST(c.data_ptr() == block);
    }
    cu::StreamGuard on(s2);
    const Tensor d = mt::empty({n}, on_gpu());
    if (!s1.query()) {
      BOOST_TEST(d.data_ptr() != block, "s2 took a block whose last use on s1 has not run yet");
    } else {
      BOOST_TEST_MESSAGE("s1 finished before the check: the busy case was not observed");
    }
    s1.synchronize();
  }
  {
    // Once s1 is done, s2 may take s1's block.
    s1.synchronize();
    const int64_t hits = cu::memory_stats(0).num_cache_hits;
    cu::StreamGuard on(s2);
    const Tensor e = mt::empty({n}, on_gpu());
    BOOST_TEST(cu::memory_stats(0).num_cache_hits == hits + 1);
  }
  // Events order work between streams without the host: s2 reads what s1 wrote.
  Tensor x = mt::empty({n}, on_gpu());
  cu::Event written(/*timing=*/true), start(/*timing=*/true);
  {
    cu::StreamGuard on(s1);
    start.record();
    x.fill_(7.0);
    written.record();
  }
  written.wait(s2);
  Tensor y;
  {
    cu::StreamGuard on(s2);
    y = x.to(mt::kF16);
    y = y.to(Device::cpu());  // waits for s2 only
  }
  BOOST_TEST(y.to(mt::kF32).to_vector<float>() == std::vector<float>(static_cast<size_t>(n), 7.0f),
             boost::test_tools::per_element());
  written.synchronize();
  BOOST_TEST(written.query());
  BOOST_TEST(start.elapsed_ms(written) >= 0.0f);
  cu::synchronize();
}

BOOST_AUTO_TEST_CASE(streams_come_from_a_pool_of_32, MT_GPU_TEST) {
  std::vector<cu::Stream> streams;
  for (int i = 0; i < 33; ++i) streams.push_back(cu::Stream::create());
  for (size_t i = 0; i < 32; ++i)
    for (size_t j = i + 1; j < 32; ++j) BOOST_TEST(!(streams[i] == streams[j]), "requests " << i << " and " << j);
  BOOST_TEST((streams[32] == streams[0]), "the 33rd request gets the first stream again");
}

BOOST_AUTO_TEST_CASE(a_block_outlives_the_stream_object_it_was_made_on, MT_GPU_TEST) {
  // The allocator records a freed block's event on the stream the block was last used on, once the device has
  // seen two streams; that stream must still exist when the tensor dies after every Stream naming it went.
  const int64_t n = kMiB;
  Tensor kept;
  {
    const cu::Stream made_on = cu::Stream::create();
    cu::StreamGuard on(made_on);
    kept = mt::full({n}, 2.0, on_gpu());
  }
  {
    cu::StreamGuard on(cu::Stream::create());  // another stream: frees record events from now on
    const Tensor other = mt::full({n}, 3.0, on_gpu());
  }
  kept = Tensor();  // records the block's free event on made_on's stream (once destroyed with made_on: a dead handle)
  BOOST_CHECK_NO_THROW(cu::synchronize());
  const Tensor again = mt::full({n}, 4.0, on_gpu());  // the cache's blocks, events included, still serve
  BOOST_TEST(again.to_vector<float>() == std::vector<float>(static_cast<size_t>(n), 4.0f),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(async_round_trip_is_bit_exact, MT_GPU_TEST) {
  std::mt19937 rng(1234);
  const cu::Stream side = cu::Stream::create();
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1023}, int64_t{65537}, int64_t{1} << 24}) {
    for (bool on_side_stream : {false, true}) {
      std::vector<int32_t> host(static_cast<size_t>(n));
      for (auto& v : host) v = static_cast<int32_t>(rng());
      const std::vector<int32_t> want = host;
      std::vector<int32_t> got;
      {
        cu::StreamGuard on(on_side_stream ? side : cu::current_stream());
        Tensor src = mt::from_vector(host, {n}, TensorOptions(mt::kI32));
        const Tensor dev = src.to(Device::cuda());
        // The upload was staged: the caller may overwrite its memory before the device has the bytes.
        if (n) std::memset(src.data_ptr(), 0xAB, static_cast<size_t>(n) * sizeof(int32_t));
        got = dev.to_vector<int32_t>();
      }
      BOOST_TEST_REQUIRE(got.size() == want.size());
      const bool same = n == 0 || std::memcmp(got.data(), want.data(), want.size() * sizeof(int32_t)) == 0;
      BOOST_TEST(same, "round trip of " << n << " i32 on the " << (on_side_stream ? "side" : "default")
                                        << " stream");
    }
  }
}

BOOST_AUTO_TEST_CASE(debug_counters_count_copies_to_the_host_and_waits, MT_GPU_TEST) {
  const Tensor t = mt::full({16}, 2.0, on_gpu());
  cu::synchronize();
  cu::reset_debug_counters();
  // Work that stays on the device waits for nothing.
  const Tensor h = t.to(mt::kF16);
  Tensor u = mt::empty({16}, on_gpu());
  u.copy_(h);
  BOOST_TEST(cu::debug_counters().device_to_host_copies == 0);
  BOOST_TEST(cu::debug_counters().synchronizations == 0);
  const Tensor back = u.cpu();
  BOOST_TEST(cu::debug_counters().device_to_host_copies == 1);
  BOOST_TEST(cu::debug_counters().synchronizations >= 1);
  BOOST_TEST(back.to_vector<float>() == std::vector<float>(16, 2.0f), boost::test_tools::per_element());
  cu::reset_debug_counters();
  cu::synchronize();
  BOOST_TEST(cu::debug_counters().synchronizations == 1);
  BOOST_TEST(cu::debug_counters().device_to_host_copies == 0);
}

BOOST_AUTO_TEST_CASE(poisoned_allocations_read_back_as_nan, MT_GPU_TEST) {
  {
    PoisonScope poison;
    for (mt::DType dtype : {mt::kF32, mt::kF16, mt::kBF16, mt::kF64}) {
      const Tensor fresh = mt::empty({1000}, on_gpu(dtype));
      const std::vector<double> values = fresh.to_vector<double>();
      BOOST_TEST(std::all_of(values.begin(), values.end(), [](double v) { return std::isnan(v); }),
                 "a fresh " << mt::dtype_name(dtype) << " tensor");
    }
    // Written outputs are not NaN: poisoning happens before the kernels that write.
    BOOST_TEST(mt::full({5}, 1.0, on_gpu()).to_vector<float>() == std::vector<float>(5, 1.0f),
               boost::test_tools::per_element());
  }
  const Tensor clean = mt::zeros({8}, on_gpu());
  BOOST_TEST(clean.to_vector<float>() == std::vector<float>(8, 0.0f), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_SUITE_END()
