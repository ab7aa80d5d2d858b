// tests/test_libtorch.cpp — mixtape's ops against LibTorch's, on random calls: edge shapes, layouts, options, ties.
//
// The one design idea: each op has one generator that draws a call (dims of size 0 and 1, 0-d tensors,
// broadcasting partners, transposed, strided and expanded inputs, negative and out-of-range dims, options) and the
// call runs on both libraries from the same f32 values. Then the same questions: does either refuse it (mixtape
// only with a mixtape::Error), are shape, dtype and values the same, and the gradient of every input for the same
// dy. A last generator writes random programs of several ops whose values are reused, so that the tape adds
// gradients from several paths through broadcasts. The golden files (tests/golden/) pin PyTorch's numbers for
// chosen cases; this suite asks PyTorch about thousands of calls nobody chose, which is how max()'s shared gradient
// among ties, relu's gradient at NaN and squeeze(1) of a 0-d tensor were found. "ties" draws every value from five
// numbers, so that maxima repeat.
//
// Where mixtape differs from PyTorch 1.13 on purpose, the generator says so: `refused` lists the words of the
// errors mixtape raises for calls PyTorch accepts (mse_loss and linear do not broadcast, index_select needs a dim,
// ...), `torch_refused` the words of PyTorch's errors for calls mixtape answers (an empty max over an empty dim; a
// conv2d of some strided inputs that 1.13 cannot view). batch_norm's backward in 1.13 is wrong on non-contiguous
// inputs, so LibTorch gets contiguous copies of them there.
//
// Two builds of this file. test_libtorch (where LibTorch is found: Debian's libtorch-dev, which setup.sh does not
// install) asks LibTorch live; both libraries share the process, each on one thread. test_libtorch_replay (every
// build, so CI) has no LibTorch: it draws the same calls from the same seeds and compares mixtape's answers with
// LibTorch's as recorded in tests/golden/libtorch_ops.json.gz, its outcome of each call (error, sizes, dtype, values,
// gradients) and a fingerprint of the call's inputs, so that a generator changed since the recording is reported
// as such and not compared with answers to other calls. After changing a generator, record again where LibTorch is:
//   build/tests/test_libtorch --run_test=libtorch/record_libtorchs_answers
#if MIXTAPE_WITH_LIBTORCH
#include <torch/torch.h>
#endif

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <mixtape/core/atomic_file.h>
#include <mixtape/ops/ops.h>

#include "test_util.h"

namespace mt = mixtape;
using Sizes = std::vector<int64_t>;

#if MIXTAPE_WITH_LIBTORCH
using LibTorchTensor = torch::Tensor;
#define LIBTORCH_SIDE(...) __VA_ARGS__
#else
struct LibTorchTensor {};  // the replay build: LibTorch's side of a call is read from the golden file, never run
#define LIBTORCH_SIDE(...) nullptr
#endif

namespace {

/// How the values are drawn: uniform f32s, or five numbers (ties in every max and every pooling window).
enum class Values { kUniform, kTies };

struct Draw {
  std::mt19937_64 engine;
  Values values;
  int64_t integer(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(engine); }
  double real(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(engine); }
  bool chance(double p) { return real(0, 1) < p; }
  template <class T>
  T pick(std::initializer_list<T> options) {
    return options.begin()[integer(0, options.size() - 1)];
  }
};

std::string to_string(const Sizes& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t numel(const Sizes& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

/// One input: a leaf of `base` sizes holding `values`, and the view of it the op receives.
struct Input {
  enum class View { kNone, kTranspose, kEveryOther, kExpand } view = View::kNone;
  Sizes base, sizes;  // the leaf's sizes, the view's
  int64_t dim0 = 0, dim1 = 0;
  std::vector<double> values;  // f32 values, rounded to `dtype` by both libraries alike
  mt::DType dtype = mt::kF32;
  bool index = false;  // an i64 tensor of class or element indices: no gradient
  std::string describe() const {
    std::ostringstream os;
    os << (index ? "i64" : mt::dtype_name(dtype)) << to_string(base);
    if (view == View::kTranspose) os << ".transpose(" << dim0 << ", " << dim1 << ")";
    if (view == View::kEveryOther) os << ".slice(" << dim0 << ", 0, end, 2)";
    if (view == View::kExpand) os << ".expand(" << to_string(sizes) << ")";
    if (index) {
      os << " {";
      for (size_t i = 0; i < std::min<size_t>(values.size(), 8); ++i) os << (i ? " " : "") << values[i];
      os << (values.size() > 8 ? " ...}" : "}");
    }
    return os.str();
  }
};

/// An f32 input of `sizes` in a random layout, values in [lo, hi].
Input floats(Draw& d, const Sizes& sizes, double lo = -2, double hi = 2) {
  Input in;
  in.sizes = in.base = sizes;
  const int64_t rank = sizes.size();
  switch (rank == 0 ? 0 : d.integer(0, 5)) {
    case 1:
      in.dim0 = d.integer(0, rank - 1), in.dim1 = d.integer(0, rank - 1);
      if (in.dim0 != in.dim1) in.view = Input::View::kTranspose, std::swap(in.base[in.dim0], in.base[in.dim1]);
      break;
    case 2: in.dim0 = d.integer(0, rank - 1), in.view = Input::View::kEveryOther, in.base[in.dim0] *= 2; break;
    case 3: in.view = Input::View::kExpand, in.base[d.integer(0, rank - 1)] = 1; break;
    default: break;
  }
  for (int64_t i = 0; i < numel(in.base); ++i)
    in.values.push_back(d.values == Values::kTies ? d.pick({lo, hi, (lo + hi) / 2, hi, hi / 2})
                                                  : static_cast<float>(d.real(lo, hi)));
  return in;
}

/// An i64 input of `sizes` (contiguous), values in [lo, hi].
Input indices(Draw& d, const Sizes& sizes, int64_t lo, int64_t hi) {
  Input in;
  in.sizes = in.base = sizes;
  in.index = true;
  for (int64_t i = 0; i < numel(sizes); ++i) in.values.push_back(static_cast<double>(d.integer(lo, hi)));
  return in;
}

template <class T>
T viewed(T t, const Input& in) {
  switch (in.view) {
    case Input::View::kTranspose: return t.transpose(in.dim0, in.dim1);
    case Input::View::kEveryOther: return t.slice(in.dim0, 0, in.base[in.dim0], 2);
    case Input::View::kExpand:
      if constexpr (std::is_same_v<T, mt::Tensor>)
        return t.expand(mt::Shape(in.sizes));
      else
        return t.expand(in.sizes);
    case Input::View::kNone: break;
  }
  return t;
}

using MtFn = std::function<mt::Tensor(const std::vector<mt::Tensor>&)>;
using TorchFn = std::function<LibTorchTensor(const std::vector<LibTorchTensor>&)>;

struct Call {
  std::string what;  // the op and its options
  std::vector<Input> inputs;
  MtFn mixtape;
  TorchFn torch;
  /// Differences up to bound·max(1, max |PyTorch's value|) are rounding: the two libraries sum in other orders
  /// (mixtape's conv2d may use Winograd), and the f32 error grows with the number of terms summed.
  double bound = 1e-4;
  std::vector<std::string> refused, torch_refused;  // words of the errors that differ on purpose (above)
  bool torch_refused_if_empty = false;              // torch_refused holds only where mixtape's result is empty
  bool torch_contiguous = false;                    // LibTorch reads contiguous copies of the inputs
};

Call make_call(std::string what, std::vector<Input> inputs, MtFn mixtape, TorchFn torch, double bound = 1e-4) {
  Call c;
  c.what = std::move(what), c.inputs = std::move(inputs), c.mixtape = std::move(mixtape), c.torch = std::move(torch);
  c.bound = bound;
  return c;
}

/// What one library made of a call.
struct Outcome {
  std::optional<std::string> error;  // mixtape: "mixtape::Error: ..." or "other exception: ..."
  Sizes sizes;
  std::string dtype;
  std::vector<double> values;
  std::optional<std::string> backward_error;
  std::vector<std::optional<std::vector<double>>> grads;  // per input; nullopt: undefined
};

/// dy: the same f32 values on both sides, from a seed of its own.
std::vector<float> seed_gradient(const Sizes& sizes) {
  std::mt19937_64 engine(99);
  std::vector<float> dy(numel(sizes));
  for (float& v : dy) v = static_cast<float>(std::uniform_real_distribution<double>(-1, 1)(engine));
  return dy;
}

Outcome run_mixtape(const Call& call) {
  Outcome o;
  try {
    std::vector<mt::Tensor> leaves, args;
    for (const Input& in : call.inputs) {
      mt::Tensor t =
          in.index ? mt::from_vector(std::vector<int64_t>(in.values.begin(), in.values.end()), mt::Shape(in.base))
                   : mt::from_vector(std::vector<float>(in.values.begin(), in.values.end()), mt::Shape(in.base))
                         .to(in.dtype);
      if (!in.index) t.requires_grad_();
      leaves.push_back(t);
      args.push_back(viewed(t, in));
    }
    const mt::Tensor y = call.mixtape(args);
    o.sizes.assign(y.shape().begin(), y.shape().end());
    o.dtype = mt::dtype_name(y.dtype());
    o.values = y.detach().to(mt::kF64).to_vector<double>();
    if (!mt::is_floating(y.dtype()) || !y.requires_grad()) return o;
    try {
      y.backward(mt::from_vector(seed_gradient(o.sizes), y.shape()).to(y.dtype()));
      for (const mt::Tensor& leaf : leaves) {
        if (leaf.grad().defined())
          o.grads.emplace_back(leaf.grad().to(mt::kF64).to_vector<double>());
        else
          o.grads.emplace_back(std::nullopt);
      }
    } catch (const std::exception& e) {
      o.backward_error = e.what();
    }
  } catch (const mt::Error& e) {
    o.error = std::string("mixtape::Error: ") + e.what();
  } catch (const std::exception& e) {
    o.error = std::string("other exception: ") + e.what();
  }
  return o;
}

#if MIXTAPE_WITH_LIBTORCH
std::vector<double> doubles(const torch::Tensor& t) {
  const torch::Tensor c = t.detach().to(torch::kDouble).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

torch::ScalarType torch_dtype(mt::DType t) {
  switch (t) {
    case mt::kF64: return torch::kDouble;
    case mt::kF16: return torch::kHalf;
    case mt::kBF16: return torch::kBFloat16;
    default: return torch::kFloat;
  }
}

std::string dtype_name(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat: return "f32";
    case torch::kDouble: return "f64";
    case torch::kHalf: return "f16";
    case torch::kBFloat16: return "bf16";
    case torch::kLong: return "i64";
    case torch::kBool: return "bool";
    default: return c10::toString(t);
  }
}

/// A LibTorch error's message: its first line, not the backtrace (whose addresses change from run to run).
std::string message_of(const std::exception& e) {
  const std::string what = e.what();
  return what.substr(0, what.find('\n'));
}

Outcome run_torch(const Call& call) {
  Outcome o;
  try {
    std::vector<torch::Tensor> leaves, args;
    for (const Input& in : call.inputs) {
      std::vector<double> v = in.values;
      torch::Tensor t = torch::from_blob(v.data(), in.base, torch::kDouble).to(in.index ? torch::kLong : torch::kFloat);
      if (!in.index) t = t.to(torch_dtype(in.dtype));
      if (!in.index) t.requires_grad_();
      leaves.push_back(t);
      args.push_back(call.torch_contiguous ? viewed(t, in).contiguous() : viewed(t, in));
    }
    const torch::Tensor y = call.torch(args);
    o.sizes = y.sizes().vec();
    o.dtype = dtype_name(y.scalar_type());
    o.values = doubles(y);
    if (!y.is_floating_point() || !y.requires_grad()) return o;
    try {
      std::vector<float> dy = seed_gradient(o.sizes);
      y.backward(torch::from_blob(dy.data(), o.sizes, torch::kFloat).clone());
      for (const torch::Tensor& leaf : leaves) {
        if (leaf.grad().defined())
          o.grads.emplace_back(doubles(leaf.grad()));
        else
          o.grads.emplace_back(std::nullopt);
      }
    } catch (const std::exception& e) {
      o.backward_error = message_of(e);
    }
  } catch (const std::exception& e) {
    o.error = message_of(e);
  }
  return o;
}
#endif

/// The first element where `got` is off `want` by more than bound·max(1, max |want|), or nothing.
std::optional<std::string> differ(const std::vector<double>& got, const std::vector<double>& want, double bound) {
  if (got.size() != want.size()) return std::to_string(got.size()) + " elements against " + std::to_string(want.size());
  double scale = 1;
  for (double w : want)
    if (std::isfinite(w)) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i) {
    const bool same = got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i])) ||
                      std::fabs(got[i] - want[i]) <= bound * scale;
    if (same) continue;
    std::ostringstream os;
    os << "element " << i << ": " << got[i] << " against PyTorch's " << want[i];
    return os.str();
  }
  return std::nullopt;
}

