#pragma once
// What a Trainer writes about its run: the JSONL log's events and the lines it reports. Kept apart
// from the loop (trainer.cpp) so that the loop reads top to bottom.

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "lockstep/core/step_profiler.h"
#include "lockstep/log/run_log.h"
#include "lockstep/train/checkpoint.h"
#include "lockstep/parallel/strategy.h"
#include "lockstep/train/result.h"
#include "lockstep/train/trainer.h"

namespace lockstep::train {

// What a checkpoint must share with this run: o.run_settings(), or without them world size, batch
// size, accum_steps and seed.
c10::impl::GenericDict resume_settings(const TrainerOptions& o, int64_t world_size);
// The log's first line of a run (and of each resume): `settings`, or without them the loop's own.
nlohmann::ordered_json run_event(const TrainerOptions& o, const TrainResult& r, const std::string& strategy,
                                 const std::string& resumed_from);
// The log's last line: the summary `lockstep train` prints and, when profiled, the step profile.
nlohmann::ordered_json summary_event(const TrainResult& r, const StepProfiler& profiler);
// A logged step: its event and its scalars, after `pos.step` steps.
void log_step(log::RunLog& log, const TrainingPosition& pos, double loss, double lr, double loss_scale,
              double samples_per_s);
// An epoch's line ("epoch 2/3 done: train_loss ... test_acc ...").
std::string epoch_line(const EpochResult& e, int64_t epochs);
// An epoch's event and its held-out scalars, after `step` steps.
void log_epoch(log::RunLog& log, const EpochResult& e, int64_t step);
// Collective: every rank's peak RSS, step and sync times and activation bytes, on rank 0 (empty
// elsewhere).
std::vector<RankFigures> gather_rank_figures(dist::ProcessGroup& group, const StepProfiler& profiler,
                                             const parallel::MemoryReport& memory);
// "rank R memory: parameters ... MiB, ...; sent ... MiB per step".
std::string memory_line(int64_t rank, const parallel::MemoryReport& m, double peak_rss_mib, double sent_bytes_per_step);

}  // namespace lockstep::train
