#include "lockstep/train/memory_plan.h"

#include <c10/util/StringUtil.h>
#include <torch/torch.h>

#include <algorithm>

#include "lockstep/core/heap.h"
#include "lockstep/core/process.h"
#include "lockstep/dist/process_group.h"
#include "lockstep/parallel/flat_parameters.h"
#include "lockstep/parallel/fsdp_unit.h"
#include "lockstep/parallel/pipeline_placement.h"
#include "memory_plan_layout.h"
#include "memory_probe.h"
#include "reference_data.h"

namespace lockstep::train {
namespace {

// The pipeline's stages, as PipelineStrategy counts them.
int64_t pipeline_stages(const TrainOptions& o, int64_t world) {
  const parallel::PipelineOptions& p = o.trainer().strategy_options().pipeline();
  return p.stages() > 0 ? p.stages() : !p.split().empty() ? static_cast<int64_t>(p.split().size()) : world;
}

// What a plan's ranks share: the probe, the model's layout and the strategy's settings.
struct Planner {
  const TrainOptions& o;
  parallel::StrategyKind kind;
  int64_t world;
  const MemoryProbe& probe;
  models::Classifier& model;  // fp32, freshly built: the layout the strategies flatten
  parallel::OptimizerFactory make_optimizer;
  int64_t eval_batch_size;
  // Every rank on this host and shared memory not turned off (LOCKSTEP_SHM=0): reduce_scatter and
  // all_gather_into then write straight into their outputs (Note [Collectives through shared
  // memory]); over Gloo they hold what they receive and a flat output besides.
  bool shared_memory;

  // Every rank's bytes but the baseline and the data.
  RankMemory rank(int64_t r) const {
    RankMemory m;
    m.rank = r;
    int64_t rows = probe.peak_rows;
    double activation_scale = 1.0;
    int64_t grads_in_buffers = 0;  // gradients that are views of the buffers (ddp's buckets)
    int64_t micro_batches = o.trainer().accum_steps();  // backwards into the same gradients per step
    int64_t largest_gradient = 0;                       // bytes of the rank's largest gradient tensor
    int64_t in_flight = 0;  // what reducing into shards holds beside the bucket staging (zero2, fsdp)
    switch (kind) {
      case parallel::StrategyKind::kLocal:
      case parallel::StrategyKind::kDdp:
      case parallel::StrategyKind::kDp:
        replicated(m, &grads_in_buffers);
        for (const auto& [elements, dtype] : probe.trained)
          largest_gradient = std::max<int64_t>(largest_gradient, elements * static_cast<int64_t>(c10::elementSize(dtype)));
        break;
      case parallel::StrategyKind::kZero1:
      case parallel::StrategyKind::kZero2:
        zero(m, &in_flight);
        break;
      case parallel::StrategyKind::kFsdp:
        fsdp(m, r, &in_flight);
        break;
      case parallel::StrategyKind::kPipeline:
        pipeline(m, r, &rows, &activation_scale, &micro_batches, &largest_gradient);
        break;
    }
    const int64_t grads_local = probe.local.grad_bytes, optim_local = probe.local.optim_bytes - probe.masters;
    m.activations = std::llround(activation_scale * static_cast<double>(std::max<int64_t>(0, probe.steady.at(rows) - grads_local)));
    // See Note [Planning memory]: a later micro-batch's gradient of a parameter is a tensor of its
    // own until backward adds it into the earlier ones' (zero and fsdp reduce into shards instead).
    const bool accumulates = kind != parallel::StrategyKind::kZero1 && kind != parallel::StrategyKind::kZero2 &&
                             kind != parallel::StrategyKind::kFsdp;
    if (accumulates && micro_batches > 1) m.activations += largest_gradient;
    if (probe.stepped) m.activations += in_flight;
    const int64_t held = m.parameters + m.masters + m.buffers + m.gradients - grads_in_buffers;
    m.steady = held + m.optimizer_state + m.activations;
    if (kind == parallel::StrategyKind::kDdp) {
      // ddp's bf16 buckets in their all-gathers at the end of backward, when O2's fp32 masters
      // have no gradients yet (Amp::zero_grad freed them; the step makes them again).
      m.collectives = ddp_all_gather_bytes(probe.trained, world);
      m.steady += std::max<int64_t>(0, m.collectives - probe.masters);
    }
    if (o.text() && probe.stepped && CachingCpuAllocator::installed() != nullptr) {  // See Note [Planning memory]
      m.cached = CachingCpuAllocator::bound_bytes(m.steady) - m.steady;
      m.steady += m.cached;
    }
    const int64_t first_extra = std::llround(
        activation_scale * static_cast<double>(std::max<int64_t>(0, probe.first.at(rows) - grads_local - optim_local)));
    m.first_step = held + m.optimizer_state + first_extra;
    if (probe.stepped) {  // See Note [Planning memory]: the check's own dry run
      const parallel::MemoryReport& local = probe.local;
      const int64_t dry_first = local.param_bytes + probe.masters + probe.first.at(probe.dry_rows);
      const int64_t dry_eval = local.param_bytes + local.grad_bytes + local.optim_bytes + probe.eval_bytes;
      m.launch_check = std::max(dry_first, dry_eval);
    }
    if (eval_batch_size > 0) {  // the held-out split, evaluated after each epoch
      // See Note [Planning memory]: glibc's heap keeps the step's freed blocks, which tensors of
      // another batch size cannot reuse; the caching allocator unmaps them for the evaluation's.
      const int64_t eval = probe.eval_bytes;
      const bool reused = eval_batch_size == rows || CachingCpuAllocator::installed() != nullptr;
      m.evaluation = held + m.optimizer_state + (reused ? eval : eval + m.activations);
    }
    return m;
  }

