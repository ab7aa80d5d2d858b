// tests/checkpoint_run.h — a small training run that checkpoints, shared by tests/test_checkpoint.cpp and the child
// process of its crash test (tests/checkpoint_writer.cpp).
//
// 16-32-4 with dropout (so the default generator's position matters), AdamW, and in fp16 autocast with a
// GradScaler whose scale grows every 3 steps (so its state changes, and overflows are skipped now and then).
// A batch depends on the step number alone, never on the default generator: two runs at the same step see
// the same data.
#pragma once

#include <cstdint>
#include <string>

#include <mixtape/mixtape.h>

namespace checkpoint_test {

namespace mt = mixtape;

struct TinyNet : mt::nn::Module {
  mt::nn::Linear fc1{16, 32}, fc2{32, 4};
  mt::nn::Dropout dropout{0.2};
  TinyNet() {
    register_module("fc1", fc1);
    register_module("dropout", dropout);
    register_module("fc2", fc2);
  }
  mt::Tensor forward(const mt::Tensor& x) { return fc2(dropout(mt::relu(fc1(x)))); }
};

/// Model, optimizer, scaler and step: everything a checkpoint holds. Not movable (the optimizer holds the model's
/// parameters, the model its layers by reference).
struct TinyRun {
  explicit TinyRun(bool fp16, uint64_t seed = 0)
      : fp16(fp16), seeded(seed), opt(net.parameters(), {.lr = 1e-2}),
        scaler({.init_scale = 1024.0, .growth_interval = 3, .enabled = fp16}) {}
  TinyRun(const TinyRun&) = delete;

  void train_step() {
    mt::Generator data(1000 + static_cast<uint64_t>(step));
    const mt::Tensor x = mt::randn({8, 16}, {}, &data);
    const mt::Tensor y = mt::randint(0, 4, {8}, mt::TensorOptions(mt::kI64), &data);
    opt.zero_grad();
    mt::Tensor loss;
    {
      mt::amp::Autocast ac(mt::kF16, fp16);
      loss = mt::cross_entropy(net.forward(x), y);
    }
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
    ++step;
  }

  mt::data::Checkpoint checkpoint() const {
    mt::data::Checkpoint c{.step = step, .rng = mt::default_generator().state()};
    c.parts["model"] = net.state_dict();
    c.parts["optimizer"] = opt.state_dict();
    c.parts["scaler"] = scaler.state_dict();
    return c;
  }

  void restore(const mt::data::Checkpoint& c) {
    net.load_state_dict(c.part("model"));
    opt.load_state_dict(c.part("optimizer"));
    scaler.load_state_dict(c.part("scaler"));
    mt::default_generator().set_state(c.rng);
    step = c.step;
  }

  bool fp16;
  struct Seed {
    explicit Seed(uint64_t seed) { mt::manual_seed(seed); }
  } seeded;    // before net: its initialisation draws from the seeded generator
  TinyNet net;
  mt::optim::AdamW opt;
  mt::amp::GradScaler scaler;
  int64_t step = 0;
};

}  // namespace checkpoint_test