bool mentions(const std::string& message, const std::vector<std::string>& words) {
  return std::any_of(words.begin(), words.end(),
                     [&](const std::string& w) { return message.find(w) != std::string::npos; });
}

/// What is wrong with mixtape's answer `m` to `call`, against LibTorch's `t`, or nothing.
std::optional<std::string> check(const Call& call, const Outcome& m, const Outcome& t) {
  if (m.error && m.error->rfind("mixtape::Error", 0) != 0)
    return "threw something else than mixtape::Error: " + *m.error;
  if (m.error && !t.error) {
    if (mentions(*m.error, call.refused)) return std::nullopt;
    return "refused what PyTorch accepts: " + *m.error + " (PyTorch: sizes " + to_string(t.sizes) + ")";
  }
  if (t.error && !m.error) {
    if (mentions(*t.error, call.torch_refused) && (!call.torch_refused_if_empty || numel(m.sizes) == 0))
      return std::nullopt;
    return "accepted what PyTorch refuses (" + *t.error + "): sizes " + to_string(m.sizes);
  }
  if (m.error) return std::nullopt;  // both refuse
  if (m.sizes != t.sizes) return "sizes " + to_string(m.sizes) + " against PyTorch's " + to_string(t.sizes);
  if (m.dtype != t.dtype) return "dtype " + m.dtype + " against PyTorch's " + t.dtype;
  if (auto d = differ(m.values, t.values, call.bound)) return "forward: " + *d;
  if (m.backward_error || t.backward_error) {
    if (m.backward_error && t.backward_error) return std::nullopt;
    return m.backward_error ? "backward refused: " + *m.backward_error
                            : "backward accepted what PyTorch refuses: " + *t.backward_error;
  }
  if (m.grads.size() != t.grads.size()) return std::string("a gradient where PyTorch has none, or none where it has");
  for (size_t i = 0; i < m.grads.size(); ++i) {
    if (m.grads[i].has_value() != t.grads[i].has_value())
      return "input " + std::to_string(i) + "'s gradient is " + (m.grads[i] ? "" : "un") + "defined, PyTorch's is not";
    if (!m.grads[i]) continue;
    if (auto d = differ(*m.grads[i], *t.grads[i], call.bound))
      return "gradient of input " + std::to_string(i) + ": " + *d;
  }
  return std::nullopt;
}

// ---- the generators ------------------------------------------------------------------------------------------------

/// Sizes of rank [min_rank, max_rank], each dim 0 (with `zeros`), 1 to 5 or 17 (a 16-lane vector loop and its tail).
Sizes sizes(Draw& d, int min_rank = 0, int max_rank = 4, bool zeros = true) {
  Sizes s(d.integer(min_rank, max_rank));
  for (int64_t& n : s) n = zeros && d.chance(0.08) ? 0 : d.pick<int64_t>({1, 1, 2, 3, 4, 5, 17});
  return s;
}

/// Sizes that broadcast with `s`: its trailing dims, some of them 1, and maybe a leading one more.
Sizes partner(Draw& d, const Sizes& s) {
  if (d.chance(0.5)) return s;
  Sizes p(s.begin() + d.integer(0, s.size()), s.end());
  for (int64_t& n : p)
    if (d.chance(0.3)) n = 1;
  if (d.chance(0.2)) p.insert(p.begin(), d.pick<int64_t>({1, 2}));
  return p;
}

/// A dim of a rank-`rank` tensor, negative half the time; a 0-d tensor has -1 and 0 (and rarely one out of range).
int64_t any_dim(Draw& d, int64_t rank) {
  if (d.chance(0.04)) return rank + 1;
  return rank == 0 ? d.integer(-1, 0) : d.integer(-rank, rank - 1);
}

mt::Reduction mt_reduction(int r) {
  return r == 0 ? mt::Reduction::kNone : r == 1 ? mt::Reduction::kMean : mt::Reduction::kSum;
}

struct Generator {
  std::string op;
  std::function<Call(Draw&)> draw;
};

#define MIXTAPE_CALL(expr) [=](const std::vector<mt::Tensor>& a) -> mt::Tensor { return expr; }
#define LIBTORCH_CALL(expr) LIBTORCH_SIDE([=](const std::vector<torch::Tensor>& a) -> torch::Tensor { return expr; })

/// One step of a random program: an op over earlier values (the inputs first, then each step's result).
struct Step {
  enum Op {
    // of two values
    kAdd, kMul, kSub, kDivide, kMaximum, kMinimum, kWhere,
    // of one
    kTanh, kRelu, kSigmoid, kAbs, kClamp,
    // of one, over a dim
    kSum, kMean, kMax, kMin, kSoftmax, kLogSoftmax, kCount
  } op;
  static constexpr Op kLastBinary = kWhere, kFirstOverDim = kSum;
  size_t a, b;       // the values it reads
  int64_t from_end;  // the reductions' and softmaxes' dim: -1 - from_end (mod a's rank); reduced dims stay as
                     // size 1, so that every value broadcasts with every other
};

std::string describe(const std::vector<Step>& program, size_t inputs) {
  static const char* const kNames[] = {
      "add",  "mul",  "sub",  "divide", "maximum", "minimum", "where a > 0",  // of two values
      "tanh", "relu", "sigmoid", "abs", "clamp(-0.6, 0.7)",                  // of one
      "sum",  "mean", "max",  "min",    "softmax", "log_softmax"};           // over a dim
  static_assert(std::size(kNames) == Step::kCount);
  std::ostringstream os;
  for (size_t i = 0; i < program.size(); ++i) {
    const Step& s = program[i];
    os << (i ? "; " : "") << "v" << inputs + i << " = " << kNames[s.op] << "(v" << s.a;
    if (s.op <= Step::kLastBinary) os << ", v" << s.b;
    if (s.op >= Step::kFirstOverDim) os << ", dim -1-" << s.from_end;
    os << ")";
  }
  return os.str();
}

/// max and min along a dim: mixtape returns the values, LibTorch (values, indices).
mt::Tensor values_of(const mt::Tensor& max) {
  return max;
}

