// bench/child_process.h — runs a peer benchmark (a LibTorch program) as a child process and returns its stdout.
//
// The peers are separate executables so that mixtape and LibTorch never share a process: two OpenMP runtimes
// and two BLAS builds in one address space would make both timings suspect. posix_spawn, not a shell: the paths
// need no quoting, and the parent's threads are not forked.
#pragma once

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include <mixtape/core/error.h>

extern char** environ;

namespace bench {

/// Runs `args` (args[0] the program's path) with the parent's environment, its stdout captured and its stderr
/// passed through; throws mixtape::Error unless it starts and exits with status 0.
inline std::string run_child(const std::vector<std::string>& args) {
  int fds[2];
  MT_CHECK(pipe(fds) == 0, "bench: pipe failed: ", std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  std::string out;
  char buffer[4096];
  for (ssize_t n; spawned == 0 && (n = read(fds[0], buffer, sizeof buffer)) > 0;) out.append(buffer, n);
  close(fds[0]);
  MT_CHECK(spawned == 0, "bench: cannot run ", args[0], ": ", std::strerror(spawned));
  int status = 0;
  waitpid(pid, &status, 0);
  MT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "bench: ", args[0], " failed (",
           WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status)) : std::string("killed by a signal"),
           ")");
  return out;
}

}  // namespace bench
