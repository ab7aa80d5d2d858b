// examples/mnist/progress.h — a one-line progress bar on stderr (only when stderr is a terminal): the epoch, a
// bar, steps done, samples/s and the running loss. Redrawn at most ten times a second, so drawing costs nothing
// next to a training step; the loss it shows is whatever the loop last read from the device (every K steps).
#pragma once

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

namespace mnist {

class ProgressBar {
 public:
  using Clock = std::chrono::steady_clock;

  static bool enabled() { return isatty(STDERR_FILENO) != 0; }

  ProgressBar(std::string label, int64_t total_steps, int64_t batch_size)
      : m_label(std::move(label)), m_total(total_steps), m_batch(batch_size), m_start(Clock::now()) {}

  /// Steps done so far and the latest loss read (NaN: none yet).
  void update(int64_t step, double loss, bool force = false) {
    const auto now = Clock::now();
    if (!force && now - m_last_draw < std::chrono::milliseconds(100)) return;
    m_last_draw = now;
    const double elapsed = std::chrono::duration<double>(now - m_start).count();
    const double rate = elapsed > 0 ? static_cast<double>(step * m_batch) / elapsed : 0.0;
    constexpr int kWidth = 30;
    const int filled = m_total > 0 ? static_cast<int>(kWidth * std::min<int64_t>(step, m_total) / m_total) : 0;
    std::string bar(static_cast<size_t>(filled), '#');
    bar.append(static_cast<size_t>(kWidth - filled), '.');
    char loss_text[32] = "-";
    if (!std::isnan(loss)) std::snprintf(loss_text, sizeof loss_text, "%.4f", loss);
    std::fprintf(stderr, "\r\033[K%s [%s] %lld/%lld  %.0f samples/s  loss %s", m_label.c_str(), bar.c_str(),
                 static_cast<long long>(step), static_cast<long long>(m_total), rate, loss_text);
    std::fflush(stderr);
  }

  /// Clears the line (the caller prints the epoch's summary in its place).
  void finish() {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  }

 private:
  std::string m_label;
  int64_t m_total, m_batch;
  Clock::time_point m_start;
  Clock::time_point m_last_draw{};
};

}  // namespace mnist