/// A 0-d zero of x's library (where's condition in a program).
mt::Tensor zero_of(const mt::Tensor&) {
  return mt::zeros({});
}

#if MIXTAPE_WITH_LIBTORCH
/// An optional bound as LibTorch takes it (c10::optional<Scalar>).
c10::optional<c10::Scalar> scalar(std::optional<double> v) {
  if (!v) return c10::nullopt;
  return c10::Scalar(*v);
}

torch::Tensor values_of(const std::tuple<torch::Tensor, torch::Tensor>& max) {
  return std::get<0>(max);
}

torch::Tensor zero_of(const torch::Tensor&) {
  return torch::zeros({});
}
#endif

/// Runs `program` over `inputs` with either library's ops: their names and arguments are the same, and the
/// unqualified calls find mixtape's or ATen's by the argument's namespace.
template <class T>
T run_program(const std::vector<Step>& program, const std::vector<T>& inputs) {
  const T zero = zero_of(inputs[0]);
  std::vector<T> v = inputs;
  for (const Step& s : program) {
    const T a = v[s.a], b = v[s.b];
    const int64_t dim = a.dim() == 0 ? -1 : -1 - s.from_end % a.dim();
    switch (s.op) {
      case Step::kAdd: v.push_back(a + b); break;
      case Step::kMul: v.push_back(a * b); break;
      case Step::kSub: v.push_back(a - b); break;
      case Step::kDivide: v.push_back(a / (sigmoid(b) + 1.5)); break;  // by a value in [1.5, 2.5]: away from 0
      case Step::kMaximum: v.push_back(maximum(a, b)); break;
      case Step::kMinimum: v.push_back(minimum(a, b)); break;
      case Step::kWhere: v.push_back(where(gt(a, zero), a, b)); break;
      case Step::kTanh: v.push_back(tanh(a)); break;
      case Step::kRelu: v.push_back(relu(a)); break;
      case Step::kSigmoid: v.push_back(sigmoid(a)); break;
      case Step::kAbs: v.push_back(abs(a)); break;
      case Step::kClamp: v.push_back(clamp(a, -0.6, 0.7)); break;  // bounds no step's result lands on exactly
      case Step::kSum: v.push_back(sum(a, {dim}, true)); break;
      case Step::kMean: v.push_back(mean(a, {dim}, true)); break;
      case Step::kMax: v.push_back(values_of(max(a, dim, true))); break;
      case Step::kMin: v.push_back(values_of(min(a, dim, true))); break;
      case Step::kSoftmax: v.push_back(softmax(a, dim)); break;
      case Step::kLogSoftmax: v.push_back(log_softmax(a, dim)); break;
      case Step::kCount: break;
    }
  }
  return v.back();
}

