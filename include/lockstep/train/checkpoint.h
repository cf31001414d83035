#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/parallel/sharded_state.h"

namespace lockstep::train {

// How checkpoints are written (PyTorch's StateDictType): kFull, one file gathered on rank 0 that
// torch.load reads whole; kSharded, every rank writes its own shards (Note [Sharded checkpoint
// files]). Either resumes under any strategy.
enum class CheckpointFormat { kFull, kSharded };
const std::vector<std::string>& checkpoint_format_names();  // full, sharded

// Where training stands when a checkpoint is taken; a resumed run continues from exactly here.
struct TrainingPosition {
  int64_t epoch = 0;            // epoch in progress, 0-based (== epochs once training is complete)
  int64_t micro_batch = 0;      // micro-batches of that epoch already consumed, per rank
  int64_t step = 0;             // optimizer steps since the start of training, skipped ones included
  int64_t skipped_steps = 0;    // steps skipped for a non-finite loss or gradient
  int64_t consecutive_skips = 0;  // of those, the latest in a row (for --max-skipped-steps)
  double epoch_loss_sum = 0.0;  // sum of this epoch's step losses so far (for the epoch's mean)
  int64_t epoch_steps = 0;      // steps of this epoch so far

  // Where the next epoch starts: step and skip counts carry on, the per-epoch fields restart.
  TrainingPosition next_epoch() const {
    TrainingPosition p = *this;
    p.epoch = epoch + 1;
    p.micro_batch = 0;
    p.epoch_loss_sum = 0.0;
    p.epoch_steps = 0;
    return p;
  }
};

// An empty insertion-ordered dict str -> any (pickles as a Python dict).
c10::impl::GenericDict string_dict();

// One checkpoint file: a pickled dict that Python's torch.load reads, with the keys
//   "format": "lockstep-checkpoint-1", "position": {...}, "run": {...},
//   "model": state dict (name -> tensor, torch.load + load_state_dict accept it),
//   "optimizer": PyTorch's optimizer.state_dict() layout (optim::optimizer_state_dict), "scaler": GradScaler.state_dict() ({} without loss scaling),
//   "rng": [per-rank CPU generator state, uint8 tensors]
// What a sharded checkpoint's metadata says (Note [Sharded checkpoint files]).
struct ShardedCheckpointInfo {
  std::string dir;        // DIR/step-<8 digits>
  std::string strategy;   // the strategy that wrote it ("fsdp", "zero1", "zero2")
  int64_t world_size = 0;  // one rank file per rank
  std::vector<parallel::ShardLayout> layouts;
  // Drawn by rank 0 for each save and written into every rank file and the metadata, so that a file
  // left from another save is never taken for this one's (Note [Sharded checkpoint files]); 0: a
  // checkpoint written before save ids, whose files cannot be told apart.
  int64_t save_id = 0;
  // Set when this rank resumes its own shards directly (same strategy and world size): its file's
  // state and RNG. Otherwise the full entries of the Checkpoint are reassembled from every file.
  std::optional<parallel::ShardedState> own;
  torch::Tensor own_rng;
};

struct Checkpoint {
  TrainingPosition position;
  c10::impl::GenericDict run = string_dict();  // settings a resumed run must share (model, world size, ...)
  // None for a sharded checkpoint until reassemble_sharded_checkpoint() fills them.
  c10::IValue model;
  c10::IValue optimizer;
  c10::IValue scaler;
  std::vector<torch::Tensor> rng;
  std::optional<ShardedCheckpointInfo> sharded;  // set for a sharded checkpoint
};

// Writes atomically (temporary file, fsync, rename): a failure leaves a previous file at `path`
// intact. Throws c10::Error naming the path and the cause.
void save_checkpoint(const Checkpoint& checkpoint, const std::string& path);

// Reads a checkpoint; throws c10::Error naming the path and what is wrong with it (unreadable,
// not a lockstep checkpoint, missing entries). For a sharded checkpoint (a directory) it reads the
// metadata and checks that every rank file is there; see load_sharded_checkpoint.
Checkpoint load_checkpoint(const std::string& path);

// Throws c10::ValueError when `run` (this run's settings) differs from the checkpoint's in any
// key but world_size and batch_size, naming each value in both and the path.
void check_same_run(const Checkpoint& checkpoint, const c10::impl::GenericDict& run,
                    const std::string& path);

// Note [Resuming on another world size]
// A checkpoint holds the whole model and a replica's optimizer state whatever the strategy, so
// any world size can load it, as torch.load does in PyTorch; only the data position needs care.
// DistributedSampler deals the epoch's permutation out round-robin (rank r takes positions r,
// r+N, ...), so after j micro-batches of B samples on N ranks exactly the first j x B x N
// positions of the permutation have been consumed, whatever N is. A run of N' ranks and batch B'
// continues at micro-batch j x B x N / (B' x N'), rounded down to a whole optimizer step of
// accum_steps micro-batches (the samples in between are seen twice, and the notice says how
// many). Micro-batch j takes positions [j x B x N, (j + 1) x B x N), so a step of A micro-batches
// takes a contiguous block of G = B x N x A positions: with the same global batch (B' x N' x A' =
// G, as DeepSpeed's elasticity keeps train_batch_size by changing A; accum_steps may therefore
// differ from the checkpoint's) every later step holds the same samples as the original run's, and the run continues it up to the order of floating-point sums (and the
// padding of a last uneven batch); otherwise the steps are larger or smaller from here on, the
// learning-rate schedule and --scale-lr count them, and the run no longer reproduces the
// original: the notice says so. Ranks the checkpoint holds no RNG state for keep the seed's.

// Moves `position`, of a checkpoint `written` by one run's settings, to this run's data-parallel
// replicas and batch size (`run`) as Note [Resuming on another world size] says; a pipeline's
// stages together are one replica. Returns the notice to print, "" when both are the checkpoint's.
std::string adapt_position(TrainingPosition& position, const c10::impl::GenericDict& written,
                           const c10::impl::GenericDict& run, const std::string& path);

// Checkpoint files in a directory are named step-<8 digits>.pt by the optimizer step they hold;
// sharded checkpoints are directories step-<8 digits>.
std::string checkpoint_path(const std::string& dir, int64_t step);
std::string sharded_checkpoint_path(const std::string& dir, int64_t step);
// Whether `path` is a sharded checkpoint's directory (named step-<digits>, or holding metadata.pt).
bool is_sharded_checkpoint(const std::string& path);
// Checkpoints in `dir`, files and sharded directories, oldest first (temporary files of
// interrupted writes are ignored; a sharded directory is listed even before its metadata is
// written, and fails to load: see Note [Sharded checkpoint files]).
std::vector<std::string> list_checkpoints(const std::string& dir);
std::optional<std::string> latest_checkpoint(const std::string& dir);
// Deletes all but the newest `keep_last` checkpoints, files or directories (keep_last 0 keeps all).
void remove_old_checkpoints(const std::string& dir, int64_t keep_last);

}  // namespace lockstep::train
