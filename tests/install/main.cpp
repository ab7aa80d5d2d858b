// The installed headers and library, used as a user would.
#include <mixtape/mixtape.h>

#include <iostream>

namespace mt = mixtape;

int main() {
  mt::manual_seed(0);
  mt::Tensor x = mt::randn({2, 3}, mt::kF16);
  std::cout << x.t().contiguous() << "\ncuda available: " << mt::cuda::is_available() << "\n";
  return x.numel() == 6 && x.dtype() == mt::kF16 ? 0 : 1;
}