std::vector<Generator> generators() {
  std::vector<Generator> g;
  auto unary = [&](std::string op, double lo, double hi, MtFn m, TorchFn t) {
    g.push_back({op, [=](Draw& d) { return make_call(op, {floats(d, sizes(d), lo, hi)}, m, t); }});
  };
  unary("neg", -2, 2, MIXTAPE_CALL(mt::neg(a[0])), LIBTORCH_CALL(torch::neg(a[0])));
  unary("exp", -2, 2, MIXTAPE_CALL(mt::exp(a[0])), LIBTORCH_CALL(torch::exp(a[0])));
  unary("log", 0.1, 2, MIXTAPE_CALL(mt::log(a[0])), LIBTORCH_CALL(torch::log(a[0])));
  unary("sqrt", 0.1, 2, MIXTAPE_CALL(mt::sqrt(a[0])), LIBTORCH_CALL(torch::sqrt(a[0])));
  unary("relu", -2, 2, MIXTAPE_CALL(mt::relu(a[0])), LIBTORCH_CALL(torch::relu(a[0])));
  unary("gelu", -3, 3, MIXTAPE_CALL(mt::gelu(a[0])), LIBTORCH_CALL(torch::gelu(a[0])));
  unary("gelu tanh", -3, 3, MIXTAPE_CALL(mt::gelu(a[0], "tanh")), LIBTORCH_CALL(torch::gelu(a[0], "tanh")));
  unary("sigmoid", -3, 3, MIXTAPE_CALL(mt::sigmoid(a[0])), LIBTORCH_CALL(torch::sigmoid(a[0])));
  unary("tanh", -3, 3, MIXTAPE_CALL(mt::tanh(a[0])), LIBTORCH_CALL(torch::tanh(a[0])));
  for (double e : {2.0, 3.0, 0.0, -0.5, 1.5})
    unary("pow " + std::to_string(e), e == -0.5 || e == 1.5 ? 0.2 : -2, 2, MIXTAPE_CALL(mt::pow(a[0], e)),
          LIBTORCH_CALL(torch::pow(a[0], e)));
  unary("1.5 - x", -2, 2, MIXTAPE_CALL(1.5 - a[0]), LIBTORCH_CALL(1.5 - a[0]));
  unary("x / 3", -2, 2, MIXTAPE_CALL(a[0] / 3.0), LIBTORCH_CALL(a[0] / 3.0));
  unary("sum", -2, 2, MIXTAPE_CALL(mt::sum(a[0])), LIBTORCH_CALL(torch::sum(a[0])));
  unary("mean", -2, 2, MIXTAPE_CALL(mt::mean(a[0])), LIBTORCH_CALL(torch::mean(a[0])));
  unary("max", -2, 2, MIXTAPE_CALL(mt::max(a[0])), LIBTORCH_CALL(torch::max(a[0])));
  unary("argmax", -2, 2, MIXTAPE_CALL(mt::argmax(a[0])), LIBTORCH_CALL(torch::argmax(a[0])));
  unary("min", -2, 2, MIXTAPE_CALL(mt::min(a[0])), LIBTORCH_CALL(torch::min(a[0])));
  unary("argmin", -2, 2, MIXTAPE_CALL(mt::argmin(a[0])), LIBTORCH_CALL(torch::argmin(a[0])));
  unary("abs", -2, 2, MIXTAPE_CALL(mt::abs(a[0])), LIBTORCH_CALL(torch::abs(a[0])));
  unary("contiguous", -2, 2, MIXTAPE_CALL(a[0].contiguous()), LIBTORCH_CALL(a[0].contiguous()));
  unary("squeeze", -2, 2, MIXTAPE_CALL(a[0].squeeze() * 1.0), LIBTORCH_CALL(a[0].squeeze() * 1.0));
  unary("t", -2, 2, MIXTAPE_CALL(a[0].t() * 1.0), LIBTORCH_CALL(a[0].t() * 1.0));
  unary("dropout p=0", -2, 2, MIXTAPE_CALL(mt::dropout(a[0], 0.0)), LIBTORCH_CALL(torch::dropout(a[0], 0.0, true)));
  unary("dropout p=1", -2, 2, MIXTAPE_CALL(mt::dropout(a[0], 1.0)), LIBTORCH_CALL(torch::dropout(a[0], 1.0, true)));
  unary("dropout eval", -2, 2, MIXTAPE_CALL(mt::dropout(a[0], 0.5, false)),
        LIBTORCH_CALL(torch::dropout(a[0], 0.5, false)));
  unary("to bf16 and back", -2, 2, MIXTAPE_CALL(a[0].to(mt::kBF16).to(mt::kF32)),
        LIBTORCH_CALL(a[0].to(torch::kBFloat16).to(torch::kFloat)));
  unary("to f16 and back", -2, 2, MIXTAPE_CALL(a[0].to(mt::kF16).to(mt::kF32)),
        LIBTORCH_CALL(a[0].to(torch::kHalf).to(torch::kFloat)));

  // The bound of a call in 16-bit dtypes (the 16-bit section below): 4 units in the last place of the narrowest.
  const auto bound_of = [](std::initializer_list<mt::DType> dtypes) {
    double bound = 1e-4;
    for (mt::DType t : dtypes) bound = std::max(bound, t == mt::kBF16 ? 0x1p-6 : t == mt::kF16 ? 0x1p-8 : 0.0);
    return bound;
  };
  // Two operands that broadcast; with `mixed_dtypes`, each in f64, f32, f16 or bf16 (the 16-bit section below).
  auto binary = [&](std::string op, MtFn m, TorchFn t, bool mixed_dtypes = false) {
    g.push_back({mixed_dtypes ? op + " of mixed dtypes" : op, [=](Draw& d) {
                   Sizes s = sizes(d), p = partner(d, s);
                   if (d.chance(0.5)) std::swap(s, p);
                   Input a = floats(d, s), b = floats(d, p, 0.5, 2);  // b in [0.5, 2]: a divisor
                   if (!mixed_dtypes) return make_call(op, {a, b}, m, t);
                   a.dtype = d.pick({mt::kF64, mt::kF32, mt::kF16, mt::kBF16});
                   b.dtype = s.empty() != p.empty() ? a.dtype : d.pick({mt::kF64, mt::kF32, mt::kF16, mt::kBF16});
                   Call c = make_call(op, {a, b}, m, t, bound_of({a.dtype, b.dtype}));
                   c.torch_refused = {"not implemented for 'Half'"};
                   return c;
                 }});
  };
  binary("add", MIXTAPE_CALL(mt::add(a[0], a[1])), LIBTORCH_CALL(torch::add(a[0], a[1])));
  binary("sub", MIXTAPE_CALL(mt::sub(a[0], a[1])), LIBTORCH_CALL(torch::sub(a[0], a[1])));
  binary("mul", MIXTAPE_CALL(mt::mul(a[0], a[1])), LIBTORCH_CALL(torch::mul(a[0], a[1])));
  binary("div", MIXTAPE_CALL(mt::div(a[0], a[1])), LIBTORCH_CALL(torch::div(a[0], a[1])));
  binary("lt", MIXTAPE_CALL(mt::lt(a[0], a[1])), LIBTORCH_CALL(torch::lt(a[0], a[1])));
  binary("ge", MIXTAPE_CALL(mt::ge(a[0], a[1])), LIBTORCH_CALL(torch::ge(a[0], a[1])));
  binary("maximum", MIXTAPE_CALL(mt::maximum(a[0], a[1])), LIBTORCH_CALL(torch::maximum(a[0], a[1])));
  binary("minimum", MIXTAPE_CALL(mt::minimum(a[0], a[1])), LIBTORCH_CALL(torch::minimum(a[0], a[1])));
  binary("eq", MIXTAPE_CALL(mt::eq(a[0], a[0] + a[1] * 0.0)), LIBTORCH_CALL(torch::eq(a[0], a[0] + a[1] * 0.0)));

  // Reductions and row ops over dims: negative, repeated (sum/mean refuse both), out of range.
  auto over_dims = [&](std::string op, std::function<mt::Tensor(const mt::Tensor&, Sizes, bool)> m,
                       std::function<LibTorchTensor(const LibTorchTensor&, Sizes, bool)> t) {
    g.push_back({op, [=](Draw& d) {
                   const Sizes s = sizes(d);
                   Sizes dims(d.integer(0, std::max<int64_t>(s.size(), 1)));
                   for (int64_t& dim : dims) dim = any_dim(d, s.size());
                   const bool keepdim = d.chance(0.5);
                   const std::string what = op + " dims " + to_string(dims) + (keepdim ? " keepdim" : "");
                   return make_call(
                       what, {floats(d, s)}, [=](const auto& a) { return m(a[0], dims, keepdim); },
                       [=](const auto& a) { return t(a[0], dims, keepdim); });
                 }});
  };
  over_dims(
      "sum", [](const mt::Tensor& x, Sizes dims, bool k) { return mt::sum(x, dims, k); },
      LIBTORCH_SIDE([](const torch::Tensor& x, Sizes dims, bool k) { return torch::sum(x, dims, k); }));
  over_dims(
      "mean", [](const mt::Tensor& x, Sizes dims, bool k) { return mt::mean(x, dims, k); },
      LIBTORCH_SIDE([](const torch::Tensor& x, Sizes dims, bool k) { return torch::mean(x, dims, k); }));

  // Ops of one dim (keepdim, or a second choice, in `flag`).
  auto over_dim = [&](std::string op, std::function<mt::Tensor(const mt::Tensor&, int64_t, bool)> m,
                      std::function<LibTorchTensor(const LibTorchTensor&, int64_t, bool)> t,
                      std::vector<std::string> torch_refused = {}) {
    g.push_back({op, [=](Draw& d) {
                   const Sizes s = sizes(d);
                   const int64_t dim = any_dim(d, s.size());
                   const bool flag = d.chance(0.5);
                   Call c = make_call(
                       op + " dim " + std::to_string(dim) + (flag ? " (flag)" : ""), {floats(d, s)},
                       [=](const auto& a) { return m(a[0], dim, flag); },
                       [=](const auto& a) { return t(a[0], dim, flag); });
                   c.torch_refused = torch_refused;
                   c.torch_refused_if_empty = true;
                   return c;
                 }});
  };
  // PyTorch refuses a max over an empty dim even when the result is empty too; mixtape returns the empty result.
  over_dim(
      "max", [](const mt::Tensor& x, int64_t dim, bool k) { return mt::max(x, dim, k); },
      LIBTORCH_SIDE([](const torch::Tensor& x, int64_t dim, bool k) { return std::get<0>(torch::max(x, dim, k)); }),
      {"Expected reduction dim"});
  over_dim(
      "argmax", [](const mt::Tensor& x, int64_t dim, bool k) { return mt::argmax(x, dim, k); },
      LIBTORCH_SIDE([](const torch::Tensor& x, int64_t dim, bool k) { return torch::argmax(x, dim, k); }),
      {"Expected reduction dim"});
  over_dim(
      "min", [](const mt::Tensor& x, int64_t dim, bool k) { return mt::min(x, dim, k); },
      LIBTORCH_SIDE([](const torch::Tensor& x, int64_t dim, bool k) { return std::get<0>(torch::min(x, dim, k)); }),
      {"Expected reduction dim"});
  over_dim(
      "argmin", [](const mt::Tensor& x, int64_t dim, bool k) { return mt::argmin(x, dim, k); },
      LIBTORCH_SIDE([](const torch::Tensor& x, int64_t dim, bool k) { return torch::argmin(x, dim, k); }),
      {"Expected reduction dim"});
  over_dim(
      "softmax", [](const mt::Tensor& x, int64_t dim, bool) { return mt::softmax(x, dim); },
      LIBTORCH_SIDE([](const torch::Tensor& x, int64_t dim, bool) { return torch::softmax(x, dim); }));
  over_dim(
      "log_softmax", [](const mt::Tensor& x, int64_t dim, bool) { return mt::log_softmax(x, dim); },
      LIBTORCH_SIDE([](const torch::Tensor& x, int64_t dim, bool) { return torch::log_softmax(x, dim); }));
  over_dim(
      "squeeze", [](const mt::Tensor& x, int64_t dim, bool) { return x.squeeze(dim) * 1.0; },
      LIBTORCH_SIDE([](const torch::Tensor& x, int64_t dim, bool) { return x.squeeze(dim) * 1.0; }));
  over_dim(
      "unsqueeze", [](const mt::Tensor& x, int64_t dim, bool end) { return x.unsqueeze(end ? dim : dim + 1) * 1.0; },
      LIBTORCH_SIDE([](const torch::Tensor& x, int64_t dim, bool end) {
        return x.unsqueeze(end ? dim : dim + 1) * 1.0;
      }));
  over_dim(
      "select the first or last",
      [](const mt::Tensor& x, int64_t dim, bool first) { return x.select(dim, first ? 0 : -1) * 1.0; },
      LIBTORCH_SIDE([](const torch::Tensor& x, int64_t dim, bool first) {
        return x.select(dim, first ? 0 : -1) * 1.0;
      }));
  over_dim(
      "flatten", [](const mt::Tensor& x, int64_t dim, bool from) { return from ? x.flatten(dim) : x.flatten(0, dim); },
      LIBTORCH_SIDE([](const torch::Tensor& x, int64_t dim, bool from) {
        return from ? x.flatten(dim) : x.flatten(0, dim);
      }));

  // Views.
  g.push_back({"transpose", [](Draw& d) {
                 const Sizes s = sizes(d);
                 const int64_t d0 = any_dim(d, s.size()), d1 = any_dim(d, s.size());
                 return make_call("transpose(" + std::to_string(d0) + ", " + std::to_string(d1) + ")", {floats(d, s)},
                                  MIXTAPE_CALL(a[0].transpose(d0, d1) * 1.0),
                                  LIBTORCH_CALL(a[0].transpose(d0, d1) * 1.0));
               }});
  g.push_back({"permute", [](Draw& d) {
                 const Sizes s = sizes(d);
                 Sizes order(s.size());
                 for (size_t i = 0; i < order.size(); ++i) order[i] = i - (d.chance(0.3) ? s.size() : 0);
                 std::shuffle(order.begin(), order.end(), d.engine);
                 if (!order.empty() && d.chance(0.05)) order[0] = order.back();  // a repeated dim
                 return make_call("permute" + to_string(order), {floats(d, s)},
                                  MIXTAPE_CALL(a[0].permute(mt::Shape(order)) * 1.0),
                                  LIBTORCH_CALL(a[0].permute(order) * 1.0));
               }});
  g.push_back({"slice", [](Draw& d) {
                 const Sizes s = sizes(d, 1);
                 const int64_t dim = any_dim(d, s.size()), start = d.integer(-7, 7), end = d.integer(-7, 9);
                 const int64_t step = d.chance(0.05) ? 0 : d.integer(1, 3);
                 std::ostringstream what;
                 what << "slice(" << dim << ", " << start << ", " << end << ", " << step << ")";
                 return make_call(what.str(), {floats(d, s)}, MIXTAPE_CALL(a[0].slice(dim, start, end, step) * 1.0),
                                  LIBTORCH_CALL(a[0].slice(dim, start, end, step) * 1.0));
               }});
  g.push_back({"narrow", [](Draw& d) {
                 const Sizes s = sizes(d, 1);
                 const int64_t dim = any_dim(d, s.size()), start = d.integer(-5, 5), length = d.integer(0, 4);
                 std::ostringstream what;
                 what << "narrow(" << dim << ", " << start << ", " << length << ")";
                 Call c = make_call(what.str(), {floats(d, s)}, MIXTAPE_CALL(a[0].narrow(dim, start, length) * 1.0),
                                    LIBTORCH_CALL(a[0].narrow(dim, start, length) * 1.0));
                 c.refused = {"of size 0 (shape"};  // PyTorch takes start -1 of an empty dim as 0 there
                 return c;
               }});
  g.push_back({"select an index", [](Draw& d) {
                 const Sizes s = sizes(d, 1);
                 const int64_t dim = any_dim(d, s.size()), index = d.integer(-6, 6);
                 return make_call("select(" + std::to_string(dim) + ", " + std::to_string(index) + ")", {floats(d, s)},
                                  MIXTAPE_CALL(a[0].select(dim, index) * 1.0),
                                  LIBTORCH_CALL(a[0].select(dim, index) * 1.0));
               }});
  g.push_back({"reshape", [](Draw& d) {
                 const Sizes s = sizes(d);
                 Sizes to = s;
                 std::shuffle(to.begin(), to.end(), d.engine);
                 if (!to.empty() && d.chance(0.4)) to[d.integer(0, to.size() - 1)] = -1;
                 if (d.chance(0.2)) to.push_back(1);
                 if (d.chance(0.1)) to = {-1, -1};
                 return make_call("reshape" + to_string(to), {floats(d, s)},
                                  MIXTAPE_CALL(a[0].reshape(mt::Shape(to)) * 1.0),
                                  LIBTORCH_CALL(a[0].reshape(to) * 1.0));
               }});
  g.push_back({"view", [](Draw& d) {
                 const Sizes s = sizes(d);
                 const Sizes to = s.size() >= 2 && d.chance(0.5) ? Sizes{s[0], -1} : Sizes{-1};
                 return make_call("view" + to_string(to), {floats(d, s)}, MIXTAPE_CALL(a[0].view(mt::Shape(to)) * 1.0),
                                  LIBTORCH_CALL(a[0].view(to) * 1.0));
               }});
  g.push_back({"expand", [](Draw& d) {
                 Sizes s = sizes(d, 0, 3);
                 for (int64_t& n : s)
                   if (d.chance(0.5)) n = 1;
                 Sizes to = s;
                 for (int64_t& n : to)
                   if (n == 1 && d.chance(0.6)) n = d.pick<int64_t>({0, 2, 3, -1});
                 if (d.chance(0.3)) to.insert(to.begin(), d.pick<int64_t>({2, 0}));
                 return make_call("expand" + to_string(to), {floats(d, s)},
                                  MIXTAPE_CALL(a[0].expand(mt::Shape(to)) * 1.0), LIBTORCH_CALL(a[0].expand(to) * 1.0));
               }});

  // Products.
  g.push_back({"matmul", [](Draw& d) {
                 const Sizes x = sizes(d, 1);
                 Sizes w;
                 switch (d.integer(0, 3)) {
                   case 0: w = {x.back()}; break;
                   case 1: w = {x.back(), d.pick<int64_t>({0, 1, 3, 5})}; break;
                   default:
                     w = partner(d, Sizes(x.begin(), x.end() - (x.size() >= 2 ? 2 : 1)));
                     w.push_back(x.back());
                     w.push_back(d.pick<int64_t>({1, 2, 4}));
                 }
                 if (d.chance(0.05)) w[0] += 1;  // sizes that do not multiply
                 return make_call("matmul", {floats(d, x), floats(d, w)}, MIXTAPE_CALL(mt::matmul(a[0], a[1])),
                                  LIBTORCH_CALL(torch::matmul(a[0], a[1])));
               }});
  g.push_back({"matmul of a vector", [](Draw& d) {
                 const int64_t k = d.pick<int64_t>({0, 1, 3, 4});
                 Sizes w = sizes(d, 0, 2);
                 w.push_back(k);
                 w.push_back(d.pick<int64_t>({1, 3}));
                 return make_call("matmul (k) by (..., k, n)", {floats(d, {k}), floats(d, w)},
                                  MIXTAPE_CALL(mt::matmul(a[0], a[1])), LIBTORCH_CALL(torch::matmul(a[0], a[1])));
               }});
  g.push_back({"linear", [](Draw& d) {
                 const Sizes x = sizes(d, 1, 3);
                 const int64_t out = d.pick<int64_t>({0, 1, 3, 4});
                 Call c = make_call("linear", {floats(d, x), floats(d, {out, x.back()})},
                                    MIXTAPE_CALL(mt::linear(a[0], a[1], a.size() > 2 ? a[2] : mt::Tensor())),
                                    LIBTORCH_CALL(torch::linear(a[0], a[1], a.size() > 2 ? a[2] : torch::Tensor())));
                 if (d.chance(0.6))
                   c.what += " with bias", c.inputs.push_back(floats(d, {d.chance(0.9) ? out : out + 1}));
                 c.refused = {"expected bias of shape [0]"};  // PyTorch broadcasts a bias of 1 to 0 outputs
                 return c;
               }});
  g.push_back(
      {"conv2d", [](Draw& d) {
         int64_t k[2] = {d.integer(1, 3), d.integer(1, 3)}, stride[2] = {d.integer(1, 2), d.integer(1, 2)};
         int64_t padding[2] = {d.integer(0, 2), d.integer(0, 2)}, dilation[2] = {d.integer(1, 2), d.integer(1, 2)};
         if (d.chance(0.6))  // the Winograd case: 3x3, stride 1, dilation 1
           k[0] = k[1] = 3, stride[0] = stride[1] = dilation[0] = dilation[1] = 1, padding[1] = padding[0];
         const int64_t ci = d.pick<int64_t>({1, 2, 3}), co = d.pick<int64_t>({1, 2, 4});
         Sizes x = {d.pick<int64_t>({0, 1, 2}), ci, d.integer(1, 7), d.integer(1, 7)};
         if (d.chance(0.1)) x.erase(x.begin());  // (C, H, W)
         std::ostringstream what;
         what << "conv2d kernel " << k[0] << "x" << k[1] << " stride " << stride[0] << "x" << stride[1] << " padding "
              << padding[0] << "x" << padding[1] << " dilation " << dilation[0] << "x" << dilation[1];
         Call c = make_call(
             what.str(), {floats(d, x), floats(d, {co, ci, k[0], k[1]})},
             [=](const std::vector<mt::Tensor>& a) {
               mt::Conv2dOptions o;
               for (int i = 0; i < 2; ++i)
                 o.stride[i] = stride[i], o.padding[i] = padding[i], o.dilation[i] = dilation[i];
               return mt::conv2d(a[0], a[1], a.size() > 2 ? a[2] : mt::Tensor(), o);
             },
             LIBTORCH_SIDE([=](const std::vector<torch::Tensor>& a) {
               return torch::conv2d(a[0], a[1], a.size() > 2 ? a[2] : torch::Tensor(), {stride[0], stride[1]},
                                    {padding[0], padding[1]}, {dilation[0], dilation[1]});
             }));
         if (d.chance(0.6)) c.what += " with bias", c.inputs.push_back(floats(d, {co}));
         c.bound = 2e-4;  // Winograd's transforms: a few 1e-6 of the largest output more (ops/ops.h)
         c.torch_refused = {"view size is not compatible"};  // 1.13 on some strided inputs
         return c;
       }});

  // Pooling.
  for (const bool is_max : {true, false}) {
    const std::string op = is_max ? "max_pool2d" : "avg_pool2d";
    g.push_back({op, [=](Draw& d) {
                   int64_t k[2] = {d.integer(1, 3), d.integer(1, 3)}, stride[2] = {d.integer(0, 3), d.integer(0, 3)};
                   int64_t padding[2] = {d.integer(0, 1), d.integer(0, 1)};
                   if (d.chance(0.5)) k[0] = k[1] = 2, stride[0] = stride[1] = padding[0] = padding[1] = 0;
                   Sizes x = {d.pick<int64_t>({0, 1, 2}), d.pick<int64_t>({1, 2, 3}), d.integer(1, 8), d.integer(1, 8)};
                   if (d.chance(0.2)) x.erase(x.begin());
                   std::ostringstream what;
                   what << op << " kernel " << k[0] << "x" << k[1] << " stride " << stride[0] << "x" << stride[1]
                        << " padding " << padding[0] << "x" << padding[1];
                   return make_call(
                       what.str(), {floats(d, x)},
                       [=](const std::vector<mt::Tensor>& a) {
                         mt::Pool2dOptions o;
                         for (int i = 0; i < 2; ++i)
                           o.kernel_size[i] = k[i], o.stride[i] = stride[i], o.padding[i] = padding[i];
                         return is_max ? mt::max_pool2d(a[0], o) : mt::avg_pool2d(a[0], o);
                       },
                       LIBTORCH_SIDE([=](const std::vector<torch::Tensor>& a) {
                         // PyTorch's stride [] is the kernel's, as mixtape's 0 is (per dim).
                         Sizes s = {stride[0] ? stride[0] : k[0], stride[1] ? stride[1] : k[1]};
                         if (stride[0] == 0 && stride[1] == 0) s = {};
                         return is_max ? torch::max_pool2d(a[0], {k[0], k[1]}, s, {padding[0], padding[1]})
                                       : torch::avg_pool2d(a[0], {k[0], k[1]}, s, {padding[0], padding[1]});
                       }));
                 }});
  }

  // Normalisation.
  g.push_back({"layer_norm", [](Draw& d) {
                 const Sizes s = sizes(d, 1);
                 Sizes normalized(s.end() - d.integer(1, s.size()), s.end());
                 if (d.chance(0.05)) normalized[0] += 1;
                 const bool weight = d.chance(0.5), bias = d.chance(0.5);
                 Call c = make_call(
                     "layer_norm over " + to_string(normalized) + (weight ? " weight" : "") + (bias ? " bias" : ""),
                     {floats(d, s)},
                     [=](const std::vector<mt::Tensor>& a) {
                       return mt::layer_norm(a[0], mt::Shape(normalized), weight ? a[1] : mt::Tensor(),
                                             bias ? a.back() : mt::Tensor());
                     },
                     LIBTORCH_SIDE([=](const std::vector<torch::Tensor>& a) {
                       return torch::layer_norm(a[0], normalized, weight ? a[1] : torch::Tensor(),
                                                bias ? a.back() : torch::Tensor());
                     }));
                 if (weight) c.inputs.push_back(floats(d, normalized));
                 if (bias) c.inputs.push_back(floats(d, normalized));
                 c.bound = 5e-4;  // 1/σ amplifies the mean's rounding in rows of nearly equal values
                 return c;
               }});
  g.push_back({"batch_norm", [](Draw& d) {
                 Sizes s = {d.pick<int64_t>({1, 2, 3, 5}), d.pick<int64_t>({1, 2, 3})};
                 for (int64_t extra = d.integer(0, 2); extra > 0; --extra) s.push_back(d.pick<int64_t>({1, 2, 3}));
                 const int64_t C = s[1];
                 const bool training = d.chance(0.6), affine = d.chance(0.5);
                 std::vector<float> mean, var;
                 for (int64_t c = 0; c < C; ++c) mean.push_back(d.real(-1, 1)), var.push_back(d.real(0.5, 2));
                 Call c = make_call(
                     std::string("batch_norm ") + (training ? "training" : "eval") + (affine ? " affine" : ""),
                     {floats(d, s)},
                     [=](const std::vector<mt::Tensor>& a) {
                       return mt::batch_norm(a[0], mt::from_vector(mean, {C}), mt::from_vector(var, {C}),
                                             affine ? a[1] : mt::Tensor(), affine ? a[2] : mt::Tensor(), training);
                     },
                     LIBTORCH_SIDE([=](const std::vector<torch::Tensor>& a) {
                       return torch::batch_norm(a[0], affine ? a[1] : torch::Tensor(), affine ? a[2] : torch::Tensor(),
                                                torch::tensor(mean), torch::tensor(var), training, 0.1, 1e-5, false);
                     }));
                 if (affine) c.inputs.push_back(floats(d, {C})), c.inputs.push_back(floats(d, {C}));
                 c.bound = 5e-4;
                 c.torch_contiguous = true;  // 1.13's backward is wrong on transposed and expanded inputs
                 c.refused = {"more than 1 value per channel"};  // as torch.nn.functional's check, which C++ lacks
                 return c;
               }});

  // Losses.
  for (const bool nll : {false, true}) {
    g.push_back({nll ? "nll_loss" : "cross_entropy", [=](Draw& d) {
                   const int64_t n = d.pick<int64_t>({0, 1, 2, 5}), C = d.pick<int64_t>({1, 2, 3, 10});
                   Sizes logits = {n, C}, target = {n};
                   if (d.chance(0.2)) logits.push_back(2), target.push_back(2);
                   if (d.chance(0.1)) logits = {C}, target = {};
                   const int reduction = d.integer(0, 2);
                   const int64_t ignore = d.chance(0.3) ? d.integer(0, C - 1) : -100;
                   const double smoothing = !nll && d.chance(0.3) ? 0.1 : 0.0;
                   std::ostringstream what;
                   what << (nll ? "nll_loss" : "cross_entropy") << " reduction " << reduction << " ignore_index "
                        << ignore << " label_smoothing " << smoothing;
                   // One draw a statement: a call's arguments are evaluated in no set order (GCC went right to
                   // left when the answers were recorded, clang goes left to right), and the calls follow the draws.
                   const bool past_the_classes = d.chance(0.05), ignored = d.chance(0.1);
                   Input t = indices(d, target, ignored ? -100 : 0, C - 1 + (past_the_classes ? 1 : 0));
                   return make_call(
                       what.str(), {floats(d, logits), t},
                       [=](const std::vector<mt::Tensor>& a) {
                         if (nll) return mt::nll_loss(a[0], a[1], {mt_reduction(reduction), ignore});
                         return mt::cross_entropy(a[0], a[1], {mt_reduction(reduction), ignore, smoothing});
                       },
                       LIBTORCH_SIDE([=](const std::vector<torch::Tensor>& a) {
                         if (nll) return torch::nll_loss_nd(a[0], a[1], {}, reduction, ignore);
                         return torch::cross_entropy_loss(a[0], a[1], {}, reduction, ignore, smoothing);
                       }),
                       2e-4);
                 }});
  }
  g.push_back({"mse_loss", [](Draw& d) {
                 const Sizes s = sizes(d);
                 const int reduction = d.integer(0, 2);
                 Call c = make_call("mse_loss reduction " + std::to_string(reduction),
                                    {floats(d, s), floats(d, d.chance(0.85) ? s : partner(d, s))},
                                    MIXTAPE_CALL(mt::mse_loss(a[0], a[1], mt_reduction(reduction))),
                                    LIBTORCH_CALL(torch::mse_loss(a[0], a[1], reduction)));
                 c.refused = {
                     "must have the same shape"};  // PyTorch broadcasts, with a warning that it is likely wrong
                 return c;
               }});

  // Indexing.
  g.push_back({"index_select", [](Draw& d) {
                 const Sizes s = sizes(d, 0, 3);
                 const int64_t dim = any_dim(d, s.size());
                 const int64_t size = s.empty() ? 1 : s[((dim % static_cast<int64_t>(s.size())) + s.size()) % s.size()];
                 // One draw a statement, in the order GCC took when the answers were recorded (as the losses').
                 const bool past_the_end = d.chance(0.05), negative = d.chance(0.1);
                 const int64_t n = d.pick<int64_t>({0, 1, 3, 5});
                 Input index = indices(d, {n}, negative ? -1 : 0, size - 1 + (past_the_end ? 1 : 0));
                 // mixtape refuses a 0-d x; 1.13 answers x[0] for any index, read out of bounds for all but 0 (so
                 // its answers would change from run to run): asked only with x of one dim or more.
                 return make_call("index_select dim " + std::to_string(dim), {floats(d, s), index},
                                  MIXTAPE_CALL(mt::index_select(a[0], dim, a[1])),
                                  LIBTORCH_SIDE([=](const std::vector<torch::Tensor>& a) {
                                    if (a[0].dim() == 0) throw std::invalid_argument("index_select of a 0-d tensor");
                                    return torch::index_select(a[0], dim, a[1]);
                                  }));
               }});
  g.push_back({"cat", [](Draw& d) {
                 const Sizes s = sizes(d, 1, 3);
                 const int64_t dim = any_dim(d, s.size());
                 Call c = make_call("cat dim " + std::to_string(dim), {}, MIXTAPE_CALL(mt::cat(a, dim)),
                                    LIBTORCH_CALL(torch::cat(a, dim)));
                 for (int64_t n = d.integer(1, 3); n > 0; --n) {
                   Sizes part = s;
                   if (dim >= -static_cast<int64_t>(s.size()) && dim < static_cast<int64_t>(s.size()))
                     part[(dim + s.size()) % s.size()] = d.pick<int64_t>({0, 1, 2, 3});
                   if (d.chance(0.03)) part = {0};
                   c.inputs.push_back(floats(d, part));
                 }
                 // PyTorch skips 1-D empty tensors (a legacy rule); mixtape takes them as the tensors they are.
                 c.refused = {"got [0] (tensor", "and [0] (tensor", "for a tensor of 1 dims (shape [0])"};
                 return c;
               }});

  g.push_back({"stack", [](Draw& d) {
                 const Sizes s = sizes(d, 0, 3);
                 const int64_t rank = s.size();
                 const int64_t dim = d.chance(0.05) ? rank + 1 : d.integer(-rank - 1, rank);
                 Call c = make_call("stack dim " + std::to_string(dim), {}, MIXTAPE_CALL(mt::stack(a, dim)),
                                    LIBTORCH_CALL(torch::stack(a, dim)));
                 for (int64_t n = d.integer(1, 3); n > 0; --n) {
                   Sizes part = s;
                   if (!part.empty() && d.chance(0.05)) part.back() += 1;  // sizes that differ
                   c.inputs.push_back(floats(d, part));
                 }
                 return c;
               }});

  // Selections: clamp's bounds (either, both, neither, min > max) and where's three broadcasting operands, drawn
  // from the values of the inputs (ties) so that inputs meet the bounds and each other.
  g.push_back({"clamp", [](Draw& d) {
                 const auto bound = [&]() -> std::optional<double> {
                   if (d.chance(0.3)) return std::nullopt;
                   return d.values == Values::kTies ? d.pick({-2.0, 0.0, 1.0, 2.0}) : d.real(-2, 2);
                 };
                 const std::optional<double> lo = bound(), hi = bound();
                 std::ostringstream what;
                 what << "clamp(" << (lo ? std::to_string(*lo) : "None") << ", " << (hi ? std::to_string(*hi) : "None")
                      << ")";
                 return make_call(what.str(), {floats(d, sizes(d))}, MIXTAPE_CALL(mt::clamp(a[0], lo, hi)),
                                  LIBTORCH_CALL(torch::clamp(a[0], scalar(lo), scalar(hi))));
               }});
  g.push_back({"where", [](Draw& d) {
                 const Sizes s = sizes(d);
                 std::vector<Input> in = {floats(d, partner(d, s)), floats(d, partner(d, s)), floats(d, partner(d, s))};
                 in[d.integer(0, 2)] = floats(d, s);
                 switch (d.integer(0, 2)) {
                   case 0:
                     return make_call("where(c > 0, a, b)", in,
                                      MIXTAPE_CALL(mt::where(mt::gt(a[2], mt::zeros({})), a[0], a[1])),
                                      LIBTORCH_CALL(torch::where(torch::gt(a[2], 0), a[0], a[1])));
                   case 1:
                     in.pop_back();
                     return make_call("where(c > 0, a, -1.5)", in,
                                      MIXTAPE_CALL(mt::where(mt::gt(a[1], mt::zeros({})), a[0], -1.5)),
                                      LIBTORCH_CALL(torch::where(torch::gt(a[1], 0), a[0], -1.5)));
                   default:
                     in.pop_back();
                     return make_call("where(c > 0, 0.5, b)", in,
                                      MIXTAPE_CALL(mt::where(mt::gt(a[1], mt::zeros({})), 0.5, a[0])),
                                      LIBTORCH_CALL(torch::where(torch::gt(a[1], 0), 0.5, a[0])));
                 }
               }});

  // 16-bit floats as they are (no autocast): ops of f16 or bf16 inputs, and binary ops of operands of mixed dtypes
  // (f64, f32, f16, bf16) whose result takes the promoted dtype. Both libraries compute a 16-bit op in f32 and
  // round once, but the gradients round at each step of their formulas, not always at the same steps: the bound
  // allows 4 units in the last place of the narrowest dtype (at the scale of the largest value). PyTorch 1.13 lacks
  // many f16 ops on the CPU ("not implemented for 'Half'"): those calls are not compared. mixtape promotes a 0-d
  // operand as any other (PyTorch does not let a 0-d tensor widen a dimensioned one of its category): such pairs get
  // one dtype here.
  auto unary16 = [&](std::string op, double lo, double hi, MtFn m, TorchFn t, bool torch_contiguous = false) {
    g.push_back({op + " in 16 bits", [=](Draw& d) {
                   Input x = floats(d, sizes(d), lo, hi);
                   x.dtype = d.pick({mt::kF16, mt::kBF16});
                   Call c = make_call(op, {x}, m, t, bound_of({x.dtype}));
                   c.torch_refused = {"not implemented for 'Half'"};
                   c.torch_contiguous = torch_contiguous;
                   return c;
                 }});
  };
  unary16("neg", -2, 2, MIXTAPE_CALL(mt::neg(a[0])), LIBTORCH_CALL(torch::neg(a[0])));
  unary16("exp", -2, 2, MIXTAPE_CALL(mt::exp(a[0])), LIBTORCH_CALL(torch::exp(a[0])));
  unary16("log", 0.1, 2, MIXTAPE_CALL(mt::log(a[0])), LIBTORCH_CALL(torch::log(a[0])));
  unary16("sqrt", 0.1, 2, MIXTAPE_CALL(mt::sqrt(a[0])), LIBTORCH_CALL(torch::sqrt(a[0])));
  unary16("relu", -2, 2, MIXTAPE_CALL(mt::relu(a[0])), LIBTORCH_CALL(torch::relu(a[0])));
  unary16("gelu", -3, 3, MIXTAPE_CALL(mt::gelu(a[0])), LIBTORCH_CALL(torch::gelu(a[0])));
  unary16("sigmoid", -3, 3, MIXTAPE_CALL(mt::sigmoid(a[0])), LIBTORCH_CALL(torch::sigmoid(a[0])));
  unary16("tanh", -3, 3, MIXTAPE_CALL(mt::tanh(a[0])), LIBTORCH_CALL(torch::tanh(a[0])));
  unary16("abs", -2, 2, MIXTAPE_CALL(mt::abs(a[0])), LIBTORCH_CALL(torch::abs(a[0])));
  unary16("pow 2", -2, 2, MIXTAPE_CALL(mt::pow(a[0], 2.0)), LIBTORCH_CALL(torch::pow(a[0], 2.0)));
  unary16("x * 0.3", -2, 2, MIXTAPE_CALL(a[0] * 0.3), LIBTORCH_CALL(a[0] * 0.3));
  // 1.13 sums an expanded 16-bit tensor with roundings of its own dtype, it seems: bf16[5, 17, 1, 17] of values in
  // [-2, 2] expanded to [5, 17, 17, 17] sums to -436 there, to -414 as a contiguous copy, -413.795 in f64 (f16:
  // -291.25, -290.5, -290.455). LibTorch gets contiguous copies.
  unary16("sum", -2, 2, MIXTAPE_CALL(mt::sum(a[0])), LIBTORCH_CALL(torch::sum(a[0])), true);
  unary16("mean", -2, 2, MIXTAPE_CALL(mt::mean(a[0])), LIBTORCH_CALL(torch::mean(a[0])));
  unary16("max", -2, 2, MIXTAPE_CALL(mt::max(a[0])), LIBTORCH_CALL(torch::max(a[0])));
  unary16("softmax", -2, 2, MIXTAPE_CALL(mt::softmax(a[0], -1)), LIBTORCH_CALL(torch::softmax(a[0], -1)));
  unary16("log_softmax", -2, 2, MIXTAPE_CALL(mt::log_softmax(a[0], -1)), LIBTORCH_CALL(torch::log_softmax(a[0], -1)));
  unary16("to f32", -2, 2, MIXTAPE_CALL(a[0].to(mt::kF32)), LIBTORCH_CALL(a[0].to(torch::kFloat)));

  binary("add", MIXTAPE_CALL(mt::add(a[0], a[1])), LIBTORCH_CALL(torch::add(a[0], a[1])), true);
  binary("sub", MIXTAPE_CALL(mt::sub(a[0], a[1])), LIBTORCH_CALL(torch::sub(a[0], a[1])), true);
  binary("mul", MIXTAPE_CALL(mt::mul(a[0], a[1])), LIBTORCH_CALL(torch::mul(a[0], a[1])), true);
  binary("div", MIXTAPE_CALL(mt::div(a[0], a[1])), LIBTORCH_CALL(torch::div(a[0], a[1])), true);
  binary("maximum", MIXTAPE_CALL(mt::maximum(a[0], a[1])), LIBTORCH_CALL(torch::maximum(a[0], a[1])), true);
  binary("minimum", MIXTAPE_CALL(mt::minimum(a[0], a[1])), LIBTORCH_CALL(torch::minimum(a[0], a[1])), true);
  binary("where(a > 1, a, b)", MIXTAPE_CALL(mt::where(mt::gt(a[0], mt::ones({})), a[0], a[1])),
         LIBTORCH_CALL(torch::where(torch::gt(a[0], 1), a[0], a[1])), true);

  // Programs: 2-3 inputs that broadcast together, 3-8 steps over them and earlier results, so that values are
  // reused and the tape sums gradients from several paths, through broadcasts and views.
  g.push_back({"program", [](Draw& d) {
                 const Sizes s = sizes(d, 1, 3, false);
                 std::vector<Input> inputs;
                 for (int64_t n = d.integer(2, 3); n > 0; --n) inputs.push_back(floats(d, partner(d, s)));
                 inputs[0] = floats(d, s);  // one input of the full sizes, so that every dim exists
                 std::vector<Step> program;
                 for (int64_t n = d.integer(3, 8); n > 0; --n) {
                   const size_t values = inputs.size() + program.size();
                   auto op = static_cast<Step::Op>(d.integer(0, Step::kCount - 1));
                   // With tied inputs a computed value can equal another in one library and miss it by a rounding
                   // in the other (a sum of softmax against an input's 1), where maximum's gradient jumps; the
                   // "maximum" and "minimum" generators test ties.
                   while (d.values == Values::kTies && (op == Step::kMaximum || op == Step::kMinimum))
                     op = static_cast<Step::Op>(d.integer(0, Step::kCount - 1));
                   const size_t a = op <= Step::kLastBinary ? d.integer(0, values - 1) : values - 1 - d.integer(0, 1);
                   program.push_back({op, a, static_cast<size_t>(d.integer(0, values - 1)), d.integer(0, 2)});
                 }
                 const size_t n_inputs = inputs.size();
                 Call c = make_call(
                     "program " + describe(program, n_inputs), std::move(inputs),
                     [=](const std::vector<mt::Tensor>& a) { return run_program(program, a); },
                     LIBTORCH_SIDE([=](const std::vector<torch::Tensor>& a) { return run_program(program, a); }));
                 return c;
               }});
  return g;
}