  int64_t trainable_numel() const {
    int64_t n = 0;
    for (const auto& p : parallel::trainable_parameters(model)) n += p.tensor.numel();
    return n;
  }

  // local, ddp and dp: whole replicas, as the dry run measured them; ddp's buckets hold a copy of
  // the model's gradients, which become views of it (Note [Gradients as bucket views]).
  void replicated(RankMemory& m, int64_t* grads_in_buffers) const {
    m.masters = probe.masters;
    m.parameters = probe.local.param_bytes;
    m.gradients = probe.local.grad_bytes;
    m.optimizer_state = probe.local.optim_bytes - probe.masters;  // the dry run's, over the same shapes
    if (kind == parallel::StrategyKind::kDdp) {
      m.buffers = probe.local.param_bytes - parallel::frozen_parameter_bytes(model);
      *grads_in_buffers = m.buffers;
    }
  }

  // See Note [Flat parameters and shards]: the flat N x S buffer on every rank, the optimizer over
  // this rank's S; stage 1 keeps the whole flat gradient, stage 2 its shard and one bucket's
  // staging at a time.
  void zero(RankMemory& m, int64_t* in_flight) const {
    const int64_t s = shard_numel(trainable_numel(), world);
    m.parameters = s * world * 4 + parallel::frozen_parameter_bytes(model);
    const bool stage1 = kind == parallel::StrategyKind::kZero1;
    m.gradients = (stage1 ? s * world : s) * 4;
    m.optimizer_state = optimizer_bytes(make_optimizer, {{s}});
    // The collectives' own tensors (dist::ProcessGroup): reduce_scatter receives every rank's chunk
    // of its input and sums them into a shard-sized tensor; Gloo's all-gather of the parameters
    // fills a flat N x S output before copying it out. Stage 2 also stages one bucket at a time,
    // and through shared memory keeps the one before in flight while the next fills (Note
    // [Reducing gradients into shards]).
    std::vector<int64_t> numels;
    for (const auto& p : parallel::trainable_parameters(model)) numels.push_back(p.tensor.numel());
    const int64_t bucket = stage1 ? s * world * 4 : largest_bucket_bytes(numels, s * world);
    if (shared_memory) {
      m.buffers = stage1 ? 0 : buckets_in_flight_bytes(numels, s * world, world);
    } else {
      m.buffers = (stage1 ? 0 : bucket) + bucket + bucket / world + s * world * 4;
    }
    if (!stage1) *in_flight = reducing_in_flight(numels, bucket);
  }

