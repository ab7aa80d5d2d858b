// tests/test_cuda_graph.cpp — cuda::Graph (cuda/graph.h): capture once, replay on new inputs.
//
// Without a GPU: a capture is a clear error. On a GPU: a replay computes what eager code computes on the same
// inputs, bit for bit (the same kernels on the same memory); the graph's memory stays its own until it dies, and
// so do the blocks its capture freed (another graph's output too); replayed dropout draws the masks eager calls
// would have drawn, from the same default generator, also when replays alternate between streams, and draws
// beside a capture (another thread's) keep their counters; what a graph cannot replay (a copy to the host, a host
// wait, a draw from another generator, even a twin of the default one, a replay inside a capture, a draw after a
// new seed) is refused and leaves the thread and the allocator as they were; and a whole mixed
// precision training step — autocast forward, scaled backward, unscale, AdamW on the device, the scale's update —
// replayed step after step trains exactly as the eager steps do, including the steps the scaler skips, without a
// host read or wait; learning-rate schedules stepped between replays reach them (AdamW under OneCycleLR, SGD under
// cosine), and a replay whose optimizer died or changed an option that chose the captured kernels is refused.
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <mixtape/cuda/stream.h>
#include <mixtape/mixtape.h>

#include "compare.h"
#include "reference.h"
#include "test_util.h"

namespace mt = mixtape;
namespace cu = mixtape::cuda;
using mt::Device;
using mt::DType;
using mt::Tensor;
using mt::TensorOptions;
using mt::test::expect_error;
using mt::test::expect_same_bits;
using mt::test::gpu;

namespace {

Tensor randn_gpu(const mt::Shape& shape, uint64_t seed) {
  return gpu(mt::test::randn_seeded(shape, DType::kF32, seed));
}

/// The small computation the graph cases capture: relu(x·w + 1) summed over rows, with temporaries.
Tensor small_net(const Tensor& x, const Tensor& w) { return mt::sum(mt::relu(mt::matmul(x, w) + 1.0), {0}); }

/// A 784-256-10 MLP's training step under fp16 autocast with the GradScaler and AdamW: what examples/mnist
/// --cuda-graph captures.
struct AmpTrainer {
  bool seeded;  // first: the layers below draw their weights after manual_seed
  mt::nn::Linear fc1{784, 256}, fc2{256, 10};
  std::unique_ptr<mt::optim::AdamW> opt;
  mt::amp::GradScaler scaler{{.init_scale = 65536.0, .growth_interval = 3}};

  explicit AmpTrainer(uint64_t seed) : seeded((mt::manual_seed(seed), true)) {
    fc1.to(Device::cuda());
    fc2.to(Device::cuda());
    opt = std::make_unique<mt::optim::AdamW>(parameters(), mt::optim::AdamWOptions{.lr = 1e-3});
  }
  std::vector<Tensor> parameters() const { return {fc1.weight, fc1.bias, fc2.weight, fc2.bias}; }

  Tensor step(const Tensor& x, const Tensor& y) {
    opt->zero_grad();
    Tensor loss;
    {
      mt::amp::Autocast ac(mt::kF16);
      loss = mt::cross_entropy(fc2(mt::relu(fc1(x))), y);
    }
    scaler.scale(loss).backward();
    scaler.step_on_device(*opt);
    scaler.update();
    return loss;
  }
};

/// Batch k of the AMP cases: N(0, 1) images, labels k·i mod 10; batch 5's images are huge, so that its f16
/// activations overflow and the scaler skips its step (and backs off).
std::pair<Tensor, Tensor> batch(int k) {
  Tensor x = randn_gpu({64, 784}, 1000 + static_cast<uint64_t>(k));
  if (k == 5) x = x * 1e6;
  std::vector<int64_t> labels(64);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>((static_cast<size_t>(k) * i) % 10);
  return {x, gpu(mt::from_vector<int64_t>(labels, {64}))};
}

}  // namespace

// ---- what every machine must do ----------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(cuda_graph_cpu, *boost::unit_test::label("cpu"))

BOOST_AUTO_TEST_CASE(a_graph_without_cuda_is_a_clear_error,
                     *boost::unit_test::precondition(mt::test::cuda_unavailable())) {
  cu::Graph graph;
  BOOST_TEST(!graph.captured());
  BOOST_TEST(graph.node_count() == 0u);
  bool ran = false;
  expect_error([&] { graph.capture([&] { ran = true; }); }, {"cuda::Graph::capture", "CUDA"});
  BOOST_TEST(!ran, "the body of a capture that cannot happen does not run");
  expect_error([&] { graph.replay(); }, {"cuda::Graph::replay", "nothing was captured"});
}

