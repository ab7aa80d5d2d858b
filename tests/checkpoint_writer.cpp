// tests/checkpoint_writer.cpp — the child of test_checkpoint's crash test: trains checkpoint_run.h's TinyRun and
// saves a checkpoint after every step, resuming from the checkpoint at PATH when there is one, until STEPS steps.
// The test kills it with SIGKILL at random moments; whatever moment that is, PATH must hold a whole checkpoint.
//
//   checkpoint_writer PATH STEPS
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>

#include "checkpoint_run.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: checkpoint_writer PATH STEPS\n");
    return 2;
  }
  try {
    const std::string path = argv[1];
    const long long steps = std::atoll(argv[2]);
    checkpoint_test::TinyRun run(/*fp16=*/false);
    if (std::filesystem::exists(path)) run.restore(mixtape::data::load_checkpoint(path));
    while (run.step < steps) {
      run.train_step();
      mixtape::data::save_checkpoint(path, run.checkpoint());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_writer: %s\n", e.what());
    return 1;
  }
}
