#pragma once
// The dry run behind a memory plan (see Note [Activations by a dry run]): a few local steps of the
// run's model, optimizer and precision on small batches, counted by TensorMemoryCounter; and the
// plan and its check on data train() has already built.

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "lockstep/parallel/strategy.h"
#include "lockstep/train/memory_plan.h"
#include "lockstep/train/options.h"
#include "reference_data.h"

namespace lockstep::train {

// bytes(rows) = intercept + slope x rows, fitted through two measured points.
struct LinearBytes {
  double intercept = 0.0;
  double slope = 0.0;
  int64_t at(int64_t rows) const;
};

struct MemoryProbe {
  parallel::MemoryReport local;  // the local strategy's own report after two steps
  int64_t masters = 0;           // of local.optim_bytes: the fp32 master weights (O2)
  // Bytes above parameters, masters and optimizer state at a steady step's peak (its gradients
  // and activations), and above parameters and masters during the first step (gradients,
  // activations and the optimizer's new state), by rows of the micro-batch.
  LinearBytes steady, first;
  // Bytes a forward without grad on eval_rows rows (evaluation) reaches above everything the steps
  // left: in tensors or, when larger, in resident memory (see reset_resident_peak).
  int64_t eval_bytes = 0;
  int64_t peak_rows = 0;  // rows of the epoch's largest batch (text: the most padded tokens)
  int64_t dry_rows = 0;   // rows of the larger dry run (2 x probe_rows)
  // false for the model states alone (plan_model_states): no step ran, so a plan from it holds no
  // step's tensors (activations, gradients in flight).
  bool stepped = true;
  // Each block's share of the activations a forward leaves for backward (Note [Model blocks]).
  std::vector<double> block_shares;
  // The trainable parameters as the run's opt level stores them (bf16 at O2 and O3, BatchNorm's
  // kept fp32 at O2), in the model's order: (elements, dtype). ddp's buckets are cut from these.
  std::vector<std::pair<int64_t, c10::ScalarType>> trained;
};

// Dry-runs `o`'s model from `data` under the local strategy at `o`'s opt level, with activation
// checkpointing when `o` asks for it, on probe_rows and 2 x probe_rows rows of the epoch's largest
// batch for one of `replicas` data-parallel replicas.
// eval_rows: evaluation's batch (0: none); per_block: measure block_shares (the pipeline's).
MemoryProbe probe_memory(const ReferenceData& data, const TrainOptions& o, int64_t replicas, int64_t probe_rows,
                         int64_t eval_rows, bool per_block);

// What the process measured of itself (see Note [Planning memory]), in bytes.
struct ProcessMemory {
  int64_t data = 0;      // resident growth while the data was built
  int64_t baseline = 0;  // resident after the first dry run, less `data`; 0: not measured yet
  int64_t eval = -1;     // MemoryProbe::eval_bytes of the first dry run; -1: not measured yet
  // Dry runs made so far, by what decides one (activation checkpointing, data-parallel replicas,
  // block shares measured): a refusal's alternatives differ from the run in their strategy, so
  // most reuse the run's dry run instead of repeating it (see Note [Refusing fast]).
  std::map<std::tuple<bool, int64_t, bool>, MemoryProbe> probes;
  // A freshly built fp32 model whose layout the strategies' arithmetic reads; null: not built yet.
  std::shared_ptr<models::Classifier> layout;
};

// A lower bound on the plan of `o`, made without a dry run (see Note [Refusing fast]): what the
// process holds now (its code, its data) plus each rank's model states in the strategy's layout,
// with no activations or evaluation. For opt levels that keep fp32
// weights (O0, O1) only: O2 and O3 convert them.
// Builds process.layout when it is null.
MemoryPlan plan_model_states(const TrainOptions& o, const MemoryPlanOptions& p, const ReferenceData& data,
                             ProcessMemory& process);

// Runs what is in its scope on one intra-op thread, then restores the count it found. The check
// at launch and `lockstep plan` run under it (see Note [Refusing fast]).
class SingleThreadGuard {
 public:
  SingleThreadGuard();
  ~SingleThreadGuard();
  SingleThreadGuard(const SingleThreadGuard&) = delete;
  SingleThreadGuard& operator=(const SingleThreadGuard&) = delete;

 private:
  int threads_;
};

// One small forward and backward through a convolution and a linear layer, so that LibTorch,
// oneDNN and the autograd engine have made what they make once per process; returns the resident
// bytes after it.
int64_t warm_up();

// Gives glibc's free pages and the caching allocator's cached blocks back to the kernel.
void release_heap();

// The plan for `o` with its data built already; measures process.baseline after its dry run when
// it is 0.
MemoryPlan plan_with_data(const TrainOptions& o, const MemoryPlanOptions& p, const ReferenceData& data,
                          ProcessMemory& process);

// One rank's planned MiB in a line: "rank 0: parameters 0.11, ... peak 245.3 MiB (steady state)".
std::string rank_breakdown(const RankMemory& m);

// Throws c10::Error naming the rank, the plan's breakdown, `limit` and the cheapest plans that fit
// (memory_plan_refusal) when the largest rank's peak exceeds `limit`. A run that cannot be planned
// (a model file that fails on the data, a model fsdp cannot cut) is not checked: its own setup,
// which comes next, says why in its words.
void check_memory_plan(const TrainOptions& o, const MemoryPlanOptions& p, const ReferenceData& data,
                       ProcessMemory process, const MemoryLimit& limit);

}  // namespace lockstep::train
