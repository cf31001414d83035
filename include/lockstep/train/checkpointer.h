#pragma once

#include <ATen/core/Dict.h>
#include <c10/util/StringUtil.h>
#include <torch/arg.h>

#include <cstdint>
#include <optional>
#include <string>

#include "lockstep/core/directory_lock.h"
#include "lockstep/core/report.h"
#include "lockstep/dist/process_group.h"
#include "lockstep/parallel/strategy.h"
#include "lockstep/train/checkpoint.h"

namespace lockstep::train {

struct CheckpointerOptions {
  TORCH_ARG(std::string, dir) = "";     // where step-<N>.pt files go; "": no checkpoints
  TORCH_ARG(int64_t, save_every) = 0;   // also save every N optimizer steps; 0: at epoch ends only
  TORCH_ARG(int64_t, keep_last) = 0;    // newest checkpoints kept; 0: all
  TORCH_ARG(std::string, resume) = "";  // a checkpoint file, a directory (its newest), or "latest" (in dir)
  // kSharded: every rank writes its own shards (Note [Sharded checkpoint files]); the strategy
  // must have a sharded form (fsdp, zero1, zero2).
  TORCH_ARG(CheckpointFormat, format) = CheckpointFormat::kFull;
  // The name of the strategy this run trains with (Strategy::name()): a sharded checkpoint it
  // wrote on as many ranks is resumed shard by shard, each rank reading only its own file.
  TORCH_ARG(std::string, strategy) = "";
  // Where what it does and the errors it outlives go (see Note [Reports]); rank 0 reports, but for
  // a rank's own failures.
  TORCH_ARG(Reporter, reporter) = stdio_reporter();
};

// Note [Interrupted saves]
// A save killed part way (SIGKILL, a node lost) leaves temporary files (atomic_file's NAME.tmp.PID,
// in the directory or a sharded step's) and, for the sharded format, a step directory without the
// metadata.pt that commits it. Neither ever loads, and nothing else would delete them. Rank 0
// removes both when a run starts on the directory, under the directory's lock (so no other run is
// writing there) and before any rank reads it, and says what it removed. A sharded step with its
// metadata but a rank file missing is kept: restoring the file makes it load.

// When a run checkpoints, what a checkpoint holds, and how a run resumes from one. A checkpoint
// holds the position, the run's settings, the strategy's model and training state, and every
// rank's RNG, so a resumed run continues bit for bit. Rank 0 writes, atomically (sharded: every
// rank writes its own file, Note [Sharded checkpoint files]); a failed write is reported and
// training goes on with the previous checkpoint intact. Rank 0 holds a lock on
// the directory for the whole run, so a second run on it is refused. Methods marked collective
// must be called on every rank of the group.
class Checkpointer {
 public:
  // `run`: the settings a checkpoint must share to be resumed by this run (model, world size,
  // batch, precision, ...); see check_same_run. Collective with a directory and a group: rank 0
  // locks the directory and removes what interrupted saves left there (Note [Interrupted saves]).
  Checkpointer(CheckpointerOptions options, c10::impl::GenericDict run, dist::ProcessGroup* group);

  // The checkpoint options().resume() names, checked against this run's settings and its `epochs`;
  // nullopt when not resuming, or when "latest" finds no checkpoint yet (a first start under a
  // restart loop). "latest" and a directory fall back to the newest checkpoint that reads,
  // warning about each one skipped. Not resuming, a directory that already holds checkpoints is
  // refused (another run's, or this run's that a fresh start would mix with its own). Load the
  // checkpoint's model weights into the module before making the strategy.
  std::optional<Checkpoint> load_resume(int64_t epochs);
  // Collective. The strategy's training state and this rank's RNG from `checkpoint`, and the
  // position to continue from (the start without one); every rank must resume at the same step.
  TrainingPosition restore(const std::optional<Checkpoint>& checkpoint, parallel::Strategy& strategy);

  bool enabled() const { return !options_.dir().empty(); }
  // Whether to save once `step` optimizer steps are done, inside an epoch.
  bool due(int64_t step) const { return enabled() && options_.save_every() > 0 && step % options_.save_every() == 0; }
  // Collective: every rank contributes its RNG state and the strategy's training state (gathered
  // from the shards under zero1/zero2); rank 0 writes and the others wait for it. Sharded: every
  // rank writes its own file and rank 0 the metadata, last (Note [Sharded checkpoint files]).
  void save(const TrainingPosition& at, parallel::Strategy& strategy);

  // The checkpoint file this run resumed from, "" when it did not.
  const std::string& resumed_from() const { return resumed_from_; }

 private:
  void check_same_position_on_all_ranks(const TrainingPosition& position);
  void save_sharded(const TrainingPosition& at, parallel::Strategy& strategy);
  // A sharded checkpoint this run resumes: this rank's own file when the strategy and the world
  // size are the ones that wrote it, else the full form from every rank's file.
  void read_sharded(Checkpoint& c);
  // The newest of `all` (list_checkpoints' order) that loads on every rank (throws when none
  // does); `path`: their directory, then the checkpoint's path.
  Checkpoint load_newest_readable(const std::vector<std::string>& all, std::string& path);
  void refuse_existing_checkpoints();
  void remove_interrupted_saves();
  // Every rank's answer to "did it fail?": the ranks that said yes (a collective).
  std::vector<std::string> ranks_that_failed(bool failed) const;
  // The lowest and highest `value` of all ranks (a collective; needs group_).
  std::pair<int64_t, int64_t> range_over_ranks(int64_t value) const;
  template <typename... Args>
  void say(ReportKind kind, const Args&... args) const {
    report(options_.reporter(), kind, c10::str(args...));
  }

  CheckpointerOptions options_;
  c10::impl::GenericDict run_;
  dist::ProcessGroup* group_;
  int64_t rank_;
  std::string resumed_from_;
  // Rank 0: whether the directory is still this run's to write, retaking the lock when it was
  // removed; says why not, once. See Note [A lock that survives its directory].
  bool directory_still_ours(int64_t step);

  DirectoryLock lock_;  // rank 0's, on options_.dir()
  std::string lock_lost_;  // why saving stopped; empty while it goes on
};

}  // namespace lockstep::train