// ---- comparing: live, recording, replaying --------------------------------------------------------------------

/// JSON whose floating-point numbers are f32s: LibTorch's answers are f32 values (or integers), and an f32 prints
/// and reads back exactly in at most 9 digits.
using Json = nlohmann::basic_json<std::map, std::vector, std::string, bool, std::int64_t, std::uint64_t, float>;

const char* const kGoldenFile = MIXTAPE_GOLDEN_DIR "/libtorch_ops.json.gz";
#if MIXTAPE_WITH_LIBTORCH
constexpr int kRounds = 400;        // calls of each generator asked live, with uniform and with tied values
constexpr int kGoldenRounds = 100;  // the first of them, recorded (the file: ~1.1 MB); a replay reads the file's count
#endif
constexpr size_t kGoldenValues = 32;  // values a recorded tensor keeps (below)

const char* values_name(Values values) {
  return values == Values::kUniform ? "uniform" : "ties";
}

/// What the call is: its words and its inputs' views and values, hashed (FNV-1a), so that a golden answer is only
/// ever compared with mixtape's answer to the very call it answered.
std::string fingerprint(const Call& call) {
  uint64_t h = 14695981039346656037ull;
  const auto mix = [&](const void* data, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(data)[i]) * 1099511628211ull;
  };
  mix(call.what.data(), call.what.size());
  for (const Input& in : call.inputs) {
    const std::string d = in.describe();
    mix(d.data(), d.size());
    mix(in.values.data(), in.values.size() * sizeof(double));
  }
  std::ostringstream os;
  os << std::hex << h;
  return os.str();
}

