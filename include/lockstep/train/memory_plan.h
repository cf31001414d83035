#pragma once
// Know before launch: each rank's peak memory under a strategy, precision and batch size, and
// whether it fits the memory the rank may use (`lockstep plan`, and the check `lockstep train`
// makes at start).

#include <nlohmann/json.hpp>
#include <torch/arg.h>

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/train/memory_limit.h"
#include "lockstep/train/options.h"

namespace lockstep::train {

// Note [Planning memory]
// A rank's peak resident memory is planned as the sum of what it holds, each term from what
// decides it rather than from a figure recorded elsewhere:
//   baseline     the process before training: LibTorch's and oneDNN's code and tables, the
//                allocator's arenas, the autograd engine's and OpenMP's threads. Measured in
//                the planning process itself (its resident set after a warm-up forward and
//                backward), which runs the same binary and libraries as the rank will. Ranks of
//                one host that copy their collectives through shared memory (ddp, zero, fsdp;
//                not the pipeline's sends) add the group's segment, which the planning process
//                does not make: a slot per rank and a result slot of 2 MiB, each filled up to
//                the model's bytes (6 MiB of RssShmem per rank on two ranks of gpt-mini).
//   data         what the data source holds in memory (the whole Fashion-MNIST or synthetic
//                split, the tokenised corpus): the resident growth while the planning process
//                builds the data exactly as `lockstep train` does.
//   parameters, gradients, optimizer state, fp32 masters
//                the strategy's layout, by the strategy's own arithmetic: replicas (local,
//                ddp), the flat N x S buffer and its shards (zero1, zero2; Note [Flat
//                parameters and shards]), the units' shards plus the largest gathered unit
//                (fsdp), the stage's parameters (pipeline). The optimizer's state is measured by
//                stepping the run's optimizer once over tensors of the rank's shapes (a whole
//                replica's: the dry run's own optimizer, which stepped those shapes already).
//                These equal what Strategy::memory() reports.
//   activations  see Note [Activations by a dry run].
//   buffers      communication buffers outside those: ddp's gradient buckets (a copy of the
//                gradients, PyTorch's layout); for zero1, zero2 and fsdp the collectives' own
//                tensors (a reduce-scatter's received chunks and its sum, Gloo's flat output of
//                the parameters' all-gather) and stage 2's and fsdp's bucket staging, each
//                bucket as ShardReducer closes it (at the first parameter that takes it past
//                the 25 MiB cap, so it can be larger than the cap).
//   collectives  what collectives in flight hold at the end of backward, beyond the buffers: ddp's
//                bf16 buckets are all-gathered (Gloo has no bf16 all-reduce), each into N copies
//                plus Gloo's flat output of as many bytes, until backward's last bucket is summed.
//                O2's master gradients are not there yet at that moment, so the steady step adds
//                what the all-gathers hold beyond them.
// A step of several micro-batches (accumulation, a pipeline's micro-batches) also holds, in its
// activations, the largest parameter's gradient of a later micro-batch before backward adds it
// into the earlier ones': mlp-wide's fc2 (16 MiB) on the pipeline's second stage.
// Reducing into shards (zero2, fsdp; Note [Reducing gradients into shards]) holds, beside the
// bucket's staging that stands for the dry run's gradients, each parameter's gradient while it
// is copied into the staging (then freed), and, when the bucket closes, its reduce-scatter's
// output (the bucket's shard): the larger of the two is in the activations. mlp-wide's fc2
// gradient (16 MiB) on two ranks of zero2: the caching allocator's live high water was 120.6 MiB
// of classes against 86.5 MiB of planned tensors without it.
// The peak is the largest of three moments: the first step, when the optimizer's state is created
// after backward (DeepSpeed users meet this as a spike at the first step); a steady step, when the
// state exists and activations and gradients peak together at the end of backward; and the
// evaluation after an epoch, a forward without grad on eval_batch_size rows (200 for images, twice
// a small training batch) while the gradients and the state are still held.
// A fourth moment comes before all three: the check `lockstep train` makes at launch (unless
// --ignore-memory-plan) dry-runs a whole replica under the local strategy (Note [Activations by a
// dry run]): its parameters, gradients and optimizer state, with the dry run's first step or its
// evaluation forward on top. A sharded rank holds less than that in training, so there the check
// is the peak: mlp-wide's pipeline stage 0, 267 MiB measured against 238.5 planned for training.
// Text batches change their padded length from step to step, so a step's activations come in
// other size classes than the last steps' and find few of their blocks cached: the cache keeps
// those up to its bound, an eighth over the live high water (Note [Caching large CPU blocks]),
// and a steady step of a text run holds them beside its own (`cached`, bound_bytes() of the
// step's tensors less the tensors). Images repeat one shape and reuse their blocks: no such term.
// gpt-mini on one rank: planned 342.4 MiB without it, 366.1 measured.
// Resident memory is not live memory. Under the caching allocator (Note [Caching large CPU
// blocks], the default), the blocks of 128 KiB and more that the process maps never exceed the high
// water of live ones, so a moment's resident tensors are its live tensors (the step's freed blocks
// are unmapped for the evaluation's when they do not fit) and the moments take their maximum.
// Under LOCKSTEP_CPU_ALLOCATOR=glibc the heap keeps the step's freed blocks (Note [Keeping freed
// memory for the next step]), which the evaluation's tensors of another batch size cannot reuse:
// there the evaluation adds to the step's activations; the heap's holes beside that (mlp-wide
// zero2: 196 MiB free beside 129 MiB in use, and a different amount in each run) are not planned,
// which is why the caching allocator exists (docs/memory-plan.md "Where the rest went").

// Note [Plans of many ranks]
// Ranks that hold the same are planned once: every rank of local, ddp, dp, zero1, zero2 and fsdp
// (their layouts do not depend on the rank), and the ranks of one pipeline stage (rank r runs
// stage r mod stages). A plan of N ranks therefore has one entry per stage at most, whatever N:
// 2^20 ranks of ddp are one entry of 2^20 ranks, planned and printed in the time of one, where a
// line and a RankMemory per rank took minutes and gigabytes for 10^6 and more. The printed table
// lists at most kPlanTableEntries entries (the first and the last halves, with a line saying how
// many lie between); the JSON form lists every one. A plan's world is at most kMaxWorldSize ranks
// (core/world.h, 2^20), and a host's ranks at most the world's.

// How a plan is made.
struct MemoryPlanOptions {
  TORCH_ARG(int64_t, world_size) = 1;   // at most kMaxWorldSize
  TORCH_ARG(int64_t, local_ranks) = 0;  // ranks on one host (they share its memory), <= world_size; 0: world_size
  // Rows of the dry run's two batches: probe_rows and twice as many (see Note [Activations by a
  // dry run]).
  TORCH_ARG(int64_t, probe_rows) = 4;
  // Plan the evaluation after each epoch (one forward without grad at its batch size, run by the
  // dry run); off: the plan's evaluation moment is 0.
  TORCH_ARG(bool, evaluation) = true;