  // See Note [Planning memory]: the larger of the largest parameter's gradient (numels, fp32)
  // and a bucket's reduced shard, beside the bucket's staging.
  int64_t reducing_in_flight(const std::vector<int64_t>& numels, int64_t bucket) const {
    const int64_t largest = numels.empty() ? 0 : *std::max_element(numels.begin(), numels.end()) * 4;
    return std::max(largest, bucket / world);
  }

  // See Note [FSDP units]: each unit's shard, the largest unit gathered (the largest neighbouring
  // pair with prefetch), the optimizer over the shards; with reshard_after_forward off, every unit
  // stays gathered through backward.
  void fsdp(RankMemory& m, int64_t r, int64_t* in_flight) const {
    const parallel::FsdpOptions& fsdp_options = o.trainer().strategy_options().fsdp();
    const auto plans = parallel::plan_units(model, model.blocks(), fsdp_options.min_params(), r);
    std::vector<std::vector<int64_t>> shards;
    std::vector<int64_t> fulls;  // each unit's gathered bytes, forward order
    int64_t largest = 0, gathered = 0, bucket = 0, staged = 0;
    for (const auto& plan : plans) {
      if (plan.params.empty()) continue;
      int64_t n = 0;
      std::vector<int64_t> numels;
      for (const auto& p : plan.params) {
        n += p.tensor.numel();
        numels.push_back(p.tensor.numel());
      }
      const int64_t s = shard_numel(n, world);
      const int64_t unit_bucket = largest_bucket_bytes(numels, s * world);
      bucket = std::max(bucket, unit_bucket);
      staged = std::max(staged, buckets_in_flight_bytes(numels, s * world, world));
      *in_flight = std::max(*in_flight, reducing_in_flight(numels, unit_bucket));
      shards.push_back({s});
      m.parameters += s * 4;
      m.gradients += s * 4;
      largest = std::max(largest, s * world * 4);
      gathered += s * world * 4;
      fulls.push_back(s * world * 4);
    }
    int64_t at_once = largest;  // two neighbours with prefetch (Note [FSDP prefetch])
    if (fsdp_options.prefetch())
      for (size_t u = 0; u + 1 < fulls.size(); ++u) at_once = std::max(at_once, fulls[u] + fulls[u + 1]);
    m.parameters += at_once + parallel::frozen_parameter_bytes(model);
    m.optimizer_state = optimizer_bytes(make_optimizer, shards);
    // A bucket's staging; over Gloo also what reduce_scatter receives for it and the flat output
    // of the largest unit's all-gather; through shared memory a unit's bucket in flight beside its
    // next (see zero()).
    m.buffers = shared_memory ? staged : bucket + bucket + bucket / world + largest;
    if (!fsdp_options.reshard_after_forward()) m.buffers += gathered - at_once;
  }

