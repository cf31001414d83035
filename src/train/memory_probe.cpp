#include "memory_probe.h"

#include <torch/torch.h>

#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>

#include "lockstep/core/heap.h"
#include "lockstep/core/tensor_memory.h"
#include "lockstep/parallel/checkpoint.h"
#include "lockstep/parallel/local_strategy.h"
#include "lockstep/train/memory_limit.h"

namespace lockstep::train {

// Note [Activations by a dry run]
// What a step holds beyond the model's states (activations kept for backward, the autograd
// graph's saved tensors, backward's temporaries, autocast's bf16 copies of the weights) depends on
// every layer's kernels, the precision and activation checkpointing; working it out by shape would
// re-derive what autograd saves for each op. Instead the plan runs two real steps of the run's own
// model, loss, optimizer and opt level under the local strategy, with TensorMemoryCounter
// counting every CPU tensor byte (Note [Counting tensor bytes]), on two small batches cut from
// the epoch's largest batch (probe_rows and twice as many rows; text keeps that batch's padded
// length). Per-sample tensors grow linearly with rows while the weights' copies do not, so the
// two points fix bytes = intercept + slope x rows, and the plan reads it at the run's rows. The
// first step is measured apart from the second: it creates the gradients and the optimizer's state.
// Evaluation is measured at its own batch size (a forward without grad on eval_batch_size rows)
// rather than scaled: there oneDNN's inference path holds memory outside tensors (resnet18 at 200
// rows: about 600 MiB of resident growth against 40 MiB of tensors on an AMD EPYC), so the probe
// takes the larger of the tensors' high water and the resident set's (VmHWM, restarted after the
// heap's free pages are returned).
// Costs: two model builds and four small steps, under a second for the reference models. Not
// covered: attention's T^2 scores scale with rows like the rest only because the probe keeps the
// batch's length; oneDNN's scratch buffers are not tensors (they fall to the baseline and the
// allocator's slack, see Note [Planning memory]).

void release_heap() {
  malloc_trim(0);
  if (CachingCpuAllocator* caching = CachingCpuAllocator::installed()) caching->release_cached();
}

namespace {

struct StepPeaks {
  int64_t first = 0;   // above parameters and masters, during the first step
  int64_t steady = 0;  // above parameters, masters and optimizer state, during the second
  int64_t eval = 0;    // above all of those and the gradients, during a forward without grad: the
                       // tensors' high water or the resident set's, the larger
  parallel::MemoryReport report;
  int64_t masters = 0;
  std::vector<std::pair<int64_t, c10::ScalarType>> trained;
};

// Returns the heap's free pages and the caching allocator's cached blocks to the kernel and
// restarts the kernel's count of this process's resident high water (VmHWM) from its resident
// bytes now, which it returns. Memory that is not in tensors (oneDNN's scratch buffers, the
// kernels' own allocations) shows only there. The small dry run's cached blocks would serve part
// of the evaluation's and hide that growth, which a run, whose cached blocks are its steps' at
// another batch size, sees: resnet18's evaluation, planned 25 MiB higher with them given back,
// came within 1.5% of the measured peak instead of 6%.
int64_t reset_resident_peak() {
  release_heap();
  std::ofstream("/proc/self/clear_refs") << "5";
  return resident_bytes();
}

// VmHWM of /proc/self/status, in bytes.
int64_t resident_peak() {
  std::ifstream in("/proc/self/status");
  std::string key;
  int64_t kib = 0;
  while (in >> key) {
    if (key == "VmHWM:" && in >> kib) return kib * 1024;
    in.ignore(1 << 10, '\n');
  }
  return 0;
}

// The fp32 masters O2 keeps of `module`'s converted (non-fp32) trainable parameters.
int64_t master_bytes(const torch::nn::Module& module) {
  int64_t bytes = 0;
  for (const auto& p : module.parameters())
    if (p.requires_grad() && p.scalar_type() != torch::kFloat) bytes += p.numel() * 4;
  return bytes;
}

std::shared_ptr<models::Classifier> fresh_model(const ReferenceData& data, const TrainOptions& o) {
  auto model = data.make_model(nullptr, /*initial_weights=*/false);
  if (o.trainer().checkpoint_activations()) model->set_block_runner(parallel::checkpoint_block);
  model->train();
  return model;
}

parallel::StrategyOptions local_options(const TrainOptions& o) {
  return o.strategy_options(nullptr).reporter([](ReportKind, const std::string&) {});
}

// Two steps of the local strategy on `rows` rows of `batch`, counted.
// `eval_input`: what evaluation's forward runs on (undefined: not measured).
StepPeaks dry_run(const ReferenceData& data, const TrainOptions& o, const Example& batch, int64_t rows,
                  const torch::Tensor& eval_input) {
  TensorMemoryCounter counter;
  auto model = fresh_model(data, o);
  parallel::LocalStrategy local(torch::nn::AnyModule(model), local_options(o));
  const std::vector<parallel::MicroBatch> step{{batch.data.narrow(0, 0, rows), batch.target.narrow(0, 0, rows), 1.0}};
  StepPeaks peaks;
  TensorMemoryCounter::reset_peak();  // live: parameters and masters
  local.forward_backward(step, data.loss);
  local.step();
  peaks.first = TensorMemoryCounter::peak_bytes();
  peaks.report = local.memory();
  TensorMemoryCounter::reset_peak();  // live: parameters, masters, gradients, optimizer state
  local.forward_backward(step, data.loss);
  local.step();
  // The step frees the gradients first (set_to_none) and makes them again in backward.
  peaks.steady = TensorMemoryCounter::peak_bytes() + peaks.report.grad_bytes;
  if (eval_input.defined()) {
    TensorMemoryCounter::reset_peak();
    const int64_t resident = reset_resident_peak();
    torch::NoGradGuard no_grad;
    model->eval();
    local.forward(eval_input);
    model->train();
    peaks.eval = std::max(TensorMemoryCounter::peak_bytes(), resident_peak() - resident);
  }
  peaks.masters = master_bytes(*model);
  for (const auto& p : model->parameters())
    if (p.requires_grad()) peaks.trained.emplace_back(p.numel(), p.scalar_type());
  return peaks;
}

// Each block's share of what a forward on `input` leaves allocated for backward.
std::vector<double> block_shares(const ReferenceData& data, const Example& batch) {
  TensorMemoryCounter counter;
  auto model = data.make_model(nullptr, /*initial_weights=*/false);
  model->train();
  const std::vector<models::Block> blocks = model->blocks();
  std::vector<double> held;
  torch::Tensor x = batch.data;
  for (const models::Block& block : blocks) {
    const int64_t before = TensorMemoryCounter::live_bytes();
    x = block.forward(x);
    held.push_back(static_cast<double>(std::max<int64_t>(0, TensorMemoryCounter::live_bytes() - before)));
  }
  double total = 0.0;
  for (double h : held) total += h;
  for (double& h : held) h = total > 0 ? h / total : 1.0 / static_cast<double>(held.size());
  return held;
}

// The epoch's batch with the most input elements: text's batches differ in padded length.
Example largest_batch(const ReferenceData& data, const TrainOptions& o, int64_t replicas) {
  TrainingData& train = *data.train;
  const auto batches = train.batches(EpochBatches{0, replicas, 0, o.trainer().batch_size(), o.trainer().seed()});
  TORCH_CHECK_VALUE(!batches.empty(), "memory plan: the training data gives no batch to plan for");
  Example best = train.get_batch(batches.front());
  for (size_t i = 1; i < batches.size(); ++i) {
    if (batches[i].size() < static_cast<size_t>(best.data.size(0))) continue;  // a short last batch
    Example candidate = train.get_batch(batches[i]);
    if (candidate.data.numel() > best.data.numel()) best = std::move(candidate);
    if (!o.text()) break;  // images: every full batch has the same shape
  }
  return best;
}

LinearBytes fit(int64_t rows1, double bytes1, int64_t rows2, double bytes2) {
  LinearBytes line;
  line.slope = rows2 > rows1 ? (bytes2 - bytes1) / static_cast<double>(rows2 - rows1) : 0.0;
  line.intercept = bytes1 - line.slope * static_cast<double>(rows1);
  return line;
}

}  // namespace

int64_t LinearBytes::at(int64_t rows) const {
  return std::max<int64_t>(0, std::llround(intercept + slope * static_cast<double>(rows)));
}

// See Note [Activations by a dry run].
MemoryProbe probe_memory(const ReferenceData& data, const TrainOptions& o, int64_t replicas, int64_t probe_rows,
                         int64_t eval_rows, bool per_block) {
  Example batch = largest_batch(data, o, replicas);
  MemoryProbe probe;
  probe.peak_rows = batch.data.size(0);
  // Two points make the line: a batch smaller than 2 x probe_rows is repeated to that many rows.
  const int64_t rows1 = probe_rows, rows2 = 2 * probe_rows;
  if (probe.peak_rows < rows2) {
    const int64_t times = (rows2 + probe.peak_rows - 1) / probe.peak_rows;
    std::vector<int64_t> repeat(batch.data.dim(), 1), repeat_target(batch.target.dim(), 1);
    repeat[0] = repeat_target[0] = times;
    batch = Example{batch.data.repeat(repeat), batch.target.repeat(repeat_target)};
  }
  // Evaluation runs at its own batch size, measured there rather than scaled: its non-tensor
  // memory (oneDNN's inference buffers) is not linear in a small batch's.
  torch::Tensor eval_input;
  if (eval_rows > 0) {
    const int64_t times = (eval_rows + batch.data.size(0) - 1) / batch.data.size(0);
    std::vector<int64_t> repeat(batch.data.dim(), 1);
    repeat[0] = times;
    eval_input = batch.data.repeat(repeat).narrow(0, 0, eval_rows);
  }
  const StepPeaks small = dry_run(data, o, batch, rows1, torch::Tensor());
  const StepPeaks large = dry_run(data, o, batch, rows2, eval_input);
  probe.dry_rows = rows2;
  probe.local = large.report;
  probe.masters = large.masters;
  probe.trained = large.trained;
  probe.steady = fit(rows1, static_cast<double>(small.steady), rows2, static_cast<double>(large.steady));
  probe.first = fit(rows1, static_cast<double>(small.first), rows2, static_cast<double>(large.first));
  probe.eval_bytes = large.eval;
  if (per_block)
    probe.block_shares = block_shares(data, Example{batch.data.narrow(0, 0, rows2), batch.target.narrow(0, 0, rows2)});
  return probe;
}

SingleThreadGuard::SingleThreadGuard() : threads_(at::get_num_threads()) { at::set_num_threads(1); }
SingleThreadGuard::~SingleThreadGuard() { at::set_num_threads(threads_); }

int64_t warm_up() {
  // No random numbers: the CPU generator is the run's (see GeneratorStateGuard).
  torch::Tensor x = torch::linspace(-1, 1, 2 * 3 * 16 * 16).view({2, 3, 16, 16}).requires_grad_();
  torch::Tensor w = torch::linspace(-1, 1, 4 * 3 * 3 * 3).view({4, 3, 3, 3}).requires_grad_();
  torch::Tensor l = torch::linspace(-1, 1, 4 * 14 * 14 * 10).view({4 * 14 * 14, 10}).requires_grad_();
  torch::conv2d(x, w).relu().flatten(1).mm(l).sum().backward();
  return resident_bytes();
}

}  // namespace lockstep::train
