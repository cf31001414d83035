#include "lockstep/parallel/pipeline_strategy.h"

#include <c10/util/StringUtil.h>
#include <torch/csrc/utils/tensor_flatten.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <numeric>

#include "lockstep/amp/opt_level.h"
#include "lockstep/core/tensor_memory.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/optim/state_dict.h"
#include "lockstep/parallel/distributed_data_parallel.h"
#include "lockstep/parallel/pipeline_balance.h"
#include "lockstep/parallel/pipeline_placement.h"
#include "lockstep/parallel/pipeline_state.h"
#include "lockstep/parallel/step_guard.h"

namespace lockstep::parallel {
namespace {

using Clock = std::chrono::steady_clock;

// An activation's header: dtype, rank, then up to kMaxDims sizes (the receiver allocates by it).
constexpr int64_t kMaxDims = 8;
constexpr int64_t kHeaderSize = 2 + kMaxDims;

// Each transfer of a step has its own tag: micro-batch i's header, activations and gradient.
int64_t header_tag(int64_t i) { return 3 * i; }
int64_t activation_tag(int64_t i) { return 3 * i + 1; }
int64_t gradient_tag(int64_t i) { return 3 * i + 2; }

}  // namespace

// See the declaration (pipeline_placement.h).
std::vector<int64_t> stage_boundaries(const std::vector<models::Block>& blocks, const PipelineOptions& o,
                                      int64_t stages) {
  const int64_t n = static_cast<int64_t>(blocks.size());
  std::vector<std::string> names;
  for (const auto& b : blocks) names.push_back(b.name);
  TORCH_CHECK_VALUE(stages <= n, "PipelineOptions::stages ", stages, " is more than the model's ", n, " blocks (",
                    c10::Join(", ", names), "): every stage needs at least one block; use at most ", n, " stages");
  std::vector<int64_t> counts = o.split();
  if (counts.empty()) {
    std::vector<int64_t> sizes;
    for (const auto& b : blocks) {
      int64_t params = 0;
      for (const auto& p : models::block_parameters(b)) params += p.numel();
      sizes.push_back(params);
    }
    counts = balanced_split(sizes, stages);
  }
  TORCH_CHECK_VALUE(static_cast<int64_t>(counts.size()) == stages, "PipelineOptions::split ", c10::Join(",", counts), " has ",
                    counts.size(), " entries for ", stages, " stages: give one block count per stage");
  for (int64_t c : counts)
    TORCH_CHECK_VALUE(c >= 1, "PipelineOptions::split ", c10::Join(",", counts), ": every stage needs at least one block");
  TORCH_CHECK_VALUE(std::accumulate(counts.begin(), counts.end(), int64_t{0}) == n, "PipelineOptions::split ",
                    c10::Join(",", counts), " covers ", std::accumulate(counts.begin(), counts.end(), int64_t{0}),
                    " blocks but the model has ", n, " (", c10::Join(", ", names), "): the counts must sum to ", n);
  std::vector<int64_t> boundaries{0};
  for (int64_t c : counts) boundaries.push_back(boundaries.back() + c);
  return boundaries;
}


// One pipeline micro-batch between its forward and its backward on this stage.
struct PipelineStrategy::InFlight {
  torch::Tensor input;   // what the stage received (requires grad past the first stage)
  torch::Tensor output;  // the stage's output, its graph kept until backward (not on the last stage)
  torch::Tensor loss;    // weighted loss (last stage only)
  int64_t held_bytes = 0;  // what its forward left allocated, when counted
};

PipelineStrategy::PipelineStrategy(torch::nn::AnyModule model, StrategyOptions options)
    : options_(std::move(options)), group_(options_.group().get()) {
  if (options_.profiler() == nullptr)
    disabled_profiler_ = std::make_unique<StepProfiler>(StepProfilerOptions().enabled(false));
  profiler_ = options_.profiler() ? options_.profiler() : disabled_profiler_.get();
  model_ = std::dynamic_pointer_cast<models::Classifier>(model.ptr());
  TORCH_CHECK_VALUE(model_ != nullptr, "the pipeline strategy cuts a model into stages by its blocks: pass a "
                    "models::Classifier (a reference model, or a subclass that lists its blocks())");
  check_strategy_options(options_);
  TORCH_CHECK_VALUE(options_.opt_level() == amp::OptLevel::kO0, "the pipeline strategy trains in fp32 only, but the "
                    "opt level is ", amp::to_string(options_.opt_level()), ": set StrategyOptions::opt_level O0");
  const PipelineOptions& p = options_.pipeline();
  const int64_t world = group_ ? group_->size() : 1;
  rank_ = group_ ? group_->rank() : 0;
  stages_ = p.stages() > 0 ? p.stages() : !p.split().empty() ? static_cast<int64_t>(p.split().size()) : world;
  TORCH_CHECK_VALUE(p.stages() >= 0, "PipelineOptions::stages ", p.stages(), " must be >= 1 (0: one stage per rank)");
  TORCH_CHECK_VALUE(p.micro_batches() >= 1, "PipelineOptions::micro_batches ", p.micro_batches(), " must be at least 1");
  blocks_ = model_->blocks();
  PipelineOptions cut = p;
  if (cut.split().empty() && cut.balance() == PipelineBalance::kTime) {
    TORCH_CHECK_VALUE(cut.balance_input().defined(), "balancing pipeline stages by time needs an input to time the ",
                      "blocks on: set PipelineOptions::balance_input to one micro-batch (lockstep train passes one)");
    cut.split(split_by_time(blocks_, cut.balance_input(), stages_, group_, options_.reporter()));
  }
  first_block_of_stage_ = stage_boundaries(blocks_, cut, stages_);
  TORCH_CHECK_VALUE(world % stages_ == 0, "rank ", rank_, ": the world size ", world, " is not divisible by PipelineOptions::stages ",
                    stages_, ": a pipeline replica needs ", stages_, " ranks; start a multiple of ", stages_, " ranks");
  replicas_ = world / stages_;
  stage_ = rank_ % stages_;
  first_block_ = first_block_of_stage_[stage_];
  last_block_ = first_block_of_stage_[stage_ + 1];

  // The stage's owned parameters are a contiguous run of the model's, so that its optimizer state
  // maps to the whole model's numbering by an offset; see Note [Tied weights across stages].
  const std::vector<ParameterPlacement> placement = place_parameters(blocks_, first_block_of_stage_, model_->parameters());
  const StageParameters mine = stage_parameters(placement, stage_);
  params_ = mine.all();
  owned_ = static_cast<int64_t>(mine.owned.size());
  first_param_ = mine.first_owned;
  model_indices_ = mine.model_indices();
  owned_by_stage_.resize(stages_);
  for (const auto& placed : placement) owned_by_stage_[placed.stages.front()].push_back(placed.parameter);
  if (group_) sync_module_states(*model_, *group_);
  // See Note [Pipeline replicas]: every rank makes every stage's subgroup, keeping its own.
  for (int64_t s = 0; s < stages_ && replicas_ > 1; ++s) {
    std::vector<int64_t> ranks;
    for (int64_t r = 0; r < replicas_; ++r) ranks.push_back(r * stages_ + s);
    if (auto g = group_->new_group(ranks)) stage_group_ = std::move(g);
  }
  tied_ = std::make_unique<TiedGradients>(placement, stages_, group_);
  optimizer_ = options_.optimizer()(params_);
}

PipelineStrategy::~PipelineStrategy() = default;

torch::Tensor PipelineStrategy::run_stage(torch::Tensor x) {
  for (int64_t b = first_block_; b < last_block_; ++b) x = model_->run_block(blocks_[b], x);
  return x;
}

void PipelineStrategy::receive(torch::Tensor& tensor, int64_t peer, int64_t tag, const std::string& what) {
  auto phase = profiler_->scope(Phase::kSync);
  const auto t0 = Clock::now();
  group_->recv(tensor, peer, tag, what);
  receive_wait_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
}

void PipelineStrategy::send_activation(const torch::Tensor& y, int64_t i) {
  TORCH_CHECK(y.dim() <= kMaxDims, "stage ", stage_, " outputs a ", y.dim(), "-d tensor; at most ", kMaxDims,
              " dimensions can travel between stages");
  torch::Tensor header = torch::zeros({kHeaderSize}, torch::kInt64);
  header[0] = static_cast<int64_t>(y.scalar_type());
  header[1] = y.dim();
  for (int64_t d = 0; d < y.dim(); ++d) header[2 + d] = y.size(d);
  torch::Tensor payload = y.detach().contiguous();
  sends_.emplace_back(group_->send_async(header, rank_ + 1, header_tag(i)), header);
  sends_.emplace_back(group_->send_async(payload, rank_ + 1, activation_tag(i)), payload);
}

torch::Tensor PipelineStrategy::receive_activation(int64_t i) {
  const std::string what = "the activations of micro-batch " + std::to_string(i) + " for stage " + std::to_string(stage_);
  torch::Tensor header = torch::empty({kHeaderSize}, torch::kInt64);
  receive(header, rank_ - 1, header_tag(i), what + " (their shape)");
  const auto* h = header.data_ptr<int64_t>();
  const std::vector<int64_t> sizes(h + 2, h + 2 + h[1]);
  torch::Tensor x = torch::empty(sizes, torch::TensorOptions().dtype(static_cast<torch::ScalarType>(h[0])));
  receive(x, rank_ - 1, activation_tag(i), what);
  return x.requires_grad_(true);
}

double PipelineStrategy::forward_backward(const std::vector<MicroBatch>& micro_batches, const LossFunction& loss_fn) {
  TORCH_CHECK_VALUE(!micro_batches.empty(), name(), ": a step needs at least one micro-batch");
  optimizer_->zero_grad();
  broadcast_buffers();
  std::vector<MicroBatch> chunks;  // torch.chunk's split, as Pipe's: fewer than M for a small batch
  for (const MicroBatch& mb : micro_batches) {
    const int64_t n = mb.input.size(0);
    const auto xs = mb.input.chunk(options_.pipeline().micro_batches());
    const auto ys = mb.target.chunk(options_.pipeline().micro_batches());
    for (size_t c = 0; c < xs.size(); ++c)
      chunks.push_back({xs[c], ys[c], mb.weight * static_cast<double>(xs[c].size(0)) / static_cast<double>(n)});
  }
  const bool first = stage_ == 0, last = stage_ == stages_ - 1;
  std::vector<InFlight> flight(chunks.size());
  int64_t live = 0;
  const bool count_bytes = TensorMemoryCounter::active();
  double total = 0.0;
  for (const PipelineAction& a : pipeline_schedule(options_.pipeline().schedule(), stage_, stages_,
                                                   static_cast<int64_t>(chunks.size()))) {
    const int64_t i = a.micro_batch;
    InFlight& f = flight[i];
    if (a.kind == PipelineAction::kForward) {
      const int64_t before = count_bytes ? TensorMemoryCounter::thread_live_bytes() : 0;
      f.input = first ? chunks[i].input : receive_activation(i);
      torch::Tensor y;
      {
        auto phase = profiler_->scope(Phase::kForward);
        y = run_stage(f.input);
      }
      if (last) {
        auto phase = profiler_->scope(Phase::kLoss);
        f.loss = loss_fn(y, chunks[i].target) * chunks[i].weight;
        total += f.loss.item<double>();
      } else {
        send_activation(y, i);
        f.output = y;
      }
      peak_live_ = std::max(peak_live_, ++live);
      f.held_bytes = count_bytes ? TensorMemoryCounter::thread_live_bytes() - before : 0;
      held_bytes_ += f.held_bytes;
      peak_held_bytes_ = std::max(peak_held_bytes_, held_bytes_);
      continue;
    }
    torch::Tensor grad;
    if (!last) {
      grad = torch::empty_like(f.output);
      receive(grad, rank_ + 1, gradient_tag(i), "the gradient of micro-batch " + std::to_string(i) + "'s activations");
    }
    {
      auto phase = profiler_->scope(Phase::kBackward);
      if (last) f.loss.backward();
      else f.output.backward(grad);
    }
    if (!first) {
      torch::Tensor input_grad = f.input.grad().contiguous();
      sends_.emplace_back(group_->send_async(input_grad, rank_ - 1, gradient_tag(i)), input_grad);
    }
    held_bytes_ -= f.held_bytes;
    f = InFlight{};
    --live;
  }
  {
    auto phase = profiler_->scope(Phase::kSync);
    for (auto& [work, tensor] : sends_) group_->wait(work, "sending to a neighbouring stage");
  }
  sends_.clear();
  average_gradients();
  {
    auto phase = profiler_->scope(Phase::kSync);
    tied_->sum();  // after the replicas' average: see Note [Tied weights across stages]
  }
  stale_ = true;
  // The loss lives on each replica's last stage; every rank returns their mean (NaN stays NaN).
  if (group_) {  // a stage done early waits here for the others' last backward: idle, so sync
    auto phase = profiler_->scope(Phase::kSync);
    torch::Tensor sum = torch::tensor({last ? total : 0.0}, torch::kFloat64);
    group_->all_reduce(sum);
    total = sum.item<double>() / static_cast<double>(replicas_);
  }
  last_loss_ = total;
  return total;
}

void PipelineStrategy::broadcast_buffers() {
  if (!stage_group_) return;
  torch::NoGradGuard no_grad;
  auto phase = profiler_->scope(Phase::kSync);
  for (int64_t b = first_block_; b < last_block_; ++b)
    for (auto t : models::block_buffers(blocks_[b])) stage_group_->broadcast(t, 0);
}

void PipelineStrategy::average_gradients() {
  if (!stage_group_) return;
  torch::NoGradGuard no_grad;
  auto phase = profiler_->scope(Phase::kSync);
  std::vector<torch::Tensor> grads;
  for (auto& p : params_) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);  // unused here, maybe used on another replica
    grads.push_back(p.grad());
  }
  if (grads.empty()) return;  // a stage of parameter-free blocks
  torch::Tensor flat = torch::utils::flatten_dense_tensors(grads);
  stage_group_->all_reduce(flat, dist::ReduceOp::kMean);
  const std::vector<torch::Tensor> averaged = torch::utils::unflatten_dense_tensors(flat, grads);
  for (size_t i = 0; i < grads.size(); ++i) grads[i].copy_(averaged[i]);
}