 public:
  // Throws c10::ValueError naming the first invalid value.
  void validate() const;
};

// One rank's planned bytes, and which ranks hold the same (Note [Plans of many ranks]).
struct RankMemory {
  int64_t rank = 0;    // the first rank of those with this plan
  int64_t count = 1;   // how many: ranks rank, rank + stride, ..., rank + (count - 1) x stride
  int64_t stride = 1;  // the pipeline's stages; 1 otherwise
  int64_t stage = -1;  // the pipeline's stage; -1 otherwise
  int64_t parameters = 0;
  int64_t gradients = 0;
  int64_t optimizer_state = 0;  // without the fp32 masters
  int64_t masters = 0;          // fp32 master weights (O2), 0 otherwise
  int64_t activations = 0;      // at the steady step's peak
  int64_t buffers = 0;          // communication buckets and staging
  int64_t collectives = 0;      // collectives' outputs in flight at the end of backward (ddp's bf16 all-gathers)
  int64_t cached = 0;           // blocks of other size classes the allocator keeps at a steady step (text)
  int64_t baseline = 0;
  int64_t data = 0;
  int64_t first_step = 0;  // the peak of the first step
  int64_t steady = 0;      // the peak of a later step
  int64_t evaluation = 0;  // the peak of evaluating the held-out split after an epoch
  int64_t launch_check = 0;  // the peak of the check at launch: its dry run of a whole replica

