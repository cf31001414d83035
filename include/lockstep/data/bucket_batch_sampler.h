#pragma once
// Length-bucketed dynamic batches under a token budget (fairseq's and many LLM trainers' batching,
// with DistributedSampler's rank split): variable-length sequences are grouped with others of
// similar length, so a batch pads little, and a batch holds as many sequences as fit the budget.
//
// Note [Bucketed batches]: each epoch, on every rank alike (seeded with seed + epoch):
//  1. sequences longer than max_length are truncated to it (counted as max_length) or dropped;
//  2. the kept indices are shuffled and cut into chunks of sort_size; each chunk is sorted by
//     length (stable) and cut greedily into batches with size x longest <= max_tokens (padding
//     counted: every sequence of a batch is padded to its longest);
//  3. the batches of all chunks are shuffled together, so lengths do not rise through the epoch;
//  4. rank r of w takes batches r, r + w, r + 2w, ...; as DistributedSampler does with samples, the
//     list is first padded by repeating its head to a multiple of w batches, or truncated to one
//     with drop_last. Every rank then has the same number of batches, so no rank waits at a
//     collective for a step the others never take.
// The state is (epoch, next batch): the batches of an epoch are a function of the epoch, so a run
// resumed from a checkpoint mid-epoch continues with exactly the batches it would have had.

#include <torch/arg.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lockstep::data {

enum class OverlengthPolicy { kTruncate, kDrop };
const std::vector<std::string>& overlength_policy_names();  // truncate, drop

struct BucketBatchSamplerOptions {
  TORCH_ARG(int64_t, max_tokens) = 4096;  // per batch, per rank: batch size x longest sequence
  TORCH_ARG(int64_t, max_length) = 512;   // tokens; longer sequences are handled by `overlength`
  TORCH_ARG(OverlengthPolicy, overlength) = OverlengthPolicy::kTruncate;
  TORCH_ARG(int64_t, sort_size) = 0;      // sequences sorted together; 0: 1024 x num_replicas
  TORCH_ARG(int64_t, num_replicas) = 1;   // world size
  TORCH_ARG(int64_t, rank) = 0;
  TORCH_ARG(bool, shuffle) = true;
  TORCH_ARG(uint64_t, seed) = 0;          // the same on every rank
  TORCH_ARG(bool, drop_last) = false;     // see Note [Bucketed batches], step 4
};

struct Batch {
  std::vector<int64_t> indices;  // into the dataset
  int64_t length = 0;            // padded length: the longest (truncated) sequence, in tokens
  int64_t tokens = 0;            // real tokens: the sum of the (truncated) lengths
  int64_t padded_tokens() const { return length * static_cast<int64_t>(indices.size()); }
};

// 1 - real tokens / padded tokens over `batches`: the share of the compute spent on padding.
double padding_fraction(const std::vector<Batch>& batches);

class BucketBatchSampler {
 public:
  struct State {
    int64_t epoch = 0;
    int64_t next_batch = 0;  // index into this rank's batches of the epoch
  };

  // lengths[i]: sequence i's length in tokens (before truncation).
  BucketBatchSampler(std::vector<int64_t> lengths, BucketBatchSamplerOptions options = {});

  // Starts epoch `epoch` from its first batch; call before each epoch, as with DistributedSampler.
  void set_epoch(int64_t epoch);
  // This rank's next batch of the epoch, or nullopt at its end.
  std::optional<Batch> next();

  State state() const { return state_; }
  void load_state(const State& state);  // resume exactly there

  // This rank's batches for the current epoch, in order.
  const std::vector<Batch>& batches() const { return current_; }
  // The batches of every rank for the current epoch, after padding or truncation (step 4).
  std::vector<Batch> global_batches() const { return global_batches(state_.epoch); }
  // Per rank and the same on every rank; it can change from epoch to epoch, since the batches
  // depend on which sequences the shuffle puts together.
  int64_t num_batches() const { return static_cast<int64_t>(current_.size()); }
  int64_t num_kept() const { return static_cast<int64_t>(kept_.size()); }  // sequences not dropped
  double padding_fraction() const { return data::padding_fraction(batches()); }
  const BucketBatchSamplerOptions& options() const { return options_; }

 private:
  std::vector<Batch> epoch_batches(int64_t epoch) const;  // steps 1-3, every rank's
  std::vector<Batch> global_batches(int64_t epoch) const;  // step 4
  std::vector<Batch> rank_batches(int64_t epoch) const;

  std::vector<int64_t> lengths_;
  std::vector<int64_t> kept_;  // indices that pass step 1
  BucketBatchSamplerOptions options_;
  State state_;
  std::vector<Batch> current_;  // rank_batches(state_.epoch)
};

}  // namespace lockstep::data
