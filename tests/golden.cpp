// tests/golden.cpp — the golden-file reader (tests/golden.h).
#include "golden.h"

#include <filesystem>
#include <fstream>

#include <mixtape/core/error.h>

namespace mixtape::test {

namespace {

std::filesystem::path golden_path(const std::string& name) {
  return std::filesystem::path(MIXTAPE_GOLDEN_DIR) / (name + ".json");
}

}  // namespace

std::optional<nlohmann::json> load_golden(const std::string& name) {
  const std::filesystem::path path = golden_path(name);
  std::ifstream in(path);
  if (!in) {
    BOOST_TEST_MESSAGE("no golden file " << path.string() << ": run python3 tests/golden/" << name << ".py");
    return std::nullopt;
  }
  return nlohmann::json::parse(in);
}

Tensor golden_tensor(const nlohmann::json& t) {
  const std::string dtype = t.at("dtype").get<std::string>();
  MT_CHECK(dtype == "f32" || dtype == "f64" || dtype == "i64", "golden_tensor: unsupported dtype '", dtype, "'");
  const std::vector<double> values = t.at("values").get<std::vector<double>>();
  const std::vector<int64_t> dims = t.at("shape").get<std::vector<int64_t>>();
  const DType dt = dtype == "f32" ? DType::kF32 : dtype == "f64" ? DType::kF64 : DType::kI64;
  return from_vector(values, Shape(dims), TensorOptions(DType::kF64)).to(dt);
}

boost::unit_test::precondition golden_available(const std::string& name) {
  return boost::unit_test::precondition([name](boost::unit_test::test_unit_id) {
    boost::test_tools::assertion_result ok = std::filesystem::exists(golden_path(name));
    if (!ok) ok.message() << "no golden file tests/golden/" << name << ".json (run python3 tests/golden/" << name
                          << ".py): skipping";
    return ok;
  });
}

}  // namespace mixtape::test