  int64_t peak() const;
  // "check at launch", "first step", "steady state" or "evaluation": when peak() happens.
  std::string peak_moment() const;
  // The ranks with this plan: "rank 3", "ranks 0-7", "ranks 1, 3", "ranks 1, 3, ..., 1023 (512 ranks)".
  std::string which_ranks() const;
};

// The most entries MemoryPlan::table() lists one per line (Note [Plans of many ranks]).
constexpr int64_t kPlanTableEntries = 16;

struct MemoryPlan {
  std::string strategy;
  std::string opt_level;
  int64_t world_size = 1;
  int64_t batch_size = 0;  // per rank and micro-batch
  bool checkpoint_activations = false;
  // One entry per group of ranks that hold the same, by first rank (Note [Plans of many ranks]).
  std::vector<RankMemory> ranks;

  // The entry with the largest peak (the first of equals).
  const RankMemory& largest() const;
  // Rank r's plan, as one rank (count 1). Throws c10::ValueError outside [0, world_size).
  RankMemory of_rank(int64_t r) const;
  nlohmann::ordered_json to_json() const;
  // One line per entry, MiB: "ranks 0-1: parameters 0.11, gradients 0.11, ... peak 245.3 (steady
  // state)"; past kPlanTableEntries entries, the first and last halves of them.
  std::string table() const;
};

// The plan for the run `o` describes, on `p.world_size()` ranks: builds the data and a model as
// `lockstep train` would, and dry-runs it (Note [Activations by a dry run]). Throws
// c10::ValueError as train() would for options that cannot train, and, before building anything,
// for a model whose parameters alone exceed what each of the host's ranks may use
// (check_model_size, with available_memory() over p's local ranks).
MemoryPlan plan_memory(const TrainOptions& o, const MemoryPlanOptions& p);

// Note [Refusing absurd shapes]
// A model too large for the host took the plan minutes and gigabytes before it answered, or ended
// in LibTorch's allocation failure (a context of 10^9 tokens is a position table of 10^9 x n_embd
// parameters), where the arithmetic of its configuration refuses it at once. Every rank builds the
// whole model in fp32 before a strategy shards or converts it, and so does the plan's own dry run,
// so the parameters' fp32 bytes are a lower bound on what each rank holds, whatever the strategy;
// a model past that bound is refused before the data or the model is built. So is one whose
// states per rank under the run's strategy cannot fit, before any activation: at O0 and O1, local,
// dp and ddp hold the fp32 parameters, gradients and the optimizer's state (its bytes per element
// from the run's own optimizer, stepped over stand-ins); zero1 a 1/world share of the state, zero2
// of the gradients too; fsdp and the pipeline the build's parameters (they keep a share after it).
// n_embd 8192 (3.2 billion parameters, 12 GiB) passed the first bound on a 24 GiB host, so the plan
// went on to build the model; its 36 GiB of local states are now refused in 0.4 s. One within
// both is planned by its dry run as any other (n_embd 4096 with SGD and momentum: 0.8 billion
// parameters, 9 GiB of states; the plan of 11 GiB took 131 s of CPU, most of it the dry run's steps). gpt-mini's are counted from its
// layers, width and context (models/gpt_mini.h lists its tensors): per block 12 C^2 + 13 C
// (attention's 3C x C and C x C, the MLP's 4C x C and C x 4C, their biases, two LayerNorms), the
// position table T x C and the final LayerNorm's 2 C. The token embedding is left out (its rows are
// known only once the corpus is tokenised), so the count is a lower bound; the arithmetic is in
// doubles, which cannot overflow for any int64 sizes. The reference image models have no size
// setting; a model file's size is not known before it is loaded: both count 0.
double model_parameter_lower_bound(const TrainOptions& o);
// Throws c10::ValueError naming the settings, the parameter count, its bytes, `limit` and what to
// lower when model_parameter_lower_bound(o) x 4 bytes exceeds limit.bytes, or when the model's
// states per rank under o's strategy on p.world_size() ranks do (with the sharding strategies' bounds).
void check_model_size(const TrainOptions& o, const MemoryPlanOptions& p, const MemoryLimit& limit);

// What a refused run reads: why the plan does not fit `limit`, its largest rank's breakdown, and
// the cheapest alternatives that fit (another strategy, activation checkpointing), as planned by
// `alternatives`. Empty when the plan fits.
std::string memory_plan_refusal(const MemoryPlan& plan, const MemoryLimit& limit,
                                const std::vector<MemoryPlan>& alternatives);

}  // namespace lockstep::train
