// ops/cpu/conv_winograd.h — 3x3 convolutions of stride 1 by Winograd's minimal filtering, F(4x4, 3x3), in f32.
//
// The one design idea (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2015): a 4x4 block of
// outputs of a 3x3 filter is Aᵀ[(G g Gᵀ) ⊙ (Bᵀ d B)]A for the 6x6 input tile d that covers it, so over C_in channels
// the 36 positions ξ of the transformed tile each become one small GEMM, M[ξ] (tiles × C_out) = V[ξ] (tiles × C_in)
// · U[ξ] (C_in × C_out): 36 multiply-adds per 16 outputs and input channel instead of 144, a quarter of im2col's
// GEMM. The input gradient is the same convolution of dy, zero-padded by 2 − padding, with the filter turned 180°
// and C_in, C_out swapped; the weight gradient is the adjoint of the forward, dU[ξ] = Σ_tiles V[ξ]ᵀ · (A dY Aᵀ)[ξ]
// and dW = Gᵀ dU G, so it is exactly the gradient of what the forward computes. The work is done per image, in
// groups of tiles whose transformed data stays in L2 (channels last, 16 to an AVX-512 register or 8 to an AVX2
// one), never materialising the transformed batch; images go to threads.
//
// Numerics. Every sum is f32 (U and dW's last transform in f64, rounded once). The transforms multiply by up to 8
// and divide by up to 24, so rounding errors grow beyond a direct sum's: measured on N(0, 1) data
// (tests/test_conv.cpp), the largest error of y is up to 5.0e-6 of the largest |y|, of dx 5.6e-6 and of
// dweight 4.6e-6, against 0.4e-7 to 7.8e-7 for im2col + sgemm: far below what training notices (cuDNN and oneDNN
// offer the same algorithm for f32), and the reason the tests hold this path to a bound of its own.
// mixtape::set_allow_winograd(false) keeps every convolution a direct sum. A non-finite input reaches every output
// of the tiles that read it (inf − inf within a transform gives NaN where a direct sum would give ±inf or a finite
// value): a NaN or inf still yields non-finite outputs, which is what anomaly mode and the GradScaler look for.
//
// Internal to the CPU backend (ops/cpu/conv.cpp) and its tests; AVX-512F, or AVX2 with FMA, chosen at run time
// (both compute every lane the same way: the same bits).
#pragma once

#include <cstdint>
#include <optional>

#include <mixtape/core/half.h>
#include <mixtape/ops/backend/kernels.h>

namespace mixtape::kernels::cpu {

/// The shapes of one Winograd convolution: x (n, c_in, h, w), weight (c_out, c_in, 3, 3), zero padding
/// (pad_h, pad_w) in [0, 2]; y (n, c_out, h + 2·pad_h − 2, w + 2·pad_w − 2).
struct WinogradShape {
  int64_t n, c_in, h, w, c_out, pad_h, pad_w;
  int64_t ho() const { return h + 2 * pad_h - 2; }
  int64_t wo() const { return w + 2 * pad_w - 2; }
};

/// Whether this CPU runs the Winograd kernels (AVX-512F, or AVX2 with FMA; as MIXTAPE_CPU_CAPABILITY allows).
bool winograd_supported();

// T is float, Half or BFloat16: f16/bf16 data are widened to f32 (exact), computed as f32, and each result rounded
// once to T (nearest even), as every lower-precision op's kernel does.

/// y = x ⋆ weight + bias (bias: c_out values, or nullptr); every pointer contiguous; overwrites y.
template <class T>
void winograd_conv2d(const WinogradShape& s, const T* x, const T* weight, const T* bias, T* y);

/// dx (n, c_in, h, w) = the gradient of winograd_conv2d in x for dy (n, c_out, ho, wo); overwrites dx.
template <class T>
void winograd_conv2d_backward_input(const WinogradShape& s, const T* dy, const T* weight, T* dx);

/// dweight (c_out, c_in, 3, 3) = the gradient of winograd_conv2d in weight, summed over the batch, and, unless
/// nullptr, dbias (c_out) = dy summed over (n, ho, wo) (each image's sum in f32, the images' in f64); overwrites.
template <class T>
void winograd_conv2d_backward_weight(const WinogradShape& s, const T* dy, const T* x, T* dweight, T* dbias);

/// How the CPU's conv2d kernels convolve.
enum class ConvPath {
  kAuto,      // Winograd where allowed (mixtape::set_allow_winograd) and use_winograd says so, im2col + GEMM elsewhere
  kWinograd,  // Winograd for every convolution it covers (f32, f16 or bf16, 3x3, stride 1, dilation 1, padding
              // <= 2), whatever the image size or set_allow_winograd
  kGemm,      // im2col + GEMM always: the path of every other CPU and window
};

/// The Winograd shape of the CPU's conv2d for input of this dtype and shape (N, C_in, H, W), C_out outputs and this
/// window when it takes the Winograd path; nullopt when it takes im2col + GEMM.
std::optional<WinogradShape> use_winograd(DType dtype, const Shape& x_shape, int64_t c_out, const Window2d& w);

/// Forces the CPU's conv2d path while alive, so tests and benchmarks can run both on one machine. Process-wide:
/// not for use while other threads convolve.
class ForceConvPath {
 public:
  explicit ForceConvPath(ConvPath path);
  ~ForceConvPath();
  ForceConvPath(const ForceConvPath&) = delete;
  ForceConvPath& operator=(const ForceConvPath&) = delete;

 private:
  ConvPath m_previous;
};

}  // namespace mixtape::kernels::cpu
