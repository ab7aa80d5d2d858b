// data/idx.h — reading IDX files (the format MNIST and Fashion-MNIST ship in), raw or gzip-compressed.
//
// The one design idea: trust nothing in the file. Every number the header states (magic, element type, rank,
// each dimension, the byte count they imply) is checked against the bytes actually there before a tensor is
// made, and each failure is a mixtape::Error that names the file and what is wrong with it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <mixtape/core/tensor.h>

namespace mixtape::data {

/// Reads an IDX file into a CPU tensor whose shape is the header's dims. The file may be raw or gzip (detected
/// by the magic bytes 1f 8b, not by the name). Element types: u8 → kU8, i8 and i16 → kI32 (widened), i32 → kI32,
/// f32 → kF32, f64 → kF64; IDX's big-endian values are converted to the host's order.
///
///     Tensor images = mixtape::data::read_idx("data/mnist/train-images-idx3-ubyte.gz");  // (60000, 28, 28) u8
///
/// Throws mixtape::Error naming `path` when the file is missing, unreadable, a truncated or corrupt gzip stream,
/// not IDX (magic), of an unknown element type, of rank 0 or above 8, or when the dims overflow or disagree with
/// the file's length (too short, or trailing bytes).
Tensor read_idx(const std::string& path);

/// The bytes of the file at `path`, gunzipped when it starts with the gzip magic (all members of a multi-member
/// file). Throws mixtape::Error naming `path` on a missing file or a truncated/corrupt/trailing-garbage stream.
std::vector<uint8_t> read_maybe_gzip(const std::string& path);

/// `bytes` gunzipped when they start with the gzip magic, else as they are: read_maybe_gzip after the reading
/// (`what` names the source in error messages). read_idx(path) is parse_idx(maybe_gunzip(<the file>, path), path).
std::vector<uint8_t> maybe_gunzip(std::vector<uint8_t> bytes, const std::string& what);

/// Parses IDX `bytes` (already decompressed); `what` names the source in error messages.
Tensor parse_idx(const std::vector<uint8_t>& bytes, const std::string& what);

}  // namespace mixtape::data
