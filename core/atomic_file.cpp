// core/atomic_file.cpp — AtomicFile (core/atomic_file.h): a temporary file beside the target, POSIX calls, every
// failure a mixtape::Error naming the call and errno's text.
#include <mixtape/core/atomic_file.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mixtape/core/error.h>

namespace mixtape {

namespace {

std::string errno_text(int err) { return std::strerror(err); }

/// fsync of the directory holding `path`, so that a rename into it survives a crash.
void sync_directory(const std::string& who, const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  MT_CHECK(fd >= 0, who, ": the file is written, but opening its directory '", dir,
           "' to fsync the rename failed: ", errno_text(errno));
  // EINVAL: a file system that cannot sync directories (some FUSE ones); there is nothing more to do there.
  const bool synced = ::fsync(fd) == 0 || errno == EINVAL;
  const int err = errno;
  ::close(fd);
  MT_CHECK(synced, who, ": the file is written, but fsync of its directory '", dir, "' failed: ", errno_text(err));
}

}  // namespace

AtomicFile::AtomicFile(std::string who, std::string path)
    : m_who(std::move(who)), m_target(std::move(path)), m_tmp(m_target + ".tmp." + std::to_string(::getpid())) {
  m_fd = ::open(m_tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  MT_CHECK(m_fd >= 0, m_who, ": cannot create the temporary file '", m_tmp, "': ", errno_text(errno));
}

AtomicFile::~AtomicFile() {
  if (m_fd >= 0) ::close(m_fd);
  if (!m_renamed) ::unlink(m_tmp.c_str());
}

void AtomicFile::write(const void* data, size_t n) {
  MT_CHECK(m_fd >= 0 && !m_renamed, m_who, ": writing after commit()");
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::write(m_fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    MT_CHECK(k > 0, m_who, ": writing the temporary file '", m_tmp, "' failed: ",
             k < 0 ? errno_text(errno) : std::string("no progress"));
    p += k;
    n -= static_cast<size_t>(k);
  }
}

void AtomicFile::commit() {
  MT_CHECK(m_fd >= 0 && !m_renamed, m_who, ": commit() twice");
  MT_CHECK(::fsync(m_fd) == 0, m_who, ": fsync of the temporary file '", m_tmp, "' failed: ", errno_text(errno));
  const int fd = m_fd;
  m_fd = -1;
  MT_CHECK(::close(fd) == 0, m_who, ": closing the temporary file '", m_tmp, "' failed: ", errno_text(errno));
  MT_CHECK(::rename(m_tmp.c_str(), m_target.c_str()) == 0, m_who, ": renaming '", m_tmp, "' over '", m_target,
           "' failed: ", errno_text(errno));
  m_renamed = true;
  sync_directory(m_who, m_target);
}

void write_file_atomically(const std::string& who, const std::string& path, std::string_view contents) {
  AtomicFile f(who, path);
  f.write(contents);
  f.commit();
}

}  // namespace mixtape