/// A recorded outcome keeps each tensor of more than kGoldenValues elements (values, gradients) as kGoldenValues of
/// them, evenly spaced, then the largest finite |value| and the mean of all: the file stays small, the comparison
/// keeps its scale (differ's bound is relative to the largest value), and an error off the sampled elements still
/// moves the mean. Sizes and dtypes are kept whole. Mixtape's answer is thinned the same way before it is compared.
Outcome thinned(Outcome o) {
  const auto thin = [](std::vector<double>& v) {
    const size_t n = v.size();
    if (n <= kGoldenValues) return;
    std::vector<double> kept;
    double largest = 0, sum = 0;
    for (size_t i = 0; i < kGoldenValues; ++i) kept.push_back(v[i * n / kGoldenValues]);
    for (double x : v) {
      if (std::isfinite(x)) largest = std::max(largest, std::fabs(x));
      sum += x;
    }
    kept.push_back(largest);
    kept.push_back(sum / n);
    v = std::move(kept);
  };
  thin(o.values);
  for (auto& g : o.grads)
    if (g) thin(*g);
  return o;
}

std::vector<double> decode(const Json& a) {
  std::vector<double> values;
  values.reserve(a.size());
  for (const Json& v : a) {
    if (!v.is_string()) {
      values.push_back(v.get<double>());
      continue;
    }
    const std::string s = v.get<std::string>();
    values.push_back(s == "nan" ? std::nan("") : s == "inf" ? INFINITY : -INFINITY);
  }
  return values;
}

