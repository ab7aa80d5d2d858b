// autograd/cast.cpp — the cast op and the dtype/device conversions of Tensor.
#include <mixtape/autograd/cast.h>

#include <mixtape/autograd/function.h>

namespace mixtape {

namespace {

struct Cast {
  static constexpr const char* kName = "cast";
  static constexpr Precision kPrecision = Precision::kPassthrough;  // it *is* the precision machinery
  struct Ctx : autograd::Ctx {
    DType from = DType::kF32;
  };
  static Tensor forward(Ctx& ctx, const Tensor& x, DType to) {
    ctx.from = x.dtype();
    return raw::to(x, to);
  }
  static autograd::Grads backward(Ctx& ctx, const Tensor& dy) { return {raw::to(dy, ctx.from)}; }
};
MT_REGISTER_OP(Cast);

/// Moves between devices; the gradient moves back.
struct ToDevice {
  static constexpr const char* kName = "to_device";
  static constexpr Precision kPrecision = Precision::kPassthrough;
  struct Ctx : autograd::Ctx {
    Device from;
  };
  static Tensor forward(Ctx& ctx, const Tensor& x, Device to) {
    ctx.from = x.device();
    return raw::to(x, to);
  }
  static autograd::Grads backward(Ctx& ctx, const Tensor& dy) { return {raw::to(dy, ctx.from)}; }
};
MT_REGISTER_OP(ToDevice);

}  // namespace

Tensor cast(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  if (!is_floating(dtype)) return raw::to(x, dtype);  // integers carry no gradient, like PyTorch
  return autograd::apply<Cast>(x, dtype);
}

Tensor Tensor::to(DType dtype) const {
  checked();
  return cast(*this, dtype);
}

Tensor Tensor::to(Device device) const {
  checked();
  if (device == this->device()) return *this;
  return autograd::apply<ToDevice>(*this, device);
}

Tensor Tensor::to(Device device, DType dtype) const {
  checked();
  // Convert where the data is smaller: narrow before moving, widen after.
  if (mixtape::itemsize(dtype) <= itemsize()) return to(dtype).to(device);
  return to(device).to(dtype);
}

}  // namespace mixtape