BOOST_AUTO_TEST_SUITE_END()

// ---- on a GPU ----------------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(cuda_graph_gpu)

BOOST_AUTO_TEST_CASE(a_replay_computes_what_eager_code_computes_on_new_inputs, MT_GPU_TEST) {
  Tensor x = randn_gpu({96, 40}, 1);
  const Tensor w = randn_gpu({40, 24}, 2);
  (void)small_net(x, w);  // warm up: one-time queries happen eagerly
  cu::Graph graph;
  Tensor out;
  graph.capture([&] { out = small_net(x, w); });
  BOOST_TEST(graph.captured());
  BOOST_TEST(graph.node_count() >= 3u);  // the product, the add-relu, the sum at least
  for (uint64_t round = 0; round < 3; ++round) {
    x.copy_(randn_gpu({96, 40}, 10 + round));  // the next input, into the graph's input tensor
    graph.replay();
    expect_same_bits(out, small_net(x, w), mt::test::describe("replay ", round, " vs eager"));
  }
  // Replays allocate nothing: their memory was set aside at the capture.
  cu::synchronize();
  const cu::MemoryStats before = cu::memory_stats();
  for (int i = 0; i < 5; ++i) graph.replay();
  cu::synchronize();
  const cu::MemoryStats after = cu::memory_stats();
  BOOST_TEST(after.allocated_bytes == before.allocated_bytes);
  BOOST_TEST(after.num_cuda_malloc == before.num_cuda_malloc);
  BOOST_TEST(after.num_cache_hits == before.num_cache_hits);
  expect_error([&] { graph.capture([] {}); }, {"cuda::Graph::capture", "captured once"});
}

BOOST_AUTO_TEST_CASE(a_graphs_memory_is_its_own_until_it_dies, MT_GPU_TEST) {
  cu::synchronize();
  cu::empty_cache();
  const Tensor x = randn_gpu({1, 12347}, 3);  // a size class of its own
  void* temporary = nullptr;
  Tensor out;
  {
    cu::Graph graph;
    graph.capture([&] {
      const Tensor t = x * 2.0;  // dies inside the capture; the graph writes it at every replay
      temporary = t.data_ptr();
      out = t + 1.0;
    });
    graph.replay();
    // While the graph lives, nobody else gets the temporary's memory.
    std::vector<Tensor> others;
    for (int i = 0; i < 4; ++i) {
      others.push_back(mt::empty({1, 12347}, TensorOptions(DType::kF32).device(Device::cuda())));
      BOOST_TEST(others.back().data_ptr() != temporary);
    }
    expect_same_bits(out, x * 2.0 + 1.0, "the graph's output");
  }
  // The graph is gone: its memory is the cache's again (among the cached blocks of the class, taken before any new
  // cudaMalloc).
  const int64_t mallocs = cu::memory_stats().num_cuda_malloc;
  std::vector<Tensor> from_cache;
  bool found = false;
  while (!found && cu::memory_stats().num_cuda_malloc == mallocs) {
    from_cache.push_back(mt::empty({1, 12347}, TensorOptions(DType::kF32).device(Device::cuda())));
    found = from_cache.back().data_ptr() == temporary;
  }
  BOOST_TEST(found, "the temporary's block came back from the cache");
  expect_same_bits(out, x * 2.0 + 1.0, "an output kept past its graph");
}

