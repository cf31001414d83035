// `lockstep train`'s run: the process set up as the options say, a built-in data set and its
// reference model handed to a Trainer.
#include "lockstep/train/train.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <optional>

#include "lockstep/core/heap.h"
#include "lockstep/core/names.h"
#include "lockstep/core/process.h"
#include "lockstep/core/report.h"
#include "lockstep/core/world.h"
#include "lockstep/log/svg_chart.h"
#include "lockstep/models/torchscript_module.h"
#include "lockstep/train/trainer.h"
#include "memory_probe.h"
#include "precision_probe.h"
#include "reference_data.h"

namespace lockstep::train {
namespace {

// The JSONL log's first line: what `lockstep report` shows as the run's settings.
nlohmann::ordered_json run_settings_event(const TrainOptions& o, int64_t world_size, int64_t threads) {
  const TrainerOptions& t = o.trainer();
  return {{"model", o.model_name()}, {"data", enum_name(data_source_names(), o.data())}, {"limit", o.limit()},
          {"epochs", t.epochs()}, {"batch_size", t.batch_size()}, {"world_size", world_size}, {"threads", threads},
          {"strategy", parallel::to_string(o.resolved_strategy(world_size))},
          {"optimizer", optim::to_string(o.optimizer().kind())}, {"lr", o.optimizer_options().lr()},
          {"lr_schedule", enum_name(lr_schedule_names(), o.lr_schedule().kind())},
          {"warmup_steps", o.lr_schedule().warmup_steps()}, {"precision", enum_name(precision_names(), o.precision())},
          {"opt_level", amp::to_string(o.resolved_opt_level())}, {"loss_scale", o.resolved_loss_scale()},
          {"accum_steps", t.accum_steps()}, {"clip_value", t.strategy_options().clip_value()},
          {"clip_norm", t.strategy_options().clip_norm()}, {"sync_bn", o.sync_bn()}, {"seed", t.seed()}};
}

}  // namespace

TrainResult train(const TrainOptions& given) {
  given.validate();
  const WorldInfo world = world_from_env();
  TrainOptions o = given;
  if (o.global_batch_size() > 0)
    o.trainer().accum_steps(
        accum_steps_for_global_batch(o.global_batch_size(), o.trainer().batch_size(), o.replicas(world.world_size)));
  if (world.rank == 0) o.check_output_paths();  // rank 0 writes them
  configure_heap();  // See Note [Keeping freed memory for the next step]
  const int64_t threads = o.threads() > 0 ? o.threads() : default_intra_op_threads();
  torch::set_num_threads(static_cast<int>(threads));
  torch::manual_seed(o.trainer().seed());
  if (o.deterministic()) at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  // See Note [Planning memory]: what the process holds before the data, and the data's share.
  const bool plan = !o.ignore_memory_plan() && !o.sync_bn();  // the dry run has no group to sync over
  std::optional<SingleThreadGuard> one_thread;  // the check's small steps: See Note [Refusing fast]
  if (plan) one_thread.emplace();
  const int64_t before_data = plan ? warm_up() : 0;
  one_thread.reset();
  const auto plan_options = MemoryPlanOptions().world_size(world.world_size).local_ranks(world.local_world_size);
  const auto limit = [&] { return available_memory(MemoryLimitOptions().local_ranks(world.local_world_size)); };
  if (plan) check_model_size(o, plan_options, limit());  // See Note [Refusing absurd shapes]: before the corpus is read
  ReferenceData data = o.text() ? make_text_data(o) : make_image_data(o);
  std::optional<PrecisionTiming> timing;  // --precision auto; see Note [Choosing the precision by timing it]
  if (o.precision() == Precision::kAuto) {
    timing = time_precisions(data, o);
    resolve_precision(o, timing->faster());  // this rank's pick, for the check below
  }
  if (plan) {
    const SingleThreadGuard check_thread;
    ProcessMemory process;
    process.data = std::max<int64_t>(0, resident_bytes() - before_data);
    check_memory_plan(o, plan_options, data, process, limit());
    // The dry runs' blocks and high water are not the run's: See Note [Caching large CPU blocks].
    if (CachingCpuAllocator* caching = CachingCpuAllocator::installed()) caching->release_cached();
  }
  // After the check: a refused run does not wait for its peers to meet (Note [Refusing fast]).
  std::shared_ptr<dist::ProcessGroup> group;  // shared with the strategy (Note [Who keeps the process group alive])
  if (world.world_size > 1)
    group = dist::init_process_group(
        dist::InitOptions()
            .timeout(std::chrono::milliseconds(static_cast<int64_t>(std::llround(o.timeout() * 1000.0))))
            .allreduce(o.allreduce()));
  if (group && group->rank() == 0) report(o.trainer().reporter(), ReportKind::kInfo, "process group: " + group->describe());
  if (timing) {
    if (group) {  // every rank picks the same
      timing->fp32_ms = group->average(timing->fp32_ms);
      timing->bf16_ms = group->average(timing->bf16_ms);
      resolve_precision(o, timing->faster());
    }
    if (world.rank == 0)
      report(o.trainer().reporter(), ReportKind::kInfo,
             "precision auto: a step of the first batch took " + log::fixed(timing->fp32_ms, 2) + " ms in fp32 and " +
                 log::fixed(timing->bf16_ms, 2) + " ms in bf16 (" +
                 amp::to_string(given.opt_level().value_or(amp::OptLevel::kO1)) + ") on this CPU: training in " +
                 enum_name(precision_names(), o.precision()));
  }

  // The weights are final before the strategy converts, broadcasts or shards them.
  auto model = data.make_model(group.get(), /*initial_weights=*/true);
  auto strategy_options = o.strategy_options(group);
  strategy_options.model_factory([make = data.make_model, g = group.get()] {
    return torch::nn::AnyModule(make(g, /*initial_weights=*/false));
  });
  c10::impl::GenericDict run = o.run_settings(world.world_size);
  for (const auto& [key, value] : data.run_settings) run.insert(key, value);
  TrainerOptions options = o.trainer();
  options.strategy(o.resolved_strategy(world.world_size))
      .strategy_options(std::move(strategy_options))
      .run_settings(run)
      .lr_schedule(LrScheduleOptions(o.lr_schedule()).base_lr(o.optimizer_options().lr()))
      .settings(run_settings_event(o, world.world_size, threads))
      .loss(data.loss)
      .metric(data.metric)
      .eval_batch_size(data.eval_batch_size);
  Trainer trainer(torch::nn::AnyModule(model), data.train, options, data.test);
  TrainResult result = trainer.fit();
  if (!o.save_torchscript().empty()) {
    const auto weights = trainer.strategy().model_state_dict();  // collective (see Strategy::model_state_dict)
    if (world.rank == 0) models::save_torchscript(o.model_file(), weights, o.save_torchscript());
  }
  return result;
}

}  // namespace lockstep::train
