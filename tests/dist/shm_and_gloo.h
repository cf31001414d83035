#pragma once
// Shared-memory collectives against Gloo's on the same ranks (tests/dist/shm_*_test.cpp).

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "lockstep/dist/process_group.h"
#include "multi_rank.h"

namespace lockstep::dist::shm_testing {

using Body = std::function<void(int64_t rank, ProcessGroup& shm, ProcessGroup& gloo)>;

// Each rank makes two groups over the same ranks: one with shared memory (auto), one Gloo only.
inline void run_shm_and_gloo(int64_t world, const Body& body) {
  const int shm_port = lockstep::testing::free_port();
  int gloo_port = lockstep::testing::free_port();
  while (gloo_port == shm_port) gloo_port = lockstep::testing::free_port();
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto shm = init_process_group(lockstep::testing::loopback(r, world, shm_port));
        auto gloo =
            init_process_group(lockstep::testing::loopback(r, world, gloo_port).shared_memory(SharedMemory::kOff));
        body(r, *shm, *gloo);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// Rank r's input of `numel` elements: seeded by r, so every rank can rebuild every other's.
inline torch::Tensor rank_input(int64_t r, int64_t numel, torch::ScalarType dtype = torch::kFloat) {
  return torch::randn({numel}, at::make_generator<at::CPUGeneratorImpl>(200 + r)).to(dtype);
}

}  // namespace lockstep::dist::shm_testing
