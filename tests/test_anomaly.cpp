// tests/test_anomaly.cpp — DetectAnomaly names the op, its dtype, the
// direction and the input or output where the first non-finite value appeared.
#include <boost/test/unit_test.hpp>

#include <cmath>

#include <mixtape/mixtape.h>

namespace mt = mixtape;
namespace utf = boost::unit_test;

namespace {

bool message_has(const mt::Error& e, const std::vector<std::string>& parts) {
  std::string m = e.what();
  BOOST_TEST_MESSAGE("anomaly: " << m);
  for (const auto& p : parts)
    if (m.find(p) == std::string::npos) return false;
  return true;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(anomaly, *utf::label("cpu"))

BOOST_AUTO_TEST_CASE(non_finite_forward_from_f16_overflow) {
  // exp is an fp32 op; forced to run in f16, exp(12) overflows.
  mt::Tensor x = mt::full({4}, 12.0, mt::kF16).requires_grad_();
  mt::autograd::DetectAnomaly anomaly;
  mt::amp::Autocast ac(mt::kF16);
  mt::amp::PrecisionScope wrong("exp", mt::Precision::kPassthrough);
  BOOST_CHECK_EXCEPTION(mt::exp(x), mt::Error, [](const mt::Error& e) {
    return message_has(e, {"anomaly", "forward", "exp", "(f16)", "output"});
  });
  mt::amp::PrecisionScope right("exp", mt::Precision::kFp32);
  BOOST_TEST(std::isfinite(mt::exp(x).at<float>({0})));  // in f32 it is fine
}

BOOST_AUTO_TEST_CASE(finite_forward_but_non_finite_loss) {
  // Every activation is finite; the loss's sum of squares overflows f32.
  mt::Tensor w = mt::full({4}, 1e19).requires_grad_();
  mt::Tensor x = mt::ones({4});
  mt::autograd::DetectAnomaly anomaly;
  mt::Tensor pred = mt::mul(w, x);
  BOOST_TEST(std::isfinite(pred.at<float>({0})));
  BOOST_CHECK_EXCEPTION(mt::mse_loss(pred, mt::zeros({4}), mt::Reduction::kSum), mt::Error,
                        [](const mt::Error& e) {
                          return message_has(e, {"anomaly", "forward", "mse_loss", "(f32)", "output"});
                        });
}

BOOST_AUTO_TEST_CASE(finite_loss_but_non_finite_gradient) {
  // sqrt(0) = 0 is finite; its derivative 1/(2 sqrt(0)) is not.
  mt::Tensor x = mt::tensor({0.0f, 1.0f}).requires_grad_();
  mt::autograd::DetectAnomaly anomaly;
  mt::Tensor loss = mt::sum(mt::sqrt(x));
  BOOST_TEST(std::isfinite(loss.item<float>()));
  BOOST_CHECK_EXCEPTION(loss.backward(), mt::Error, [](const mt::Error& e) {
    return message_has(e, {"anomaly", "backward", "sqrt", "(f32)", "gradient of input 0"});
  });
}

BOOST_AUTO_TEST_CASE(non_finite_input_from_outside_the_tape) {
  mt::Tensor x = mt::tensor({1.0f, NAN});
  mt::autograd::DetectAnomaly anomaly;
  BOOST_CHECK_EXCEPTION(mt::relu(x), mt::Error, [](const mt::Error& e) {
    return message_has(e, {"anomaly", "forward", "relu", "input 0"});
  });
}

BOOST_AUTO_TEST_CASE(nested_guards_restore_the_outer_state) {
  mt::Tensor x = mt::tensor({1.0f, NAN});
  {
    mt::autograd::DetectAnomaly outer;
    { mt::autograd::DetectAnomaly inner; }
    BOOST_TEST(mt::autograd::anomaly_enabled());  // the outer guard still holds
    BOOST_CHECK_THROW(mt::relu(x), mt::Error);
  }
  BOOST_TEST(!mt::autograd::anomaly_enabled());
  BOOST_CHECK_NO_THROW(mt::relu(x));
}

BOOST_AUTO_TEST_CASE(off_by_default) {
  BOOST_TEST(!mt::autograd::anomaly_enabled());
  mt::Tensor x = mt::tensor({0.0f}).requires_grad_();
  mt::sum(mt::sqrt(x)).backward();  // no check: the infinite gradient arrives silently, as in PyTorch
  BOOST_TEST(std::isinf(x.grad().item<float>()));
}

BOOST_AUTO_TEST_SUITE_END()
