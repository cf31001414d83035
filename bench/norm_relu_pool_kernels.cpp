// The per-plane kernels of Note [BatchNorm, ReLU and the max-pool as one function in training]
// (src/models/norm_relu_pool_kernels.cpp) timed alone, one thread, on the convnet's two block
// shapes at batch 100, fp32 and bf16: the statistics pass, the pooled forward pass, the winner sums
// and the input-gradient pass. "copies 1" reuses one input (in cache as far as it fits); "copies 8"
// cycles through eight (from memory). Medians of 35 repetitions after 5, in ms.
// Build and run from the repository's root (needs libtorch-dev's headers only):
//   g++ -O2 -std=c++17 -Isrc/models -I/usr/include/torch/csrc/api/include bench/norm_relu_pool_kernels.cpp \
//       src/models/norm_relu_pool_kernels.cpp -o /tmp/norm_relu_pool_kernels && /tmp/norm_relu_pool_kernels
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "norm_relu_pool_kernels.h"

using namespace lockstep::models::norm_relu_pool_kernels;
using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

template <typename T>
void run(const char* name, int64_t n, int64_t c, int64_t h, int64_t w, int copies) {
  const int64_t planes = n * c, hw = h * w, ohw = hw / 4;
  std::mt19937 gen(1);
  std::normal_distribution<float> normal;
  std::vector<std::vector<T>> xs(copies, std::vector<T>(planes * hw));
  for (auto& x : xs)
    for (auto& v : x) v = T(normal(gen));
  std::vector<T> out(planes * ohw), g(planes * ohw), gx(planes * hw);
  for (auto& v : g) v = T(normal(gen));
  std::vector<float> winner(planes * ohw);
  std::vector<uint8_t> code(planes * ohw);
  std::vector<double> sums, pool, wins, grad;
  for (int rep = 0; rep < 40; ++rep) {
    const T* x = xs[rep % copies].data();
    double s1 = 0, s2 = 0, a = 0, b = 0;
    const auto t0 = Clock::now();
    for (int64_t p = 0; p < planes; ++p) shifted_sums(x + p * hw, hw, 0.1f, s1, s2);
    const auto t1 = Clock::now();
    for (int64_t p = 0; p < planes; ++p)
      pool_plane(x + p * hw, h, w, 1.1f, 0.1f, out.data() + p * ohw, winner.data() + p * ohw, code.data() + p * ohw);
    const auto t2 = Clock::now();
    for (int64_t p = 0; p < planes; ++p)
      winner_sums(winner.data() + p * ohw, g.data() + p * ohw, code.data() + p * ohw, ohw, 0.1f, a, b);
    const auto t3 = Clock::now();
    for (int64_t p = 0; p < planes; ++p)
      grad_plane(x + p * hw, h, w, 0.1f, 1.1f, 0.1f, g.data() + p * ohw, code.data() + p * ohw, 0.5f,
                 gx.data() + p * hw);
    const auto t4 = Clock::now();
    if (rep < 5) continue;
    sums.push_back(ms(t0, t1)), pool.push_back(ms(t1, t2)), wins.push_back(ms(t2, t3)), grad.push_back(ms(t3, t4));
  }
  std::printf("%s (%ld, %ld, %ld, %ld) copies %d: sums %.3f pool %.3f winner %.3f grad %.3f ms\n", name, long(n),
              long(c), long(h), long(w), copies, median(sums), median(pool), median(wins), median(grad));
}

int main() {
  for (int copies : {1, 8}) {
    run<float>("fp32", 100, 16, 28, 28, copies);
    run<float>("fp32", 100, 32, 14, 14, copies);
    run<c10::BFloat16>("bf16", 100, 16, 28, 28, copies);
    run<c10::BFloat16>("bf16", 100, 32, 14, 14, copies);
  }
}
