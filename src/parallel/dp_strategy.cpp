#include "lockstep/parallel/dp_strategy.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>

namespace lockstep::parallel {
namespace {

int64_t resolved_replicas(const StrategyOptions& o) {
  TORCH_CHECK_VALUE(o.replicas() >= 0, "dp: replicas=", o.replicas(), " must be >= 0 (0: the intra-op thread count, ",
                    "at least 2)");
  return o.replicas() > 0 ? o.replicas() : std::max<int64_t>(2, at::get_num_threads());
}

}  // namespace

ReplicaThreads::ReplicaThreads(int64_t count, int64_t intra_op_threads) : errors_(static_cast<size_t>(count)) {
  for (int64_t i = 0; i < count; ++i)
    threads_.emplace_back([this, i, intra_op_threads] { loop(static_cast<size_t>(i), intra_op_threads); });
}

ReplicaThreads::~ReplicaThreads() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  start_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void ReplicaThreads::loop(size_t index, int64_t intra_op_threads) {
  {
    // at::set_num_threads also updates process-wide settings (MKL, the thread pool): one at a time.
    static std::mutex set_threads;
    std::lock_guard<std::mutex> lock(set_threads);
    at::set_num_threads(static_cast<int>(intra_op_threads));
  }
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(size_t)>* job = nullptr;
    bool grad = true;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      start_.wait(lock, [&] { return stop_ || (generation_ != seen && index < jobs_); });
      if (stop_) return;
      seen = generation_;
      job = job_;
      grad = grad_enabled_;
    }
    std::exception_ptr error;
    try {
      torch::AutoGradMode mode(grad);  // grad mode is per thread: the caller's NoGradGuard must reach here
      (*job)(index);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      errors_[index] = error;
      if (--pending_ == 0) done_.notify_one();
    }
  }
}

void ReplicaThreads::run(size_t n, const std::function<void(size_t)>& job) {
  TORCH_CHECK(n <= threads_.size(), "ReplicaThreads::run: ", n, " jobs for ", threads_.size(), " threads");
  if (n == 0) return;
  std::unique_lock<std::mutex> lock(mutex_);
  job_ = &job;
  jobs_ = n;
  pending_ = n;
  grad_enabled_ = torch::GradMode::is_enabled();
  std::fill(errors_.begin(), errors_.end(), nullptr);
  ++generation_;
  start_.notify_all();
  // Replica jobs are bounded computations on this process's own tensors (no I/O, no collective):
  // they end, with a result or an exception.
  done_.wait(lock, [&] { return pending_ == 0; });
  for (size_t i = 0; i < n; ++i)
    if (errors_[i]) std::rethrow_exception(errors_[i]);
}

DpStrategy::DpStrategy(torch::nn::AnyModule model, StrategyOptions options) : LocalStrategy(std::move(model), options) {
  const int64_t n = resolved_replicas(options);
  TORCH_CHECK_VALUE(n == 1 || static_cast<bool>(options.model_factory()),
                    "the dp strategy needs StrategyOptions().model_factory(...) to build its ", n - 1,
                    " extra replica(s)");
  replicas_.push_back(this->model());
  const auto primary_params = module().parameters(), primary_buffers = module().buffers();
  for (int64_t i = 1; i < n; ++i) {
    torch::nn::AnyModule replica = options.model_factory()();
    const auto params = replica.ptr()->parameters(), buffers = replica.ptr()->buffers();
    TORCH_CHECK_VALUE(params.size() == primary_params.size() && buffers.size() == primary_buffers.size(),
                      "dp: model_factory built a model with ", params.size(), " parameters and ", buffers.size(),
                      " buffers, but the model has ", primary_params.size(), " and ", primary_buffers.size(),
                      ": the factory must build the same architecture");
    torch::NoGradGuard no_grad;
    // set_data, not copy_: the primary may have been converted by amp (half weights at O2/O3,
    // BatchNorm kept in fp32), and each replica must hold the same dtypes.
    for (size_t j = 0; j < params.size(); ++j) {
      TORCH_CHECK_VALUE(params[j].sizes() == primary_params[j].sizes(), "dp: model_factory's parameter ", j, " has shape ",
                        params[j].sizes(), " where the model's has ", primary_params[j].sizes());
      params[j].set_data(primary_params[j].detach().clone());
    }
    for (size_t j = 0; j < buffers.size(); ++j) buffers[j].set_data(primary_buffers[j].detach().clone());
    replicas_.push_back(std::move(replica));
  }
  threads_ = std::make_unique<ReplicaThreads>(n, std::max<int64_t>(1, at::get_num_threads() / n));
}

