// `lockstep plan`: each rank's peak memory for a run, before launching it (train/memory_plan.h).
#include <c10/util/StringUtil.h>

#include <cstdio>
#include <iostream>
#include <memory>

#include "checks.h"
#include "commands.h"
#include "lockstep/core/process.h"
#include "lockstep/train/memory_plan.h"
#include "plan_time.h"
#include "train_flags.h"

namespace lockstep::cli {

namespace {

// The run's shape: what `lockstep train` would be told, under its flag names.
void add_run_options(CLI::App* cmd, const std::shared_ptr<train::TrainOptions>& o) {
  train::TrainerOptions& t = o->trainer();
  parallel::StrategyOptions& so = t.strategy_options();
  add_model_options(cmd, o);
  cmd->add_option("--data-dir", o->data_dir(), "Directory with the Fashion-MNIST IDX files; imagefolder: its root");
  cmd->add_option("--limit", o->limit(), "Use only the first N training samples (0: all)")->check(non_negative_count());
  add_enum_option<parallel::StrategyKind>(cmd, "--strategy", parallel::strategy_names(), [o](auto v) { o->trainer().strategy(v); },
                                          "How ranks hold and step the model", "ddp on several ranks, else local");
  add_enum_option<train::Precision>(cmd, "--precision", train::precision_names(), [o](auto v) { o->precision(v); },
                                    "Training precision", "fp32");
  add_enum_option<amp::OptLevel>(cmd, "--opt-level", amp::opt_level_names(), [o](auto v) { o->opt_level(v); },
                                 "Apex opt level", "O0 for fp32, O1 otherwise");
  add_enum_option<optim::OptimizerKind>(cmd, "--optimizer", optim::optimizer_names(), [o](auto v) { o->optimizer().kind(v); },
                                        "Optimizer, with PyTorch's defaults", "sgd");
  cmd->add_option("--batch-size", t.batch_size(), "Samples per step, per process")->check(positive_count());
  cmd->add_option("--seed", t.seed(), "Seed of the data order (the largest text batch depends on it)");
  cmd->add_flag("--checkpoint-activations", t.checkpoint_activations(),
                "Recompute each block's activations in backward instead of keeping them");
  cmd->add_option("--stages", so.pipeline().stages(), "Pipeline stages (default: the world size)")
      ->check(non_negative_count());
  cmd->add_option("--micro-batches", so.pipeline().micro_batches(), "Pipeline micro-batches each batch is split into")
      ->check(positive_count());
  add_enum_option<parallel::PipelineSchedule>(cmd, "--schedule", parallel::pipeline_schedule_names(),
                                              [o](auto v) { o->trainer().strategy_options().pipeline().schedule(v); },
                                              "Pipeline schedule", "gpipe");
  cmd->add_option("--split", so.pipeline().split(), "Blocks per stage, e.g. 6,4 (default: balanced by parameters)")
      ->delimiter(',');
  cmd->add_option("--fsdp-min-params", so.fsdp().min_params(), "fsdp: units of at least N parameters (0: one per block)")
      ->check(non_negative_count());
  cmd->add_flag_callback("--fsdp-no-reshard-after-forward",
                         [o] { o->trainer().strategy_options().fsdp().reshard_after_forward(false); },
                         "fsdp: keep each unit gathered from its forward to its backward");
  cmd->add_flag_callback("--fsdp-no-prefetch", [o] { o->trainer().strategy_options().fsdp().prefetch(false); },
                         "fsdp: gather each unit only when it runs (one unit gathered at a time)");
  add_text_options(cmd, o);
}

void print_text(const train::MemoryPlan& plan, const train::MemoryLimit& limit, bool fits) {
  std::cout << "memory plan: " << plan.strategy << " at " << plan.opt_level << ", batch " << plan.batch_size
            << " per rank, " << plan.world_size << (plan.world_size == 1 ? " rank" : " ranks")
            << (plan.checkpoint_activations ? ", activation checkpointing" : "") << "; MiB\n"
            << plan.table();
  const train::RankMemory& worst = plan.largest();
  char line[512];
  std::snprintf(line, sizeof(line), "largest: %s, %.1f MiB (%s); each rank may use %.1f MiB (%s): %s\n",
                worst.which_ranks().c_str(), static_cast<double>(worst.peak()) / kMiB,
                worst.peak_moment().c_str(), static_cast<double>(limit.bytes) / kMiB, limit.source.c_str(),
                fits ? "fits" : "does not fit; lockstep train would refuse it");
  std::cout << line;
}

}  // namespace

Command add_plan_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "plan", "Predict each rank's peak memory for a training run, before launching it; or (--nodes, --collectives) "
              "its step time at many hosts");
  cmd->option_defaults()->always_capture_default();
  auto o = std::make_shared<train::TrainOptions>();
  auto p = std::make_shared<train::MemoryPlanOptions>();
  auto json = std::make_shared<bool>(false);
  add_run_options(cmd, o);
  cmd->add_option("--world-size", p->world_size(), "Ranks of the run")->check(positive_count())->capture_default_str();
  cmd->add_option("--nproc-per-node", p->local_ranks(), "Ranks on this host, sharing its memory (0: --world-size)")
      ->check(non_negative_count())->capture_default_str();
  cmd->add_flag("--json", *json, "Print the plan as one JSON object");
  auto time = std::make_shared<TimePlanFlags>();
  add_time_plan_options(cmd, time);
  return {cmd, [o, p, json, time] {
            if (wants_time_plan(*time)) return run_time_plan(*time);
            const train::MemoryPlan plan = train::plan_memory(*o, *p);
            const int64_t local = p->local_ranks() > 0 ? p->local_ranks() : p->world_size();
            const train::MemoryLimit limit = train::available_memory(train::MemoryLimitOptions().local_ranks(local));
            const bool fits = plan.largest().peak() <= limit.bytes;
            if (*json) {
              nlohmann::ordered_json j = plan.to_json();
              j["limit"] = {{"bytes", limit.bytes}, {"source", limit.source}};
              j["fits"] = fits;
              std::cout << j.dump() << std::endl;
            } else {
              print_text(plan, limit, fits);
            }
            return 0;
          },
          train_wording({{"MemoryPlanOptions::world_size", "--world-size"},
                         {"MemoryPlanOptions::local_ranks", "--nproc-per-node"},
                         {"ClusterShape::hosts", "--nodes"},
                         {"ClusterShape::ranks_per_host", "--ranks-per-node"},
                         {"TrainOptions::max_length", "--max-length"},
                         {"TrainOptions::n_embd", "--n-embd"},
                         {"TrainOptions::n_layer", "--n-layer"}})};
}

}  // namespace lockstep::cli
