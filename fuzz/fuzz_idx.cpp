// fuzz/fuzz_idx.cpp — libFuzzer target for the IDX reader (data/idx.h): the bytes of a file, raw or gzip, through
// read_idx's whole path (maybe_gunzip, then parse_idx) to a tensor.
//
// The one idea: the reader's contract is "anything but a valid file is a mixtape::Error", so that is the only
// exception caught here; any other, a crash, a leak, a sanitizer report or an allocation out of proportion to the
// input (scripts/fuzz.sh caps malloc) is a finding.
#include <cstddef>
#include <cstdint>
#include <vector>

#include <mixtape/core/error.h>
#include <mixtape/data/idx.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const mixtape::Tensor t =
        mixtape::data::parse_idx(mixtape::data::maybe_gunzip({data, data + size}, "fuzz input"), "fuzz input");
    // Touch every byte handed out, so that a tensor whose storage is shorter than its shape says is a report.
    uint8_t sum = 0;
    for (size_t i = 0; i < t.nbytes(); ++i) sum ^= static_cast<const uint8_t*>(t.data_ptr())[i];
    volatile uint8_t sink = sum;
    (void)sink;
  } catch (const mixtape::Error&) {
  }
  return 0;
}