Outcome outcome_from(const Json& j) {
  Outcome o;
  if (j.contains("error")) {
    o.error = j["error"].get<std::string>();
    return o;
  }
  o.sizes = j["sizes"].get<Sizes>();
  o.dtype = j["dtype"].get<std::string>();
  o.values = decode(j["values"]);
  if (j.contains("backward_error")) o.backward_error = j["backward_error"].get<std::string>();
  if (j.contains("grads"))
    for (const Json& g : j["grads"]) o.grads.emplace_back(g.is_null() ? std::nullopt : std::optional(decode(g)));
  return o;
}

/// The draws of generator `gi`'s calls: live, recorded and replayed calls are the same calls.
Draw draws_of(size_t gi, Values values) {
  return Draw{std::mt19937_64(1000 + gi), values};
}

/// Draws `rounds` calls of every generator, from seeds of their own, and compares mixtape's answer to each with
/// LibTorch's, `libtorch(generator, round, call)`; each problem reported with its call. A generator stops at the
/// first call `libtorch` has no answer to (it said why).
void compare_with_libtorch(Values values, int rounds,
                           const std::function<std::optional<Outcome>(size_t, int, const Call&)>& libtorch,
                           bool recorded = false) {
  const std::vector<Generator> all = generators();
  for (size_t gi = 0; gi < all.size(); ++gi) {
    Draw d = draws_of(gi, values);
    int problems = 0;
    for (int round = 0; round < rounds; ++round) {
      const Call call = all[gi].draw(d);
      const std::optional<Outcome> theirs = libtorch(gi, round, call);
      if (!theirs) break;
      const Outcome ours = recorded ? thinned(run_mixtape(call)) : run_mixtape(call);
      const std::optional<std::string> problem = check(call, ours, *theirs);
      if (!problem) continue;
      if (++problems > 3) continue;  // the first three of an op tell the story
      std::ostringstream inputs;
      for (const Input& in : call.inputs) inputs << " " << in.describe();
      BOOST_ERROR(call.what << " (call " << round << ", inputs" << inputs.str() << "): " << *problem);
    }
    BOOST_TEST(problems == 0, all[gi].op << ": " << problems << " of " << rounds << " calls differ from LibTorch's");
  }
}

