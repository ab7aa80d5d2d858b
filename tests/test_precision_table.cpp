// tests/test_precision_table.cpp — every registered op's precision category against one table written out here,
// and what each category does to an op's input dtypes under autocast.
//
// The one idea: the expected table is a literal, not derived from the registry. An op added without a row here,
// a row for an op that no longer exists, or a category changed in an op's file (one keyword, easy to slip into a
// refactor) fails this suite, so a change of precision is always a change of this file too, reviewed as such.
// The second half pins the rule each category stands for (autograd/precision.cpp's target_dtype) through one op
// run under a scoped override of every category, so table plus rule give every op's autocast outcome.
#include <boost/test/unit_test.hpp>

#include <map>
#include <string>

#include <mixtape/autograd/registry.h>
#include <mixtape/mixtape.h>

namespace mt = mixtape;
namespace utf = boost::unit_test;
using mt::Precision;

namespace {

constexpr Precision kLow = Precision::kLowerPrecision;
constexpr Precision kFp32 = Precision::kFp32;
constexpr Precision kPromote = Precision::kPromote;
constexpr Precision kPass = Precision::kPassthrough;

/// Every op of the library and its declared category (DESIGN.md "Per-op precision rules"; the reasons are in each
/// op's file, next to its kPrecision).
const std::map<std::string, Precision> kExpected = {
    // autograd/cast.cpp
    {"cast", kPass}, {"to_device", kPass},
    // ops/conv.cpp, ops/matmul.cpp: GEMMs
    {"conv2d", kLow}, {"matmul", kLow}, {"linear", kLow},
    // ops/dropout.cpp
    {"dropout", kPass},
    // ops/elementwise.cpp
    {"add", kPromote}, {"sub", kPromote}, {"mul", kPromote}, {"div", kPromote},
    {"add_scalar", kPass}, {"mul_scalar", kPass}, {"div_scalar", kPass},
    {"pow", kFp32}, {"neg", kPass}, {"exp", kFp32}, {"log", kFp32}, {"sqrt", kPass},
    {"relu", kPass}, {"gelu", kFp32}, {"sigmoid", kPass}, {"tanh", kPass},
    {"abs", kPass}, {"clamp", kPass}, {"maximum", kPromote}, {"minimum", kPromote}, {"where", kPromote},
    {"eq", kPromote}, {"ne", kPromote}, {"lt", kPromote}, {"le", kPromote}, {"gt", kPromote}, {"ge", kPromote},
    // ops/index.cpp
    {"index_select", kPass}, {"cat", kPromote},
    // ops/loss.cpp
    {"cross_entropy", kFp32}, {"nll_loss", kFp32}, {"mse_loss", kFp32},
    // ops/norm.cpp
    {"layer_norm", kFp32}, {"batch_norm", kPass},
    // ops/pool.cpp
    {"max_pool2d", kPass}, {"avg_pool2d", kPass},
    // ops/reduce.cpp
    {"sum", kFp32}, {"mean", kFp32}, {"max", kPass}, {"min", kPass}, {"argmax", kPass}, {"argmin", kPass},
    // ops/softmax.cpp
    {"softmax", kFp32}, {"log_softmax", kFp32},
    // ops/views.cpp
    {"reshape", kPass}, {"permute", kPass}, {"slice", kPass}, {"select", kPass}, {"expand", kPass}, {"clone", kPass},
};

}  // namespace

BOOST_AUTO_TEST_SUITE(precision_table, *utf::label("cpu"))

BOOST_AUTO_TEST_CASE(every_registered_op_has_its_expected_category) {
  std::map<std::string, int> seen;
  for (const mt::amp::OpPrecision& row : mt::amp::precision_table()) {
    ++seen[row.op];
    BOOST_TEST_CONTEXT("op " << row.op) {
      const bool listed = kExpected.count(row.op) == 1;
      BOOST_TEST(listed, "op '" << row.op << "' (" << row.declared << ") is registered but has no row in this "
                                                                        "file's table: add one");
      if (listed) BOOST_TEST(row.declared == kExpected.at(row.op));
      BOOST_TEST(row.effective == row.declared, "a stray override");
    }
  }
  for (const auto& [op, category] : kExpected)
    BOOST_TEST(seen[op] == 1, "op '" << op << "' (" << category << ") is in the table " << seen[op]
                                      << " times in the registry, not once");
  // The table and the registry agree on the ops, not just the categories.
  BOOST_TEST(mt::autograd::registered_ops().size() == kExpected.size());
}

