// ops/device_kernels.h — finding a device's kernel (internal to ops/).
#pragma once

#include <mixtape/core/error.h>
#include <mixtape/core/kernel_table.h>

namespace mixtape::kernels {

/// The table of `device`'s kernels; throws when mixtape was built without that device.
const DeviceKernels& kernels_of(Device device, const char* op);

/// The kernel `member` of `device`'s table; throws naming `op` and the device when it has none.
template <class F>
F kernel_for(Device device, F DeviceKernels::*member, const char* op) {
  F fn = kernels_of(device, op).*member;
  MT_CHECK(fn != nullptr, op, ": no kernel for tensors on ", device, " in this build");
  return fn;
}

}  // namespace mixtape::kernels