std::string read_gzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  BOOST_TEST_REQUIRE(f != nullptr, "cannot open " << path);
  std::string text;
  char buffer[1 << 16];
  int n;
  while ((n = gzread(f, buffer, sizeof buffer)) > 0) text.append(buffer, n);
  const bool ok = n == 0;
  gzclose(f);
  BOOST_TEST_REQUIRE(ok, "cannot read " << path << " (gzip)");
  return text;
}

#if MIXTAPE_WITH_LIBTORCH
/// Values as JSON: whole numbers as integers (indices, booleans, tied values; -0 becomes 0, which compares equal),
/// others as f32s, and "nan", "inf", "-inf" (which JSON lacks).
Json encode(const std::vector<double>& values) {
  Json a = Json::array();
  for (double v : values) {
    if (!std::isfinite(v))
      a.push_back(std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
    else if (v == std::trunc(v) && std::fabs(v) < 0x1p53)
      a.push_back(static_cast<int64_t>(v));
    else
      a.push_back(static_cast<float>(v));
  }
  return a;
}

Json to_json(const Outcome& o) {
  Json j = Json::object();
  if (o.error) {
    j["error"] = *o.error;
    return j;
  }
  j["sizes"] = o.sizes;
  j["dtype"] = o.dtype;
  j["values"] = encode(o.values);
  if (o.backward_error) j["backward_error"] = *o.backward_error;
  if (o.grads.empty()) return j;
  Json grads = Json::array();
  for (const auto& g : o.grads) grads.push_back(g ? encode(*g) : Json());
  j["grads"] = std::move(grads);
  return j;
}

std::string gzip(const std::string& text) {
  z_stream z{};
  BOOST_TEST_REQUIRE(deflateInit2(&z, Z_BEST_COMPRESSION, Z_DEFLATED, 16 + MAX_WBITS, 9, Z_DEFAULT_STRATEGY) == Z_OK);
  std::string out(deflateBound(&z, text.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = text.size();
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = out.size();
  const int done = deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  BOOST_TEST_REQUIRE(done == Z_STREAM_END);
  return out;
}

std::optional<Outcome> ask_libtorch(size_t, int, const Call& call) {
  return run_torch(call);
}
#endif

}  // namespace

BOOST_AUTO_TEST_SUITE(libtorch)

#if MIXTAPE_WITH_LIBTORCH
BOOST_AUTO_TEST_CASE(random_calls_answer_as_libtorch_does, MT_CPU_TEST) {
  torch::set_num_threads(1);
  compare_with_libtorch(Values::kUniform, kRounds, ask_libtorch);
}

BOOST_AUTO_TEST_CASE(random_calls_with_tied_values_answer_as_libtorch_does, MT_CPU_TEST) {
  torch::set_num_threads(1);
  compare_with_libtorch(Values::kTies, kRounds, ask_libtorch);
}

// Writes tests/golden/libtorch_ops.json.gz: LibTorch's answer to every call the live cases draw. Run by name only.
BOOST_AUTO_TEST_CASE(record_libtorchs_answers, *boost::unit_test::disabled()) {
  torch::set_num_threads(1);
  const std::vector<Generator> all = generators();
  Json generators = Json::array();
  for (size_t gi = 0; gi < all.size(); ++gi) {
    Json g = {{"op", all[gi].op}};
    for (const Values values : {Values::kUniform, Values::kTies}) {
      Draw d = draws_of(gi, values);
      Json calls = Json::array();
      for (int round = 0; round < kGoldenRounds; ++round) {
        const Call call = all[gi].draw(d);
        calls.push_back({{"call", fingerprint(call)}, {"libtorch", to_json(thinned(run_torch(call)))}});
      }
      g[values_name(values)] = std::move(calls);
    }
    generators.push_back(std::move(g));
  }
  const Json golden = {{"libtorch", TORCH_VERSION}, {"rounds", kGoldenRounds}, {"generators", std::move(generators)}};
  mt::write_file_atomically("record_libtorchs_answers", kGoldenFile, gzip(golden.dump()));
  BOOST_TEST_MESSAGE("wrote " << kGoldenFile << " (" << std::filesystem::file_size(kGoldenFile) << " bytes)");
}
#endif

// LibTorch's answers as recorded: every build, so CI, which has no LibTorch.
BOOST_AUTO_TEST_CASE(random_calls_answer_as_the_recorded_libtorch_did, MT_CPU_TEST) {
  const Json golden = Json::parse(read_gzip(kGoldenFile));
  const Json& recorded = golden.at("generators");
  const std::vector<Generator> all = generators();
  BOOST_TEST_MESSAGE("replaying the answers of LibTorch " << golden.at("libtorch").get<std::string>());
  BOOST_TEST(recorded.size() == all.size(), kGoldenFile << " answers " << recorded.size() << " generators, there are "
                                                        << all.size() << ": record LibTorch's answers again");
  for (const Values values : {Values::kUniform, Values::kTies}) {
    compare_with_libtorch(values, golden.at("rounds").get<int>(), [&](size_t gi, int round, const Call& call) {
      std::optional<Outcome> answer;
      const Json* calls = gi < recorded.size() && recorded[gi].at("op") == all[gi].op
                              ? &recorded[gi].at(values_name(values)) : nullptr;
      if (calls && round < static_cast<int>(calls->size()) && (*calls)[round].at("call") == fingerprint(call))
        answer = outcome_from((*calls)[round].at("libtorch"));
      else
        BOOST_ERROR(all[gi].op << " (" << values_name(values) << " values, call " << round << ": " << call.what
                               << ") is not the call " << kGoldenFile << " recorded: the generators changed since. "
                               << "Record LibTorch's answers again (tests/test_libtorch.cpp's header says how).");
      return answer;
    }, true);
  }
}

BOOST_AUTO_TEST_SUITE_END()