std::vector<torch::Tensor> PipelineStrategy::gradients(int64_t count) const {
  std::vector<torch::Tensor> grads;
  for (int64_t i = 0; i < count; ++i)
    if (params_[i].grad().defined()) grads.push_back(params_[i].grad());
  return grads;
}

StepDecision PipelineStrategy::step() {
  torch::NoGradGuard no_grad;
  StepDecision d;
  std::vector<torch::Tensor> grads = gradients(static_cast<int64_t>(params_.size()));
  if (options_.clip_value() > 0)
    for (auto& g : grads) g.clamp_(-options_.clip_value(), options_.clip_value());
  // [non-finite gradients on this stage, squared L2 norm of its gradients], summed over stages;
  // a tied weight counts once, on its owner (see Note [Tied weights across stages]). Each norm is
  // fp32 as clip_grad_norm_ computes it, squared and summed in fp64 (as zero and fsdp do): an fp64
  // copy of each gradient and its square held two tensors of twice its bytes (mlp-wide's fc2: 64
  // MiB) at the step's peak.
  const std::vector<torch::Tensor> owned = gradients(owned_);
  double non_finite = all_finite(owned) ? 0.0 : 1.0, squares = 0.0;
  for (const auto& g : owned) squares += std::pow(g.norm().item<double>(), 2);
  if (group_) {  // every replica holds the same averaged gradients: count each stage once
    auto phase = profiler_->scope(Phase::kSync);
    torch::Tensor v = torch::tensor({non_finite, squares}, torch::kFloat64);
    group_->all_reduce(v);
    non_finite = v[0].item<double>() / static_cast<double>(replicas_);
    squares = v[1].item<double>() / static_cast<double>(replicas_);
  }
  if (!std::isfinite(last_loss_)) {
    d.skip_reason = "non-finite loss (on the last stage, rank " + std::to_string(stages_ - 1) + ")";
    return d;
  }
  if (non_finite > 0 || !std::isfinite(squares)) {
    d.skip_reason = "non-finite gradient (on " + std::to_string(static_cast<int64_t>(non_finite)) + " stage(s))";
    return d;
  }
  if (options_.clip_norm() > 0) {
    // torch.nn.utils.clip_grad_norm_: scale by max_norm / (total_norm + 1e-6), at most 1.
    const double scale = std::min(1.0, options_.clip_norm() / (std::sqrt(squares) + 1e-6));
    for (auto& g : grads) g.mul_(scale);
  }
  auto phase = profiler_->scope(Phase::kOptimizer);
  optimizer_->step();
  d.stepped = true;
  return d;
}