BOOST_AUTO_TEST_CASE(blocks_a_capture_frees_stay_reserved_while_it_lives, MT_GPU_TEST) {
  cu::synchronize();
  cu::empty_cache();
  const auto same_class = [] { return mt::empty({1, 12347}, TensorOptions(DType::kF32).device(Device::cuda())); };
  const Tensor x = randn_gpu({1, 12347}, 3);
  auto first = std::make_unique<cu::Graph>();
  Tensor first_out;
  first->capture([&] { first_out = x * 2.0; });  // a block of the first graph's pool
  first->replay();
  Tensor y = randn_gpu({1, 12347}, 4);  // an ordinary block, made before the next capture
  const Tensor expected = x * 2.0 + y;
  void* const reserved[] = {first_out.data_ptr(), y.data_ptr()};
  cu::Graph second;
  Tensor out;
  second.capture([&] {
    out = first_out + y;  // reads both, then drops both: its replays read them still
    first_out = Tensor();
    y = Tensor();
  });
  first.reset();  // the first graph dies; its block is the second graph's input
  // Every block the cache holds in this size class, down to a new cudaMalloc: none is a reserved one.
  const int64_t mallocs = cu::memory_stats().num_cuda_malloc;
  std::vector<Tensor> taken;
  while (cu::memory_stats().num_cuda_malloc == mallocs) {
    taken.push_back(same_class());
    for (void* r : reserved) BOOST_TEST(taken.back().data_ptr() != r);
  }
  for (Tensor& t : taken) t.fill_(-1.0);  // whoever took a reserved block would overwrite the inputs here
  second.replay();
  expect_same_bits(out, expected, "the second graph's replay reads the blocks it reserved");
  taken.clear();
}

BOOST_AUTO_TEST_CASE(replays_on_two_streams_run_one_after_the_other, MT_GPU_TEST) {
  const Tensor x = randn_gpu({256, 1024}, 8);
  const mt::GeneratorState start = mt::default_generator().state();
  std::vector<Tensor> eager;
  for (int i = 0; i < 4; ++i) eager.push_back(mt::dropout(x, 0.3, true) * 2.0);
  mt::default_generator().set_state(start);
  cu::Graph graph;
  Tensor out;
  graph.capture([&] { out = mt::dropout(x, 0.3, true) * 2.0; });
  const cu::Stream streams[] = {cu::Stream::create(), cu::Stream::create()};
  cu::synchronize();  // x and the graph's first inputs were made on the legacy stream, which these do not follow
  std::vector<Tensor> replayed;
  for (size_t i = 0; i < eager.size(); ++i) {
    cu::StreamGuard on(streams[i % 2]);
    graph.replay();                   // after the last replay and the copy of its output on the other stream
    replayed.push_back(out.clone());  // on this replay's stream, before the next replay
  }
  cu::synchronize();
  for (size_t i = 0; i < eager.size(); ++i)
    expect_same_bits(replayed[i], eager[i], mt::test::describe("replay ", i, " vs eager draw ", i));
}

BOOST_AUTO_TEST_CASE(a_replay_inside_a_capture_or_after_a_new_seed_is_refused, MT_GPU_TEST) {
  const Tensor x = randn_gpu({16, 16}, 6);
  const mt::GeneratorState at_capture = mt::default_generator().state();
  cu::Graph graph;
  Tensor out;
  graph.capture([&] { out = mt::dropout(x, 0.5, true); });
  cu::Graph outer;
  expect_error([&] { outer.capture([&] { graph.replay(); }); }, {"cuda::Graph::replay", "capturing a graph"});
  BOOST_TEST(!outer.captured());
  mt::manual_seed(at_capture.seed + 1);
  expect_error([&] { graph.replay(); }, {"cuda::Graph::replay", "seeded anew", "capture again"});
  mt::default_generator().set_state(at_capture);  // the capture's seed again: replays go on
  graph.replay();
  mt::default_generator().set_state(at_capture);
  expect_same_bits(out, mt::dropout(x, 0.5, true), "a replay after the seed came back vs the same eager draw");
}

BOOST_AUTO_TEST_CASE(replayed_dropout_draws_the_masks_eager_dropout_would, MT_GPU_TEST) {
  Tensor x = randn_gpu({33, 129}, 5);
  const mt::GeneratorState start = mt::default_generator().state();
  std::vector<Tensor> eager;
  for (int i = 0; i < 3; ++i) eager.push_back(mt::dropout(x, 0.3, true));
  const mt::GeneratorState after_eager = mt::default_generator().state();

  mt::default_generator().set_state(start);
  cu::Graph graph;
  Tensor out;
  graph.capture([&] { out = mt::dropout(x, 0.3, true) * 2.0; });
  BOOST_TEST((mt::default_generator().state() == start), "a capture takes no counters: nothing ran");
  for (int i = 0; i < 3; ++i) {
    graph.replay();
    expect_same_bits(out, eager[static_cast<size_t>(i)] * 2.0, mt::test::describe("replay ", i, " vs eager draw ", i));
  }
  BOOST_TEST((mt::default_generator().state() == after_eager), "each replay took its masks' counters");
}

