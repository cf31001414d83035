#pragma once
// `lockstep bench --collectives`: the time of each collective over the ranks of a process group,
// for message sizes from bytes to hundreds of MiB, as nccl-tests reports it (time, algbw, busbw).

#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/dist/process_group.h"

namespace lockstep::bench {

// Note [Collective bandwidths]
// For each collective, algorithm and size S (bytes of fp32, nccl-tests' "size": the buffer an
// all-reduce or broadcast works on, the whole N x n input of a reduce-scatter, the whole output of
// an all-gather): one call to warm up and estimate its time t, then `iterations` samples of k
// calls back to back, k = ceil(0.1 s / t) (at most 1000), as nccl-tests averages its loop: ranks
// leave a barrier up to a few milliseconds apart, which a single short call would count. Every rank
// starts each sample after a barrier; a sample is the slowest rank's mean per call (a max
// all-reduce of the times after it), and a row gives the median sample. algbw = S / time; busbw =
// algbw x 2(N-1)/N for an all-reduce, x (N-1)/N for a reduce-scatter or an all-gather, x 1 for a
// broadcast: the rate each rank's link runs at in a bandwidth-optimal algorithm, comparable
// across collectives and N.
// Cold buffers (the default): each call takes the next of several equal buffers that together
// span twice the last-level cache (at most 1024 of them), so its data come from memory, as a
// training step's gradient buckets do after backward has streamed activations and weights through
// the cache. One buffer reused by every call (warm_cache, Intel MPI Benchmarks' default) stays in
// cache between calls while the ranks' buffers fit there beside whatever else uses it; on one host
// it made the shared-memory all-reduce up to 1.7x faster below that size and swing between runs
// around it (docs/scaling.md). Messages under 64 KiB rotate through less than the cache: they cost
// latency, not bandwidth.
// Every all-reduce algorithm the group's hosts allow is measured (Note [Hierarchical
// all-reduce]): flat always, hierarchical when every host holds the same number (>= 2) of ranks
// and there are several hosts.
// Before the first call, each rank sets the buffers of the largest size (collectives_bench_bytes)
// against what it may use (train::available_memory, Note [Memory available to a rank], shared by
// its host's ranks); the smallest share among the ranks decides for all of them, so every rank
// refuses at once, naming that share, the largest size that fits and the limit's source, where a
// size past the memory failed in LibTorch's allocator on some ranks while the others waited in a
// collective. Sizes grow by step_factor only while the product stays at most max_bytes, checked
// before multiplying, so a max_bytes near 2^63 cannot wrap around.
struct CollectivesBenchOptions {
  TORCH_ARG(int64_t, min_bytes) = int64_t{1} << 10;
  TORCH_ARG(int64_t, max_bytes) = int64_t{256} << 20;
  TORCH_ARG(int64_t, step_factor) = 4;  // each size is the previous one times this (nccl-tests' -f)
  TORCH_ARG(int64_t, iterations) = 5;   // timed samples per size
  TORCH_ARG(bool, warm_cache) = false;    // every call reuses one buffer (see above)
  TORCH_ARG(std::string, out) = "";     // rank 0 writes collectives.csv, .md and .svg here; "": nowhere

 public:
  // Throws c10::ValueError naming the bad value.
  void validate() const;
};

struct CollectiveTiming {
  std::string collective;  // all_reduce, reduce_scatter, all_gather, broadcast
  std::string algorithm;   // flat or hierarchical (all_reduce); flat otherwise
  int64_t bytes = 0;       // S, see Note [Collective bandwidths]
  int64_t ranks = 0;
  int64_t hosts = 0;
  double seconds = 0.0;    // median of the calls
  double algbw_gbps = 0.0; // GB/s (10^9 bytes)
  double busbw_gbps = 0.0;
  int64_t runs = 1;        // results files this row is the median of (bench/scaling.h)
};

// The message sizes measured: min_bytes, then times step_factor up to max_bytes. Throws as
// validate() does.
std::vector<int64_t> collective_sizes(const CollectivesBenchOptions& options);
// Bytes of the buffers one of `ranks` ranks allocates for the largest size's calls (the most of
// the four collectives'; the collectives' own temporaries come on top). INT64_MAX when that many
// bytes overflow an int64.
int64_t collectives_bench_bytes(const CollectivesBenchOptions& options, int64_t ranks);

// Collective over `world`: every rank calls it, and every rank gets the same rows. `progress`
// (rank 0 only; may be empty) receives one line per row as it is measured. Throws c10::ValueError
// on every rank when the buffers of the largest size exceed what a rank may use (see the Note).
std::vector<CollectiveTiming> run_collectives_bench(dist::ProcessGroup& world, const CollectivesBenchOptions& options,
                                                    const std::function<void(const std::string&)>& progress = {});

// The rows as CSV (a header, then one line per row) and as a Markdown table.
std::string collectives_csv(const std::vector<CollectiveTiming>& rows);
std::string collectives_markdown(const std::vector<CollectiveTiming>& rows);
// busbw against size (log2 x axis), one line per collective and algorithm.
std::string collectives_chart_svg(const std::vector<CollectiveTiming>& rows);

}  // namespace lockstep::bench
