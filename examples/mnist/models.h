// examples/mnist/models.h — the two MNIST models the example trains: an MLP (784-512-512-10, ReLU) and
// pytorch/examples' MNIST CNN. Both take images (B, 1, 28, 28) and return logits (B, 10); the loss
// (cross_entropy on logits) is the caller's, so the last layer's log_softmax of the PyTorch net is folded into it.
#pragma once

#include <memory>
#include <string>

#include <mixtape/mixtape.h>

namespace mnist {

namespace mt = mixtape;

/// What the training loop needs of a model: a forward on a batch, and nn::Module for the rest.
struct Model : mt::nn::Module {
  virtual mt::Tensor forward(const mt::Tensor& x) = 0;  // (B, 1, 28, 28) -> (B, 10)
};

/// 784-512-512-10 with ReLU (784-H-H-10 for another hidden width H).
struct Mlp : Model {
  mt::nn::Flatten flatten;
  mt::nn::Linear fc1, fc2, fc3;
  explicit Mlp(int64_t hidden = 512) : fc1(784, hidden), fc2(hidden, hidden), fc3(hidden, 10) {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
  }
  mt::Tensor forward(const mt::Tensor& x) override {
    mt::Tensor h = mt::relu(fc1(flatten(x)));  // (B, H)
    h = mt::relu(fc2(h));                      // (B, H)
    return fc3(h);                             // (B, 10)
  }
};

/// pytorch/examples' mnist/main.py Net: conv 1→32 3×3, conv 32→64 3×3, max-pool 2, dropout 0.25, fc 9216→128,
/// dropout 0.5, fc 128→10.
struct Cnn : Model {
  mt::nn::Conv2d conv1{1, 32, 3}, conv2{32, 64, 3};
  mt::nn::MaxPool2d pool{2};
  mt::nn::Dropout dropout1{0.25}, dropout2{0.5};
  mt::nn::Flatten flatten;
  mt::nn::Linear fc1{9216, 128}, fc2{128, 10};
  Cnn() {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
    register_module("dropout1", dropout1);
    register_module("dropout2", dropout2);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  mt::Tensor forward(const mt::Tensor& x) override {
    mt::Tensor h = mt::relu(conv1(x));          // (B, 32, 26, 26)
    h = pool(mt::relu(conv2(h)));               // (B, 64, 12, 12)
    h = flatten(dropout1(h));                   // (B, 9216)
    h = dropout2(mt::relu(fc1(h)));             // (B, 128)
    return fc2(h);                              // (B, 10)
  }
};

inline std::unique_ptr<Model> make_model(const std::string& name) {
  if (name == "cnn") return std::make_unique<Cnn>();
  return std::make_unique<Mlp>();
}

}  // namespace mnist
