// data/safetensors.h — checkpoints as safetensors files, the format Python's `safetensors` and Hugging Face read.
//
// A StateDict (a module's, an optimizer's, a loss scaler's) goes to disk as one file: an 8-byte little-endian
// header length, a JSON header naming each tensor's dtype, shape and byte range, then the raw bytes, tensors in
// StateDict order, back to back. The design idea: a checkpoint is either the old file or the whole new one, never
// half of either (written beside the target, fsync'ed, renamed over it), and a file read back is validated
// completely before a tensor is handed out, every error naming the file and the key.
//
//   mt::StateDict sd = net.state_dict();
//   mt::data::save_safetensors("ckpt/model.safetensors", sd, {{"step", "1000"}});
//   mt::data::SafetensorsFile f = mt::data::load_safetensors("ckpt/model.safetensors");
//   net.load_state_dict(f.tensors);  // f.metadata.at("step") == "1000"
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>

#include <mixtape/core/state_dict.h>

namespace mixtape::data {

/// Writes `tensors` (any device: copied to the host one at a time; any layout: made contiguous) in the
/// safetensors format: an 8-byte little-endian header length, a JSON header
/// `{"__metadata__": {str: str}, "name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...}`
/// padded with spaces to a multiple of 8 bytes, then the raw little-endian bytes, tensors in StateDict order,
/// contiguous. `__metadata__` is left out when `metadata` is empty. Dtypes: F64, F32, F16, BF16, I64, I32, U8, BOOL.
///
/// Crash-safe: written to "<path>.tmp.<pid>", fsync'ed, renamed over `path`, the directory fsync'ed. Every check
/// (a key that is empty or "__metadata__", an undefined tensor, a key or metadata string that is not UTF-8) runs
/// before the temporary file exists; on any failure the file at `path` is unchanged and the temporary file is
/// removed (but for the last step: when the directory's fsync fails after the rename, the new file is in place and
/// the error says so). Errors are mixtape::Error naming `path`, the key where there is one, and the errno text.
/// The file gets the permissions a new file gets (0666 less the umask), also when it replaces one.
void save_safetensors(const std::string& path, const StateDict& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// What a safetensors file holds.
struct SafetensorsFile {
  StateDict tensors;  // on the CPU in the file's dtypes, in the order of their bytes in the file
  std::map<std::string, std::string> metadata;  // the header's "__metadata__" (empty when absent)
};

/// Reads and validates a safetensors file (written by save_safetensors, Python's `safetensors` or any writer that
/// follows the format; the header's keys may come in any order). Every problem is a mixtape::Error naming the
/// file, the key where there is one, and what is wrong: a file shorter than 8 bytes; a header length beyond the
/// file or over 100 MB; a header that is not a JSON object, or holds a key twice; an entry without a known dtype,
/// a shape of non-negative integers or two integer data_offsets; a byte range that is reversed, reaches beyond the
/// file or disagrees with numel × itemsize; tensors that overlap or leave a gap; metadata values that are not
/// strings; bytes after the last tensor; a BOOL byte other than 0 or 1.
SafetensorsFile load_safetensors(const std::string& path);

/// load_safetensors over bytes in memory (a file the caller mapped or received): the same checks, errors naming
/// `what` where load_safetensors names the file.
SafetensorsFile parse_safetensors(std::span<const uint8_t> bytes, const std::string& what);

}  // namespace mixtape::data