BOOST_AUTO_TEST_CASE(draws_beside_a_capture_keep_their_counters, MT_GPU_TEST) {
  // Another thread draws from the default generator between two captured dropouts: the capture does not give the
  // generator back (those counters were used), and each replay draws counters that nobody else had, where the
  // captured draws sat relative to each other.
  const Tensor x = randn_gpu({16, 64}, 9);  // 1024 counters a mask
  const mt::GeneratorState start = mt::default_generator().state();
  cu::Graph graph;
  Tensor a, b;
  uint64_t beside = 0;
  graph.capture([&] {
    a = mt::dropout(x, 0.5, true);
    std::thread([&] { beside = mt::default_generator().advance(100); }).join();
    b = mt::dropout(x, 0.5, true);
  });
  BOOST_TEST(beside == start.offset + 1024);
  const mt::GeneratorState captured = mt::default_generator().state();
  BOOST_TEST((captured == mt::GeneratorState{start.seed, start.offset + 2148}),
             "not given back: another draw sat there");
  for (int i = 0; i < 2; ++i) {
    const mt::GeneratorState before = mt::default_generator().state();
    graph.replay();
    BOOST_TEST(mt::default_generator().offset() == before.offset + 2148, "a replay reserves the capture's span");
    mt::Generator at;
    at.set_state(before);
    expect_same_bits(a, mt::dropout(x, 0.5, true, &at), mt::test::describe("replay ", i, ", first mask"));
    at.set_state({before.seed, before.offset + 1124});
    expect_same_bits(b, mt::dropout(x, 0.5, true, &at), mt::test::describe("replay ", i, ", second mask"));
  }

  // A CPU draw on the capturing thread runs once, at the capture: its counters stay taken too.
  const mt::GeneratorState before_cpu = mt::default_generator().state();
  cu::Graph with_cpu_draw;
  with_cpu_draw.capture([&] {
    a = mt::dropout(x, 0.5, true);
    (void)mt::randn({5});
  });
  BOOST_TEST(mt::default_generator().offset() == before_cpu.offset + 1029, "the CPU draw's counters are not reused");
}

BOOST_AUTO_TEST_CASE(what_a_graph_cannot_replay_is_refused, MT_GPU_TEST) {
  const Tensor x = randn_gpu({8, 8}, 4);
  const cu::Stream other_stream = cu::Stream::create();  // made before: a capture refuses switching to it
  struct Refused {
    std::string name, message;
    std::function<void()> body;
  };
  const std::vector<Refused> refused = {
      {"item()", "copy from a CUDA device to the host", [&] { (void)mt::sum(x).item<float>(); }},
      {"a tensor from the host", "copy from the host", [&] { (void)gpu(mt::ones({3})); }},
      {"synchronize", "host wait", [] { cu::synchronize(); }},
      {"a stream query", "cuda::Stream::query", [] { (void)cu::current_stream().query(); }},
      {"randperm", "randperm", [] { (void)mt::randperm(10, Device::cuda()); }},
      {"a stream switch", "a switch to another stream", [&] { cu::StreamGuard on(other_stream); }},
      {"dropout from another generator", "a generator other than the default one",
       [&] {
         mt::Generator other(99);
         (void)mt::dropout(x, 0.5, true, &other);
       }},
      {"dropout from a twin of the default generator", "a generator other than the default one",
       [&] {  // the same seed and offset: only which generator it is tells them apart
         mt::Generator twin;
         twin.set_state(mt::default_generator().state());
         (void)mt::dropout(x, 0.5, true, &twin);
       }},
  };
  for (const Refused& r : refused) {
    BOOST_TEST_CONTEXT(r.name) {
      cu::Graph graph;
      expect_error([&] { graph.capture([&] { (void)(x + 1.0); r.body(); }); }, {"cuda::Graph::capture", r.message});
      BOOST_TEST(!graph.captured());
      // The thread is out of the capture: eager work and a new capture go on.
      expect_same_bits(mt::raw::to(x + 1.0, Device::cpu()), mt::raw::to(x, Device::cpu()) + 1.0, "eager work after");
      cu::Graph next;
      Tensor y;
      next.capture([&] { y = x * 3.0; });
      next.replay();
      expect_same_bits(y, x * 3.0, "a capture after the refused one");
    }
  }
  // An exception of the body's own passes through, and leaves no capture behind.
  cu::Graph graph;
  BOOST_CHECK_THROW(graph.capture([] { throw std::out_of_range("the body's"); }), std::out_of_range);
  BOOST_TEST(!graph.captured());
  BOOST_TEST(mt::sum(x * 0.0).item<float>() == 0.0f);
}

