#pragma once

#include <ATen/core/Dict.h>
#include <torch/types.h>

#include <cstdint>
#include <string>

#include "lockstep/parallel/sharded_state.h"
#include "lockstep/train/checkpoint.h"

namespace lockstep::train {

// Note [Sharded checkpoint files]
// CheckpointFormat::kSharded (`lockstep train --checkpoint-format sharded`, under fsdp, zero1 or
// zero2) writes torch.distributed.checkpoint's layout, one file per rank plus a metadata file,
// into one directory per save:
//   DIR/step-00000040/rank-00000-of-00002.pt  rank 0's shards (Note [Sharded state]) and RNG state
//   DIR/step-00000040/rank-00001-of-00002.pt  rank 1's
//   DIR/step-00000040/metadata.pt             position, run settings, strategy, world size, the
//                                             rank files and the units' layouts
// Each is a torch.save zip that Python's torch.load reads. Every file of one save carries the same
// save_id, a random number rank 0 draws and broadcasts before the ranks write: a rank file left
// from another save (an earlier save at this step, or a file copied in) has another one and is
// refused by name instead of resuming silently with another step's shards. Every rank writes its own file
// atomically (core/atomic_file.h) from what it holds; nothing of the model travels, so no rank
// ever holds more than its shards while saving. The ranks then vote (an all-gather of one flag,
// within the group's timeout: it is also the barrier), and only when every file is written does
// rank 0 write metadata.pt, last. The metadata is the commit: a directory without it, or without
// one of its rank files, is incomplete; load_checkpoint refuses it naming what is missing, and
// `--resume latest` skips it with a warning as it skips an unreadable file (Note [Falling back to
// an older checkpoint]). Before the ranks write, rank 0 deletes a stale metadata.pt (a save at a
// step written before), so old metadata never completes new files. keep_last counts and deletes
// directories like files.
// Resuming (train::Checkpointer): under the strategy that wrote it, on as many ranks, each rank
// reads only its own file and the strategy takes its shards (Strategy::load_sharded_state_dict).
// Under any other strategy or world size, every rank reads all N files and puts the full model
// state dict and the per-parameter optimizer state back together (consolidate_sharded_states),
// and the run resumes as from a full checkpoint (Note [Resuming on another world size]). A
// missing or unreadable rank file is an error naming the file, its rank and the fix.

constexpr const char* kShardedMetadataFile = "metadata.pt";

// "rank-00001-of-00002.pt"
std::string rank_file_name(int64_t rank, int64_t world_size);

// Writes this rank's file into `checkpoint_dir` atomically: `state`'s dict (see
// parallel::sharded_state_to_dict) plus "format", "rng" (this rank's CPU generator state) and
// "save_id" (ShardedCheckpointInfo::save_id). Throws c10::Error naming the path and the cause.
void save_rank_file(const parallel::ShardedState& state, const torch::Tensor& rng, const std::string& checkpoint_dir,
                    int64_t save_id);
// Writes c.sharded->dir/metadata.pt atomically from c.position, c.run and c.sharded (strategy,
// world size, layouts). Rank 0, after every rank's file is written.
void save_sharded_metadata(const Checkpoint& c);

// Reads `dir`'s metadata and checks that every rank file is there; no tensor is read. The
// Checkpoint has position, run and `sharded` set, and no model. Throws naming what is missing.
Checkpoint load_sharded_checkpoint(const std::string& dir);
// Reads rank `rank`'s file: its state, and its RNG state into `rng`. Throws naming the file, the
// rank and the fix when it is missing, unreadable or from another save than the metadata (another
// save id, rank, world size or layout).
parallel::ShardedState load_rank_file(const ShardedCheckpointInfo& info, int64_t rank, torch::Tensor& rng);
// Reads every rank's file and fills c.model, c.optimizer, c.scaler and c.rng: the full form, as if
// the checkpoint had been saved full by the strategy that wrote it.
void reassemble_sharded_checkpoint(Checkpoint& c);

// The "position" and "run" entries both forms share (checkpoint.cpp).
c10::impl::GenericDict position_and_run(const Checkpoint& c);
void read_position_and_run(const c10::impl::GenericDict& top, const std::string& source, Checkpoint& c);

}  // namespace lockstep::train
