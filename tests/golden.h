// tests/golden.h — reading the PyTorch golden files (tests/golden/<name>.json) that the training tests replay.
//
// Each file is written by the script next to it (tests/golden/<name>.py, run with Debian's python3-torch) and
// committed, so the tests need no Python. Format: {"torch": "<version>", "script": "<name>.py", "cases": [...]},
// every case an object with a "name" and what its script documents; tensors are objects
// {"shape": [...], "dtype": "f32"|"f64", "values": [...]} whose values round-trip exactly (Python's repr of the
// float64 value of each element).
#pragma once

#include <boost/test/unit_test.hpp>

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include <mixtape/core/tensor.h>

namespace mixtape::test {

/// The golden file tests/golden/<name>.json, or nullopt (with a visible message) when it is absent.
std::optional<nlohmann::json> load_golden(const std::string& name);

/// A tensor of a golden file, on the CPU in its dtype.
Tensor golden_tensor(const nlohmann::json& t);

/// Decorator for a test case that replays tests/golden/<name>.json: skipped, with a message, when the file is
/// absent (regenerate it with `python3 tests/golden/<name>.py`).
boost::unit_test::precondition golden_available(const std::string& name);

}  // namespace mixtape::test