BOOST_AUTO_TEST_CASE(a_replayed_amp_step_trains_as_eager_steps_do, MT_GPU_TEST) {
  AmpTrainer eager(7), graphed(7);
  for (int k = 0; k < 3; ++k) {  // warm-up: optimizer and scaler state
    const auto [x, y] = batch(k);
    eager.step(x, y);
    graphed.step(x, y);
  }
  const auto [x0, y0] = batch(3);
  Tensor static_x = x0.clone(), static_y = y0.clone();
  cu::Graph graph;
  Tensor static_loss;
  graph.capture([&] { static_loss = graphed.step(static_x, static_y); });
  cu::synchronize();
  cu::reset_debug_counters();
  for (int k = 3; k < 12; ++k) {
    BOOST_TEST_CONTEXT("step " << k) {
      const auto [x, y] = batch(k);
      const Tensor loss = eager.step(x, y);
      static_x.copy_(x);
      static_y.copy_(y);
      graph.replay();
      const cu::DebugCounters c = cu::debug_counters();
      BOOST_TEST(c.device_to_host_copies == 0);
      BOOST_TEST(c.synchronizations == 0);
      cu::synchronize();
      expect_same_bits(static_loss, loss, "the loss");
      const std::vector<Tensor> a = eager.parameters(), b = graphed.parameters();
      for (size_t i = 0; i < a.size(); ++i) expect_same_bits(b[i].detach(), a[i].detach(), "parameter");
      cu::reset_debug_counters();
    }
  }
  BOOST_TEST(graphed.scaler.get_scale() == eager.scaler.get_scale());
  BOOST_TEST(graphed.scaler.skipped_steps() == eager.scaler.skipped_steps());
  BOOST_TEST(eager.scaler.skipped_steps() >= 1, "batch 5 overflowed f16: a skipped step was replayed too");
  const mt::StateDict sa = eager.opt->state_dict(), sb = graphed.opt->state_dict();
  for (const auto& [key, value] : sa) expect_same_bits(sb.at(key), value, "optimizer state " + key);
}

BOOST_AUTO_TEST_CASE(a_schedule_stepped_between_replays_reaches_them, MT_GPU_TEST) {
  // AdamW under OneCycleLR (it moves lr and beta1 every step) in the AMP step, and SGD with Nesterov momentum under
  // a cosine schedule: replays read the options the schedules set between them, as eager steps do.
  AmpTrainer eager(11), graphed(11);
  const mt::optim::OneCycleLROptions cycle{.max_lr = 1e-2, .total_steps = 20};
  mt::optim::OneCycleLR eager_cycle(*eager.opt, cycle), graphed_cycle(*graphed.opt, cycle);

  mt::manual_seed(12);
  mt::nn::Linear eager_fc(32, 8);
  mt::nn::Linear graphed_fc(32, 8);
  graphed_fc.load_state_dict(eager_fc.state_dict());
  eager_fc.to(Device::cuda());
  graphed_fc.to(Device::cuda());
  const mt::optim::SGDOptions sgd{.lr = 0.05, .momentum = 0.9, .nesterov = true};
  mt::optim::SGD eager_sgd(eager_fc.parameters(), sgd), graphed_sgd(graphed_fc.parameters(), sgd);
  mt::optim::CosineAnnealingLR eager_cosine(eager_sgd, 20), graphed_cosine(graphed_sgd, 20);
  auto sgd_step = [](mt::nn::Linear& fc, mt::optim::SGD& opt, const Tensor& x) {
    opt.zero_grad();
    mt::mse_loss(fc(x), mt::zeros({x.shape()[0], 8}, TensorOptions().device(Device::cuda()))).backward();
    opt.step();
  };

  Tensor static_x, static_y, static_small;
  cu::Graph graph;
  for (int k = 0; k < 12; ++k) {
    BOOST_TEST_CONTEXT("step " << k) {
      const auto [x, y] = batch(k);
      const Tensor small = randn_gpu({16, 32}, 2000 + static_cast<uint64_t>(k));
      eager.step(x, y);
      sgd_step(eager_fc, eager_sgd, small);
      if (k < 3) {  // warm-up: eager on both sides
        graphed.step(x, y);
        sgd_step(graphed_fc, graphed_sgd, small);
      } else {
        if (!graph.captured()) {
          static_x = x.clone();
          static_y = y.clone();
          static_small = small.clone();
          graph.capture([&] {
            graphed.step(static_x, static_y);
            sgd_step(graphed_fc, graphed_sgd, static_small);
          });
        }
        static_x.copy_(x);
        static_y.copy_(y);
        static_small.copy_(small);
        graph.replay();
      }
      eager_cycle.step();
      graphed_cycle.step();
      eager_cosine.step();
      graphed_cosine.step();
      cu::synchronize();
      const std::vector<Tensor> a = eager.parameters(), b = graphed.parameters();
      for (size_t i = 0; i < a.size(); ++i) expect_same_bits(b[i].detach(), a[i].detach(), "AdamW parameter");
      const std::vector<Tensor> c = eager_fc.parameters(), d = graphed_fc.parameters();
      for (size_t i = 0; i < c.size(); ++i) expect_same_bits(d[i].detach(), c[i].detach(), "SGD parameter");
    }
  }
  BOOST_TEST(graphed.opt->lr(0) == eager.opt->lr(0));
  BOOST_TEST(eager.opt->lr(0) != eager.opt->param_groups()[0].options.get("initial_lr"), "the schedule moved lr");
}

