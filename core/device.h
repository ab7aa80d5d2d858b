// core/device.h — where a tensor lives: the CPU or CUDA device N.
#pragma once

#include <cstdint>
#include <ostream>

namespace mixtape {

enum class DeviceType : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;

  static constexpr Device cpu() { return {DeviceType::kCPU, 0}; }
  static constexpr Device cuda(int index = 0) { return {DeviceType::kCUDA, index}; }

  constexpr bool is_cpu() const { return type == DeviceType::kCPU; }
  constexpr bool is_cuda() const { return type == DeviceType::kCUDA; }
  friend constexpr bool operator==(Device a, Device b) { return a.type == b.type && a.index == b.index; }

  friend std::ostream& operator<<(std::ostream& os, Device d) {
    if (d.is_cpu()) return os << "cpu";
    return os << "cuda:" << d.index;
  }
};

inline constexpr Device kCPU = Device::cpu();

}  // namespace mixtape