// The rule of each category, through add run under a scoped override (the same path as an op's declared category:
// autograd::effective_precision). Per pair of input dtypes, the dtype add computes in (its output's).
BOOST_AUTO_TEST_CASE(each_category_casts_inputs_as_its_rule_says) {
  struct Row {
    mt::DType a, b;
    Precision category;
    mt::DType want;  // kAutocastDtype: whichever dtype autocast is set to
  };
  const mt::DType kAutocastDtype = mt::kBool;  // no float op computes in bool: free to stand for "the autocast dtype"
  const std::vector<Row> rows = {
      // lower precision: any float but f64 becomes the autocast dtype (PyTorch: f64 is never autocast)
      {mt::kF32, mt::kF32, kLow, kAutocastDtype},
      {mt::kF16, mt::kF16, kLow, kAutocastDtype},
      {mt::kBF16, mt::kBF16, kLow, kAutocastDtype},
      {mt::kF16, mt::kBF16, kLow, kAutocastDtype},
      {mt::kF64, mt::kF64, kLow, mt::kF64},
      // fp32: 16-bit floats widen, f32 and f64 stay
      {mt::kF32, mt::kF32, kFp32, mt::kF32},
      {mt::kF16, mt::kF16, kFp32, mt::kF32},
      {mt::kBF16, mt::kBF16, kFp32, mt::kF32},
      {mt::kF16, mt::kBF16, kFp32, mt::kF32},
      {mt::kF64, mt::kF64, kFp32, mt::kF64},
      // promote: the widest input dtype; f16 with bf16 is f32 (neither holds the other)
      {mt::kF16, mt::kF16, kPromote, mt::kF16},
      {mt::kBF16, mt::kBF16, kPromote, mt::kBF16},
      {mt::kF16, mt::kBF16, kPromote, mt::kF32},
      {mt::kF16, mt::kF32, kPromote, mt::kF32},
      {mt::kBF16, mt::kF64, kPromote, mt::kF64},
      // passthrough: unchanged
      {mt::kF32, mt::kF32, kPass, mt::kF32},
      {mt::kF16, mt::kF16, kPass, mt::kF16},
      {mt::kBF16, mt::kBF16, kPass, mt::kBF16},
      {mt::kF64, mt::kF64, kPass, mt::kF64},
  };
  for (mt::DType low : {mt::kF16, mt::kBF16})
    for (const Row& r : rows) {
      const mt::DType want = r.want == kAutocastDtype ? low : r.want;
      BOOST_TEST_CONTEXT("add(" << r.a << ", " << r.b << ") as " << r.category << " under autocast " << low) {
        mt::amp::Autocast ac(low);
        mt::amp::PrecisionScope as("add", r.category);
        BOOST_TEST(mt::add(mt::ones({2}, r.a), mt::ones({2}, r.b)).dtype() == want);
      }
    }
  // Outside autocast only promotion changes a dtype.
  for (Precision p : {kLow, kFp32, kPass}) {
    mt::amp::PrecisionScope as("add", p);
    BOOST_TEST(mt::add(mt::ones({2}, mt::kF16), mt::ones({2}, mt::kF16)).dtype() == mt::kF16, p);
    BOOST_TEST(mt::add(mt::ones({2}, mt::kF64), mt::ones({2}, mt::kF64)).dtype() == mt::kF64, p);
  }
  mt::amp::PrecisionScope as("add", kPromote);
  BOOST_TEST(mt::add(mt::ones({2}, mt::kF16), mt::ones({2}, mt::kBF16)).dtype() == mt::kF32);
}

// One op of each category with its declared category, inputs of every float dtype, under both autocast dtypes.
BOOST_AUTO_TEST_CASE(one_op_of_each_category_under_autocast) {
  for (mt::DType low : {mt::kF16, mt::kBF16}) {
    const mt::DType other = low == mt::kF16 ? mt::kBF16 : mt::kF16;
    BOOST_TEST_CONTEXT("autocast " << low) {
      mt::amp::Autocast ac(low);
      auto x = [](mt::DType dt) { return mt::ones({2, 2}, dt); };
      // matmul, lower precision: the other 16-bit dtype is cast too; f64 is left alone
      BOOST_TEST(mt::matmul(x(other), x(other)).dtype() == low);
      BOOST_TEST(mt::matmul(x(mt::kF32), x(other)).dtype() == low);
      BOOST_TEST(mt::matmul(x(mt::kF64), x(mt::kF64)).dtype() == mt::kF64);
      // softmax, fp32: f64 stays f64
      BOOST_TEST(mt::softmax(x(other), 1).dtype() == mt::kF32);
      BOOST_TEST(mt::softmax(x(mt::kF64), 1).dtype() == mt::kF64);
      BOOST_TEST(mt::gelu(x(low)).dtype() == mt::kF32);
      BOOST_TEST(mt::layer_norm(x(low), {2}).dtype() == mt::kF32);
      // add, promote
      BOOST_TEST(mt::add(x(low), x(other)).dtype() == mt::kF32);
      BOOST_TEST(mt::mul(x(other), x(other)).dtype() == other);
      // relu, passthrough: the other 16-bit dtype stays
      BOOST_TEST(mt::relu(x(other)).dtype() == other);
      BOOST_TEST(mt::avg_pool2d(mt::ones({1, 1, 2, 2}, other)).dtype() == other);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
