// fuzz/fuzz_safetensors.cpp — libFuzzer target for the safetensors reader (data/safetensors.h), from bytes to a
// StateDict: header length, JSON, every entry's checks, the tiling of the data, the tensors' bytes.
//
// The one idea: the reader's contract is "anything but a valid file is a mixtape::Error", so that is the only
// exception caught here; any other (nlohmann's, std::length_error, bad_alloc), a crash, a leak or a sanitizer
// report is a finding. Each input is read twice: as a file holds it, and with its first 8 bytes taken as the
// data's length instead of the header's. The second reading keeps the JSON whole when a mutation grows or shrinks
// it (the first would cut it at the old length), so the fuzzer reaches the checks after the JSON parser.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include <mixtape/core/error.h>
#include <mixtape/data/safetensors.h>

namespace {

void parse(std::span<const uint8_t> bytes) {
  try {
    mixtape::data::SafetensorsFile f = mixtape::data::parse_safetensors(bytes, "fuzz input");
    // Touch every byte handed out, so that a tensor whose storage is shorter than its shape says is a report.
    uint8_t sum = 0;
    for (const auto& [key, t] : f.tensors)
      for (size_t i = 0; i < t.nbytes(); ++i) sum ^= static_cast<const uint8_t*>(t.data_ptr())[i];
    volatile uint8_t sink = sum;
    (void)sink;
  } catch (const mixtape::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  parse({data, size});
  if (size >= 8) {
    uint64_t data_length = 0;
    std::memcpy(&data_length, data, 8);
    const uint64_t rest = size - 8;
    const uint64_t header_length = rest - data_length % (rest + 1);
    std::vector<uint8_t> fixed(data, data + size);
    std::memcpy(fixed.data(), &header_length, 8);
    parse(fixed);
  }
  return 0;
}