void PipelineStrategy::sync_whole_model() {
  if (!stale_) return;
  stale_ = false;
  if (!group_) return;
  torch::NoGradGuard no_grad;
  for (int64_t s = 0; s < stages_; ++s) {
    for (auto t : owned_by_stage_[s]) group_->broadcast(t, s);  // a tied weight once, from its owner
    for (int64_t b = first_block_of_stage_[s]; b < first_block_of_stage_[s + 1]; ++b)
      for (auto t : models::block_buffers(blocks_[b])) group_->broadcast(t, s);
  }
}

torch::Tensor PipelineStrategy::forward(const torch::Tensor& input) {
  sync_whole_model();
  return model_->forward(input);
}

c10::Dict<std::string, torch::Tensor> PipelineStrategy::model_state_dict() {
  sync_whole_model();
  return models::state_dict_to_dict(*model_);
}

c10::impl::GenericDict PipelineStrategy::training_state_dict() {
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  state.insert("optimizer", gather_optimizer_state(optim::optimizer_state_dict(*optimizer_), first_param_, owned_,
                                                   static_cast<int64_t>(model_->parameters().size()), stages_, group_));
  state.insert("scaler", c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()));
  return state;
}

void PipelineStrategy::load_training_state_dict(const c10::impl::GenericDict& state, const std::string& source) {
  auto it = state.find("optimizer");
  TORCH_CHECK(it != state.end(), source, " has no 'optimizer' state");
  optim::load_optimizer_state_dict(
      *optimizer_, slice_optimizer_state(it->value(), model_indices_, source),
      source);
}

MemoryReport PipelineStrategy::memory() const {
  MemoryReport m;
  for (const auto& p : params_) {
    m.param_bytes += tensor_bytes(p);
    m.grad_bytes += tensor_bytes(p.grad());
  }
  m.optim_bytes = optim::optimizer_state_bytes(*optimizer_);
  m.activation_bytes = peak_held_bytes_;
  return m;
}

}  // namespace lockstep::parallel
