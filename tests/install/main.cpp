// The README's example, built against the installed headers and library.
#include <mixtape/mixtape.h>

#include <iostream>

namespace mt = mixtape;

int main() {
  mt::manual_seed(0);
  mt::Tensor x = mt::randn({128, 784});                          // f32 on the CPU
  mt::Tensor y = mt::randint(0, 10, {128});                      // i64 labels
  mt::Tensor w1 = (mt::randn({512, 784}) * 0.03).requires_grad_();   // f32 master weights
  mt::Tensor w2 = (mt::randn({10, 512}) * 0.04).requires_grad_();
  mt::Tensor loss;
  std::string trace_str;
  {
    mt::amp::Autocast ac(mt::kF16);             // linear runs in f16, cross_entropy in f32
    mt::autograd::PrecisionTrace trace;         // which op ran in which dtype
    loss = mt::cross_entropy(mt::linear(mt::relu(mt::linear(x, w1)), w2), y);
    trace_str = trace.str();
  }
  loss.backward();                              // w1.grad() and w2.grad() arrive in f32
  std::cout << trace_str << "\nloss " << loss << "\ncuda available: " << mt::cuda::is_available()
            << "\ncpu capability: " << mt::cpu_capability() << "\n";
  bool ok = trace_str == "cast:f16 cast:f16 linear:f16 relu:f16 cast:f16 linear:f16 cross_entropy:f32" &&
            loss.dtype() == mt::kF32 && w1.grad().dtype() == mt::kF32 && w2.grad().dtype() == mt::kF32;
  return ok ? 0 : 1;
}