DpStrategy::~DpStrategy() = default;

void DpStrategy::refresh(bool with_parameters) {
  torch::NoGradGuard no_grad;
  const bool training = module().is_training();
  const auto primary_params = module().parameters(), primary_buffers = module().buffers();
  for (size_t i = 1; i < replicas_.size(); ++i) {
    torch::nn::Module& replica = *replicas_[i].ptr();
    replica.train(training);
    if (with_parameters) {
      const auto params = replica.parameters();
      for (size_t j = 0; j < params.size(); ++j) params[j].copy_(primary_params[j]);
    }
    const auto buffers = replica.buffers();
    for (size_t j = 0; j < buffers.size(); ++j) buffers[j].copy_(primary_buffers[j]);
  }
}

std::vector<torch::Tensor> DpStrategy::parallel_forward(const torch::Tensor& input, bool with_parameters) {
  refresh(with_parameters);
  const std::vector<torch::Tensor> chunks = input.chunk(replicas(), 0);  // (B/N, ...) each; fewer when B < N
  std::vector<torch::Tensor> outputs(chunks.size());
  threads_->run(chunks.size(), [&](size_t i) {
    auto autocast = amp().autocast();  // thread-local, like grad mode
    outputs[i] = amp().cast_output(replicas_[i].forward(amp().cast_input(chunks[i])));
  });
  return outputs;
}

double DpStrategy::forward_backward(const std::vector<MicroBatch>& micro_batches, const LossFunction& loss) {
  refresh(/*with_parameters=*/true);
  for (size_t i = 1; i < replicas_.size(); ++i)
    for (auto& p : replicas_[i].ptr()->parameters()) p.mutable_grad().reset();
  const double total = LocalStrategy::forward_backward(micro_batches, loss);
  reduce_gradients();
  return total;
}

double DpStrategy::run_micro_batch(const MicroBatch& micro_batch, const LossFunction& loss_fn, double loss_before,
                                   bool last) {
  std::vector<torch::Tensor> outputs;
  {
    auto phase = profiler().scope(Phase::kForward);
    outputs = parallel_forward(micro_batch.input, /*with_parameters=*/false);  // refreshed once per step
  }
  std::vector<torch::Tensor> detached;
  std::vector<int64_t> rows;
  for (const torch::Tensor& o : outputs) detached.push_back(o.detach()), rows.push_back(o.size(0));
  const torch::Tensor gathered = torch::cat(detached).requires_grad_(true);  // (B, classes), fp32
  torch::Tensor loss;
  {
    auto phase = profiler().scope(Phase::kLoss);
    auto autocast = amp().autocast();
    loss = loss_fn(gathered, micro_batch.target) * micro_batch.weight;
  }
  const double value = loss.item<double>();
  if (last) guard().start_vote(loss_before + value);
  {
    auto phase = profiler().scope(Phase::kBackward);
    amp().scale_loss(loss).backward();
    const std::vector<torch::Tensor> grads = gathered.grad().split_with_sizes(rows);
    threads_->run(outputs.size(), [&](size_t i) { outputs[i].backward(grads[i]); });
  }
  return value;
}

void DpStrategy::reduce_gradients() {
  auto phase = profiler().scope(Phase::kSync);
  torch::NoGradGuard no_grad;
  const auto primary = module().parameters();
  for (size_t i = 1; i < replicas_.size(); ++i) {
    const auto params = replicas_[i].ptr()->parameters();
    for (size_t j = 0; j < params.size(); ++j) {
      const torch::Tensor& g = params[j].grad();
      if (!g.defined()) continue;  // unused by this replica's chunk
      torch::Tensor& sum = primary[j].mutable_grad();
      if (sum.defined()) {
        sum.add_(g);
      } else {
        sum = g.clone();
      }
    }
  }
}

// The weights may have been stepped since the last forward_backward().
torch::Tensor DpStrategy::forward(const torch::Tensor& input) {
  return torch::cat(parallel_forward(input, /*with_parameters=*/true));
}

MemoryReport DpStrategy::memory() const {
  MemoryReport m = LocalStrategy::memory();
  for (size_t i = 1; i < replicas_.size(); ++i)
    for (const auto& p : replicas_[i].ptr()->parameters()) {
      m.param_bytes += tensor_bytes(p);
      m.grad_bytes += tensor_bytes(p.grad());
    }
  return m;
}

}  // namespace lockstep::parallel
