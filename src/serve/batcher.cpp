#include "lockstep/serve/batcher.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>

namespace lockstep::serve {
namespace {

int64_t nanoseconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}

// The batch's inputs: each input of the requests concatenated along dim 0 (a lone request's as
// they are).
Tensors concatenate(const std::vector<const Tensors*>& requests) {
  if (requests.size() == 1) return *requests[0];
  Tensors inputs;
  for (size_t i = 0; i < requests[0]->size(); ++i) {
    std::vector<torch::Tensor> parts;
    parts.reserve(requests.size());
    for (const Tensors* r : requests) parts.push_back(r->at(i));
    inputs.push_back(torch::cat(parts));
  }
  return inputs;
}

}  // namespace

Batcher::Batcher(std::vector<Instance> instances, BatcherOptions options, ModelStatistics& statistics)
    : instances_(std::move(instances)), options_(std::move(options)), statistics_(statistics) {
  TORCH_CHECK_VALUE(!instances_.empty(), "a batcher needs at least one model instance");
  TORCH_CHECK_VALUE(options_.max_batch_size() >= 0, "max_batch_size ", options_.max_batch_size(),
                    " must be at least 0 (0: no batch dimension)");
  for (int64_t size : options_.preferred_batch_sizes())
    TORCH_CHECK_VALUE(size >= 1 && size <= options_.max_batch_size(), "preferred batch size ", size,
                      " must be between 1 and max_batch_size ", options_.max_batch_size());
  TORCH_CHECK_VALUE(options_.max_queue_delay_us() >= 0, "max_queue_delay_microseconds ", options_.max_queue_delay_us(),
                    " must not be negative");
  TORCH_CHECK_VALUE(options_.max_queue_size() >= 0, "max_queue_size ", options_.max_queue_size(), " must not be negative");
  TORCH_CHECK_VALUE(options_.queue_timeout_us() >= 0, "default_timeout_microseconds ", options_.queue_timeout_us(),
                    " must not be negative");
  for (size_t i = 0; i < instances_.size(); ++i) workers_.emplace_back([this, i] { work(i); });
}

Batcher::~Batcher() { stop(); }

Batcher::Instance Batcher::one_tensor(std::function<torch::Tensor(const torch::Tensor&)> forward) {
  return [forward = std::move(forward)](const Tensors& inputs) -> Tensors {
    TORCH_CHECK(inputs.size() == 1, "the model takes one input, got ", inputs.size());
    return {forward(inputs[0])};
  };
}

int64_t Batcher::checked_samples(const Tensors& inputs) const {
  TORCH_CHECK_VALUE(!inputs.empty(), "a request holds at least one input");
  if (options_.max_batch_size() == 0) return 1;
  const int64_t samples = inputs[0].dim() >= 1 ? inputs[0].size(0) : 0;
  for (const torch::Tensor& input : inputs)
    TORCH_CHECK_VALUE(input.dim() >= 1 && input.size(0) == samples && samples >= 1 &&
                          samples <= options_.max_batch_size(),
                      "a request's inputs hold the same number of samples, between 1 and max_batch_size ",
                      options_.max_batch_size(), "; got shape ", input.sizes(), " beside ", inputs[0].sizes());
  return samples;
}

std::future<Tensors> Batcher::submit(Tensors inputs) {
  const int64_t samples = checked_samples(inputs);
  Pending p{std::move(inputs), samples, Clock::now(), {}, {}, {}};
  std::future<Tensors> result = p.result.get_future();
  enqueue(std::move(p));
  return result;
}

void Batcher::submit(Tensors inputs, Done done) {
  TORCH_CHECK_VALUE(done != nullptr, "Batcher::submit needs a function to hand the result to");
  const int64_t samples = checked_samples(inputs);
  Pending p{std::move(inputs), samples, Clock::now(), {}, std::move(done), {}};
  p.future = p.result.get_future();
  enqueue(std::move(p));
}

void Batcher::enqueue(Pending p) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) throw Unavailable("the server is shutting down");
    expire_locked(p.enqueued);
    if (options_.max_queue_size() > 0 && static_cast<int64_t>(queue_.size()) >= options_.max_queue_size())
      throw Unavailable("the queue is full: " + std::to_string(queue_.size()) + " requests are waiting (max_queue_size " +
                        std::to_string(options_.max_queue_size()) + "); retry later");
    queue_.push_back(std::move(p));
    statistics_.set_pending(static_cast<int64_t>(queue_.size()));
  }
  arrived_.notify_all();  // workers waiting out a delay re-check whether the batch is now due
}

void Batcher::settle(Pending& p, Tensors outputs) {
  p.result.set_value(std::move(outputs));
  if (p.done) p.done(std::move(p.future));
}

