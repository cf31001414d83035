#include "lockstep/parallel/pipeline_balance.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/StringUtil.h>
#include <torch/autograd.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>

#include "lockstep/parallel/pipeline_schedule.h"

namespace lockstep::parallel {
namespace {

using Clock = std::chrono::steady_clock;

int64_t us_since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();
}

// One pass over the blocks: each block's forward and backward time in microseconds.
std::vector<int64_t> time_one_pass(const std::vector<models::Block>& blocks, const torch::Tensor& input) {
  std::vector<int64_t> times;
  torch::Tensor x = input;
  for (const auto& block : blocks) {
    const torch::Tensor in = x.is_floating_point() ? x.detach().requires_grad_() : x;
    auto start = Clock::now();
    const torch::Tensor y = block.forward(in);
    int64_t us = us_since(start);
    std::vector<torch::Tensor> wrt;
    for (const auto& p : models::block_parameters(block))
      if (p.requires_grad()) wrt.push_back(p);
    if (in.requires_grad()) wrt.push_back(in);
    if (y.requires_grad() && !wrt.empty()) {
      start = Clock::now();
      torch::autograd::grad({y}, wrt, {torch::ones_like(y)}, /*retain_graph=*/false, /*create_graph=*/false,
                            /*allow_unused=*/true);
      us += us_since(start);
    }
    times.push_back(std::max<int64_t>(us, 1));
    x = y.detach();
  }
  return times;
}

}  // namespace

std::vector<int64_t> block_times_us(const std::vector<models::Block>& blocks, const torch::Tensor& input,
                                    int64_t repeats) {
  TORCH_CHECK_VALUE(input.defined() && input.dim() >= 1 && input.size(0) >= 1,
                    "timing the blocks needs an input of at least one sample, got ",
                    input.defined() ? c10::Join(",", input.sizes()) : std::string("none"));
  TORCH_CHECK_VALUE(repeats >= 1, "timing the blocks needs at least one pass, got ", repeats);
  // What a pass changes, put back afterwards (see Note [Balancing stages by time]).
  std::vector<torch::Tensor> buffers, saved;
  for (const auto& block : blocks)
    for (const auto& b : models::block_buffers(block)) buffers.push_back(b), saved.push_back(b.clone());
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  const at::Tensor rng = generator.get_state();
  torch::AutoGradMode grad_mode(true);

  time_one_pass(blocks, input);  // warm-up: first-touch allocations and kernel selection
  std::vector<std::vector<int64_t>> passes;
  for (int64_t r = 0; r < repeats; ++r) passes.push_back(time_one_pass(blocks, input));
  std::vector<int64_t> median(blocks.size());
  for (size_t b = 0; b < blocks.size(); ++b) {
    std::vector<int64_t> t;
    for (const auto& pass : passes) t.push_back(pass[b]);
    std::nth_element(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2), t.end());
    median[b] = t[t.size() / 2];
  }

  generator.set_state(rng);
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(saved[i]);
  return median;
}

std::vector<int64_t> split_by_time(const std::vector<models::Block>& blocks, const torch::Tensor& input,
                                   int64_t stages, dist::ProcessGroup* group, const Reporter& reporter) {
  const auto n = static_cast<int64_t>(blocks.size());
  // Every rank checks what rank 0's balanced_split would refuse, so none waits for its broadcast.
  TORCH_CHECK_VALUE(stages >= 1 && stages <= n, "rank ", group ? group->rank() : 0, ": ", stages,
                    " pipeline stages but the model has ", n, " blocks: use 1 to ", n, " stages");
  torch::Tensor counts = torch::zeros({stages}, torch::kLong);
  if (group == nullptr || group->rank() == 0) {
    const std::vector<int64_t> times = block_times_us(blocks, input);
    const std::vector<int64_t> split = balanced_split(times, stages);
    std::copy(split.begin(), split.end(), counts.data_ptr<int64_t>());
    std::vector<std::string> stage_ms;
    for (int64_t s = 0, b = 0; s < stages; b += split[s++]) {
      const int64_t us = std::accumulate(times.begin() + b, times.begin() + b + split[s], int64_t{0});
      char ms[32];
      std::snprintf(ms, sizeof(ms), "%.1f", static_cast<double>(us) / 1000.0);
      stage_ms.push_back(ms);
    }
    report(reporter, ReportKind::kNotice, c10::str("stages balanced by time: blocks per stage ", c10::Join(",", split),
                                                   " (forward + backward of one micro-batch of ", input.size(0), ": ",
                                                   c10::Join(", ", stage_ms), " ms)"));
  }
  if (group != nullptr) group->broadcast(counts, 0);
  std::vector<int64_t> split(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + stages);
  TORCH_CHECK(std::accumulate(split.begin(), split.end(), int64_t{0}) == n, "rank ", group ? group->rank() : 0,
              ": the split by time from rank 0 (", c10::Join(",", split), ") does not cover the model's ", n,
              " blocks: do all ranks build the same model?");
  return split;
}

}  // namespace lockstep::parallel