  // A stage's parameters and their gradients, and in its buffers the other stages' weights (every
  // rank holds the whole model for evaluation: Note [Pipeline strategy]); its activations are its
  // blocks' share of a micro-batch's, times the micro-batches in flight (GPipe: all; 1F1B: at most
  // the stages after it, itself included).
  void pipeline(RankMemory& m, int64_t r, int64_t* rows, double* activation_scale, int64_t* micro_batches,
                int64_t* largest_gradient) const {
    const parallel::PipelineOptions& p = o.trainer().strategy_options().pipeline();
    const int64_t stages = pipeline_stages(o, world);
    const int64_t stage = r % stages;
    const auto blocks = model.blocks();
    const auto bounds = parallel::stage_boundaries(blocks, p, stages);
    const auto placement = parallel::place_parameters(blocks, bounds, model.parameters());
    std::vector<std::vector<int64_t>> shapes;
    for (const torch::Tensor& t : parallel::stage_parameters(placement, stage).all()) {
      m.parameters += parallel::tensor_bytes(t);
      *largest_gradient = std::max(*largest_gradient, parallel::tensor_bytes(t));
      shapes.push_back(t.sizes().vec());
    }
    m.gradients = m.parameters;
    for (const torch::Tensor& t : model.parameters()) m.buffers += parallel::tensor_bytes(t);
    m.buffers -= m.parameters;
    m.optimizer_state = optimizer_bytes(make_optimizer, shapes);
    m.stage = stage;
    const int64_t micro = std::min(p.micro_batches(), probe.peak_rows);
    *rows = (probe.peak_rows + micro - 1) / micro;
    *micro_batches *= micro;
    double share = 0.0;
    for (int64_t b = bounds[stage]; b < bounds[stage + 1]; ++b) share += probe.block_shares[b];
    const int64_t in_flight = p.schedule() == parallel::PipelineSchedule::k1F1B ? std::min(micro, stages - stage) : micro;
    *activation_scale = share * static_cast<double>(in_flight);
  }
};

// The bytes a layout model's parameters and buffers hold (fp32, as built).
int64_t layout_bytes(const torch::nn::Module& model) {
  int64_t bytes = 0;
  for (const torch::Tensor& t : model.parameters()) bytes += parallel::tensor_bytes(t);
  for (const torch::Tensor& t : model.buffers()) bytes += parallel::tensor_bytes(t);
  return bytes;
}

// The dry run draws from the CPU generator (models' initialisation, dropout): the run it plans must
// draw what it would have drawn without it, so that the check at launch changes no result.
class GeneratorStateGuard {
 public:
  GeneratorStateGuard() : generator_(at::detail::getDefaultCPUGenerator()) {
    std::lock_guard<std::mutex> lock(generator_.mutex());
    state_ = generator_.get_state();
  }
  ~GeneratorStateGuard() {
    std::lock_guard<std::mutex> lock(generator_.mutex());
    generator_.set_state(state_);
  }
  GeneratorStateGuard(const GeneratorStateGuard&) = delete;
  GeneratorStateGuard& operator=(const GeneratorStateGuard&) = delete;