BOOST_AUTO_TEST_CASE(a_replay_is_refused_when_its_optimizer_cannot_take_it, MT_GPU_TEST) {
  mt::manual_seed(13);
  mt::nn::Linear fc(16, 4);
  fc.to(Device::cuda());
  const Tensor x = randn_gpu({8, 16}, 14);
  auto step = [&](mt::optim::Optimizer& opt) {
    opt.zero_grad();
    mt::sum(fc(x)).backward();
    opt.step();
  };
  {  // an option that chose the captured kernels changed
    mt::optim::SGD sgd(fc.parameters(), {.lr = 0.01, .momentum = 0.9});
    step(sgd);
    cu::Graph graph;
    graph.capture([&] { step(sgd); });
    graph.replay();
    sgd.param_groups()[0].options.set("momentum", 0.0);
    expect_error([&] { graph.replay(); }, {"SGD: param group 0: momentum 0.9", "capture the step again"});
    sgd.param_groups()[0].options.set("momentum", 0.5);  // nonzero again: the captured kernels serve it
    graph.replay();
  }
  {
    mt::optim::AdamW adamw(fc.parameters(), {.lr = 0.01});
    step(adamw);
    cu::Graph graph;
    graph.capture([&] { step(adamw); });
    adamw.param_groups()[0].options.set("amsgrad", 1.0);
    expect_error([&] { graph.replay(); }, {"AdamW: param group 0: amsgrad off", "capture the step again"});
    adamw.param_groups()[0].options.set("amsgrad", 0.0);
    graph.replay();
    // New state tensors: the captured kernels would write the old ones.
    adamw.load_state_dict(adamw.state_dict());
    expect_error([&] { graph.replay(); }, {"cuda::Graph::replay", "AdamW optimizer", "loaded a state_dict"});
  }
  {  // a group added after the capture would be left out of every replay
    mt::nn::Linear other(4, 4);
    other.to(Device::cuda());
    mt::optim::SGD sgd(fc.parameters(), {.lr = 0.01});
    step(sgd);
    cu::Graph graph;
    graph.capture([&] { step(sgd); });
    sgd.add_param_group({other.parameters(), {}});
    expect_error([&] { graph.replay(); }, {"cuda::Graph::replay", "SGD optimizer", "gained a param group"});
  }
  {  // the optimizer died before the graph: its state is gone
    cu::Graph graph;
    {
      auto adam = std::make_unique<mt::optim::Adam>(fc.parameters(), mt::optim::AdamOptions{.lr = 0.01});
      step(*adam);
      graph.capture([&] { step(*adam); });
      graph.replay();
    }
    const Tensor before = fc.weight.detach().clone();
    expect_error([&] { graph.replay(); }, {"cuda::Graph::replay", "Adam optimizer", "destroyed"});
    expect_same_bits(fc.weight.detach(), before, "nothing ran");
  }
}

BOOST_AUTO_TEST_SUITE_END()
