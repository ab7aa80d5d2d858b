// core/atomic_file.h — writing a file whole or not at all (internal): checkpoints (data/safetensors.cpp) and the
// numerics inspector's reports (optim/inspect.cpp).
//
// The one design idea: the bytes go to "<path>.tmp.<pid>" beside the target, which is fsync'ed, renamed over the
// target, and the directory fsync'ed. Until the rename the old file, if any, is untouched; an error or an exception
// before it removes the temporary file. So a reader, even after a crash, finds the old file or the new one, never
// half of one, and no temporary file is left behind by a failure this process sees.
//
//   AtomicFile f("save_safetensors: 'model.safetensors'", "model.safetensors");
//   f.write(header.data(), header.size());
//   f.commit();  // from here on the file is the new one
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace mixtape {

class AtomicFile {
 public:
  /// Creates the temporary file for `path`. `who` begins every error message: it names the caller and the file.
  AtomicFile(std::string who, std::string path);
  /// Removes the temporary file unless commit() renamed it.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  /// Appends n bytes (a short write or an error of the file system is a mixtape::Error naming its cause).
  void write(const void* data, size_t n);
  void write(std::string_view text) { write(text.data(), text.size()); }

  /// Durable, then visible: fsync, close, rename over the target, fsync its directory. Once the rename is done the
  /// target is the new file, even when the directory's fsync then fails (the error says so).
  void commit();

 private:
  std::string m_who, m_target, m_tmp;
  int m_fd = -1;
  bool m_renamed = false;
};

/// `contents` written to `path` by an AtomicFile, committed.
void write_file_atomically(const std::string& who, const std::string& path, std::string_view contents);

}  // namespace mixtape