void Batcher::settle(Pending& p, std::exception_ptr error) {
  p.result.set_exception(std::move(error));
  if (p.done) p.done(std::move(p.future));
}

void Batcher::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  arrived_.notify_all();
  for (std::thread& t : workers_)
    if (t.joinable()) t.join();
}

void Batcher::expire_locked(Clock::time_point now) {
  if (options_.queue_timeout_us() == 0) return;
  const auto timeout = std::chrono::microseconds(options_.queue_timeout_us());
  while (!queue_.empty() && now - queue_.front().enqueued >= timeout) {
    settle(queue_.front(), std::make_exception_ptr(Unavailable(
                               "the request waited in the queue longer than default_timeout_microseconds " +
                               std::to_string(options_.queue_timeout_us()))));
    queue_.pop_front();
  }
}

std::vector<Batcher::Pending> Batcher::next_batch() {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto delay = std::chrono::microseconds(options_.max_queue_delay_us());
  const auto& preferred = options_.preferred_batch_sizes();
  for (;;) {
    const Clock::time_point now = Clock::now();
    expire_locked(now);
    if (queue_.empty()) {
      if (stopping_) return {};
      arrived_.wait(lock);
      continue;
    }
    // The longest run of queued requests from the front that fits, and the longest whose samples
    // are a preferred size. See Note [Dynamic batching].
    size_t fits = 0, fits_preferred = 0;
    int64_t samples = 0;
    const bool batching = options_.dynamic_batching() && options_.max_batch_size() > 0;
    for (const Pending& p : queue_) {
      if (batching && samples + p.samples > options_.max_batch_size()) break;
      samples += p.samples;
      ++fits;
      if (std::count(preferred.begin(), preferred.end(), samples) > 0) fits_preferred = fits;
      if (!batching) break;
    }
    size_t take = 0;
    if (!batching || stopping_ || fits < queue_.size() || samples == options_.max_batch_size() ||
        now - queue_.front().enqueued >= delay)
      take = fits;
    else if (fits_preferred > 0)
      take = fits_preferred;
    if (take > 0) {
      std::vector<Pending> batch;
      batch.reserve(take);
      for (size_t i = 0; i < take; ++i) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      statistics_.set_pending(static_cast<int64_t>(queue_.size()));
      if (!queue_.empty()) arrived_.notify_one();  // another idle instance can take the rest
      return batch;
    }
    Clock::time_point wake = queue_.front().enqueued + delay;
    if (options_.queue_timeout_us() > 0)
      wake = std::min(wake, queue_.front().enqueued + std::chrono::microseconds(options_.queue_timeout_us()));
    arrived_.wait_until(lock, wake);
  }
}

void Batcher::run(Instance& instance, std::vector<Pending>& batch) {
  const Clock::time_point start = Clock::now();
  int64_t queue_ns = 0, samples = 0;
  std::vector<const Tensors*> requests;
  requests.reserve(batch.size());
  for (const Pending& p : batch) {
    queue_ns += nanoseconds(start - p.enqueued);
    samples += p.samples;
    requests.push_back(&p.inputs);
  }
  try {
    const Tensors inputs = concatenate(requests);
    const Clock::time_point computed_input = Clock::now();
    const Tensors outputs = instance(inputs);
    const Clock::time_point inferred = Clock::now();
    std::vector<Tensors> results(batch.size());
    if (options_.max_batch_size() == 0) {
      results[0] = outputs;  // one request, no batch dimension
    } else {
      for (const torch::Tensor& output : outputs) {
        TORCH_CHECK(output.dim() >= 1 && output.size(0) == samples, "the model returned shape ", output.sizes(),
                    " for a batch of ", samples, " samples");
        int64_t offset = 0;
        for (size_t i = 0; i < batch.size(); ++i) {
          results[i].push_back(output.narrow(0, offset, batch[i].samples));
          offset += batch[i].samples;
        }
      }
    }
    // Recorded before any response goes out, so a client that has its answer sees it counted.
    statistics_.record_batch(samples, static_cast<int64_t>(batch.size()), queue_ns,
                             nanoseconds(computed_input - start), nanoseconds(inferred - computed_input),
                             nanoseconds(Clock::now() - inferred));
    for (size_t i = 0; i < batch.size(); ++i) settle(batch[i], std::move(results[i]));
  } catch (...) {
    for (Pending& p : batch) settle(p, std::current_exception());
  }
}

void Batcher::work(size_t instance) {
  // See Note [Intra-op threads of instances] (server.h).
  if (options_.threads_per_instance() > 0) at::set_num_threads(static_cast<int>(options_.threads_per_instance()));
  for (;;) {
    std::vector<Pending> batch = next_batch();
    if (batch.empty()) return;
    run(instances_[instance], batch);
  }
}

}  // namespace lockstep::serve