 private:
  at::Generator generator_;
  at::Tensor state_;
};


// Planned after the probe: every rank's layout, plus what the process measured.
MemoryPlan plan_from_probe(const TrainOptions& o, const MemoryPlanOptions& p, const MemoryProbe& probe,
                           models::Classifier& model, const ProcessMemory& process, int64_t eval_batch_size) {
  MemoryPlan plan;
  const parallel::StrategyKind kind = o.resolved_strategy(p.world_size());
  plan.strategy = parallel::to_string(kind);
  plan.opt_level = amp::to_string(o.resolved_opt_level());
  plan.world_size = p.world_size();
  plan.batch_size = o.trainer().batch_size();
  plan.checkpoint_activations = o.trainer().checkpoint_activations();
  const bool shared_memory = p.world_size() > 1 && (p.local_ranks() == 0 || p.local_ranks() >= p.world_size()) &&
                             dist::wants_shared_memory();
  const Planner planner{o, kind, p.world_size(), probe, model, o.strategy_options(nullptr).optimizer(), eval_batch_size,
                        shared_memory};
  // See Note [Planning memory]: the group's shared-memory segment, resident in every rank that
  // copies through it.
  const bool through_segment = shared_memory && kind != parallel::StrategyKind::kPipeline;
  const int64_t segment = through_segment ? shared_segment_bytes(p.world_size(), layout_bytes(model)) : 0;
  // See Note [Plans of many ranks]: one entry per stage (rank r runs stage r mod stages), else one.
  const int64_t stages = kind == parallel::StrategyKind::kPipeline ? pipeline_stages(o, p.world_size()) : 1;
  for (int64_t r = 0; r < std::min(stages, p.world_size()); ++r) {
    RankMemory m = planner.rank(r);
    m.stride = stages;
    m.count = (p.world_size() - 1 - r) / stages + 1;  // ranks r, r + stages, ... below world_size
    m.baseline = process.baseline + segment;
    m.data = process.data;
    m.steady += m.baseline + process.data;
    m.first_step += m.baseline + process.data;
    if (m.evaluation > 0) m.evaluation += m.baseline + process.data;
    if (m.launch_check > 0) m.launch_check += process.baseline + process.data;  // before the group
    plan.ranks.push_back(m);
  }
  return plan;
}

}  // namespace

MemoryPlan plan_with_data(const TrainOptions& o, const MemoryPlanOptions& p, const ReferenceData& data,
                          ProcessMemory& process) {
  p.validate();
  const GeneratorStateGuard generator;
  const int64_t replicas = o.resolved_strategy(p.world_size()) == parallel::StrategyKind::kPipeline
                               ? std::max<int64_t>(1, p.world_size() / pipeline_stages(o, p.world_size()))
                               : p.world_size();
  const int64_t eval_rows = data.test && p.evaluation() ? data.eval_batch_size : 0;
  // Evaluation runs the model plainly under any strategy and checkpointing: measured once.
  const bool pipeline = o.resolved_strategy(p.world_size()) == parallel::StrategyKind::kPipeline;
  const auto key = std::make_tuple(o.trainer().checkpoint_activations(), replicas, pipeline);
  auto cached = process.probes.find(key);
  if (cached == process.probes.end())
    cached = process.probes
                 .emplace(key, probe_memory(data, o, replicas, p.probe_rows(), process.eval < 0 ? eval_rows : 0, pipeline))
                 .first;  // See Note [Refusing fast]
  MemoryProbe probe = cached->second;
  if (process.eval < 0) process.eval = probe.eval_bytes;
  probe.eval_bytes = process.eval;
  if (process.baseline == 0) {
    // See Note [Planning memory]: the code and kernels the steps touched count; the heap the dry
    // run freed goes back first, so what remains is the process and its data (and the layout's
    // model, when the check's lower bound built it already: its weights are no baseline).
    release_heap();
    const int64_t layout = process.layout ? layout_bytes(*process.layout) : 0;
    process.baseline = std::max<int64_t>(0, resident_bytes() - process.data - layout);
  }
  if (!process.layout) process.layout = data.make_model(nullptr, /*initial_weights=*/false);
  return plan_from_probe(o, p, probe, *process.layout, process, eval_rows);
}

// See Note [Refusing fast].
MemoryPlan plan_model_states(const TrainOptions& o, const MemoryPlanOptions& p, const ReferenceData& data,
                             ProcessMemory& process) {
  p.validate();
  const GeneratorStateGuard generator;  // the layout's model draws its initial weights
  release_heap();  // the heap's free pages would not count in a planned baseline either
  ProcessMemory now;
  now.baseline = resident_bytes() - (process.layout ? layout_bytes(*process.layout) : 0);  // its code, its data
  if (!process.layout) process.layout = data.make_model(nullptr, /*initial_weights=*/false);
  models::Classifier& model = *process.layout;
  MemoryProbe states;  // no activations, no evaluation: a replica's fp32 weights, gradients and state
  states.stepped = false;
  states.peak_rows = o.trainer().batch_size();
  std::vector<std::vector<int64_t>> shapes;
  for (const torch::Tensor& t : model.parameters()) {
    states.local.param_bytes += parallel::tensor_bytes(t);
    if (!t.requires_grad()) continue;
    states.local.grad_bytes += parallel::tensor_bytes(t);
    shapes.push_back(t.sizes().vec());
  }
  states.local.optim_bytes = optimizer_bytes(o.strategy_options(nullptr).optimizer(), shapes);
  states.block_shares.assign(model.blocks().size(), 0.0);
  return plan_from_probe(o, p, states, model, now, 0);
}

// See Note [Planning memory].
MemoryPlan plan_memory(const TrainOptions& o, const MemoryPlanOptions& p) {
  o.validate();
  p.validate();
  // See Note [Refusing absurd shapes]: before the data and any model are built.
  const int64_t local = p.local_ranks() > 0 ? p.local_ranks() : p.world_size();
  check_model_size(o, p, available_memory(MemoryLimitOptions().local_ranks(local)));
  const SingleThreadGuard one_thread;  // See Note [Refusing fast]
  TrainOptions planned = o;
  planned.sync_bn(false);  // SyncBatchNorm holds what BatchNorm holds; the dry run has no group
  configure_heap();  // as train() does: See Note [Keeping freed memory for the next step]
  const int64_t before_data = warm_up();
  const ReferenceData data = o.text() ? make_text_data(planned) : make_image_data(planned);
  ProcessMemory process;
  process.data = std::max<int64_t>(0, resident_bytes() - before_data);
  return plan_with_data(planned, p, data, process);
}

}  // namespace lockstep::train
