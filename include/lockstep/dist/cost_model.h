#pragma once
// What collectives and a data-parallel step's communication cost at sizes that cannot be tried
// here: the alpha-beta model, its fit from `lockstep bench --collectives`, and the prediction
// `lockstep plan` prints (docs/scaling.md).

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/dist/process_group.h"

namespace lockstep::dist {

// Note [The alpha-beta model]
// A message of S bytes over a link takes alpha + S x beta: alpha the latency of one step, beta the
// seconds per byte (1 / bandwidth). An all-reduce of S bytes then costs:
// - one host, L ranks, shared memory (Note [Collectives through shared memory]): alpha_h + S x
//   beta_h, fitted as one line: every rank copies S in and out and sums S/L of every slot, so the
//   time does not grow with L while each rank has a core;
// - flat, ranks on H >= 2 hosts, N = H x L (Note [Hierarchical all-reduce]): one ring of N whose
//   slowest hops are the hosts' links: 2(N-1) steps, each host's link carrying 2(N-1)/N x S:
//   2(N-1) alpha + 2(N-1)/N x S x beta;
// - hierarchical: L rings of H ranks side by side, each with S/L, sharing the host's link, so the
//   link carries 2(H-1)/H x S: 2(H-1) alpha + 2(H-1)/H x S x beta, plus what the pipeline cannot
//   hide: the host's sum of the first piece and the gather of the last, 2 x (alpha_h + P x beta_h)
//   for pieces of P = min(S, 2 MiB).
// The link's alpha and beta are fitted from 2 hosts x 1 rank (a ring of 2: 2 alpha + S beta) and
// the host's from 1 host x 2 ranks; every other configuration is predicted, not fitted, and
// docs/scaling.md sets the predictions beside the measurements. Fits minimise the relative error
// (weights 1/t^2), so small messages count as much as large ones, with alpha >= 0: over 1-64 MiB
// of a 1 Gbit/s link the latency is under 1% of the smallest time, and the free fit's alpha lands
// anywhere in -32..+87 us from run to run.
// The host's line holds for buffers that come from memory (Note [Collective bandwidths]: the
// benchmark's cold buffers); one buffer reused by every call stays in cache below ~8 MiB and is
// faster there, by up to 1.7x, in a way no line follows.
struct LinkCost {
  double alpha = 0.0;  // seconds per step
  double beta = 0.0;   // seconds per byte

  // "100Gbit/5us": a rate (bit/s, with k, M, G or T; "Gbit", "gbit" and "Gb" alike) and the
  // one-step latency (ns, us, ms or s). Throws c10::ValueError naming the spec and the form.
  static LinkCost parse(const std::string& spec);
  std::string describe() const;  // "alpha 5.0 us, beta 0.080 ns/B (12.50 GB/s)"
};

// H hosts of L ranks each. Shapes are bounded as jobs are (kMaxWorldSize, core/world.h: at most
// 2^20 ranks), checked before multiplying, so no product of them wraps around: hosts = 2^62 or
// ranks_per_host = 2^63 - 1 once gave a negative or zero number of ranks.
struct ClusterShape {
  int64_t hosts = 1;
  int64_t ranks_per_host = 1;
  // hosts x ranks_per_host; throws as validate() does.
  int64_t ranks() const;
  // Throws c10::ValueError naming both values unless each is at least 1 and their product at most
  // kMaxWorldSize.
  void validate() const;
};

struct CollectiveCosts {
  LinkCost link;  // between hosts, each host's link
  LinkCost host;  // one all-reduce inside a host through shared memory, as a whole

  // Seconds of one sum all-reduce of `bytes` on `shape` with `algorithm` (kFlat or kHierarchical;
  // hierarchical needs hosts >= 2 and ranks_per_host >= 2, else it is flat). Throws
  // c10::ValueError for a shape validate() refuses or negative bytes.
  double all_reduce_seconds(int64_t bytes, const ClusterShape& shape, AllReduceAlgorithm algorithm) const;
};

// alpha + beta x bytes through (bytes[i], seconds[i]), minimising sum ((fit - t) / t)^2 with
// alpha >= 0 (when the free minimum has alpha < 0, the best line through the origin); divide
// by the steps and bytes factors of the algorithm measured to get a link's alpha and beta.
// Throws c10::ValueError for fewer than two distinct sizes or a non-positive time.
LinkCost fit_line(const std::vector<double>& bytes, const std::vector<double>& seconds);

// Note [A step's exposed communication]
// DDP all-reduces its gradient buckets in the order backward fills them, one after another, while
// backward goes on. With backward taking B seconds and producing the gradients evenly in time, the
// bucket that completes the first k bytes of G is ready at B x k / G; it starts when it is ready
// and the one before it has finished; what is left after backward ends is exposed: it adds to the
// step. The step is forward + backward + exposed + optimizer.
// predict_step walks the buckets one by one: at most kMaxBuckets of them (25 TiB of gradients in
// DDP's 25 MiB buckets), counted before the walk starts.
struct StepShape {
  double forward_s = 0.0;
  double backward_s = 0.0;
  double optimizer_s = 0.0;
  int64_t gradient_bytes = 0;
  int64_t first_bucket_bytes = int64_t{1} << 20;  // the reducer's first, small bucket
  int64_t bucket_bytes = int64_t{25} << 20;       // DDP's bucket_cap_mb

  static constexpr int64_t kMaxBuckets = int64_t{1} << 20;
  // The buckets the gradients fill (0 without gradients); throws c10::ValueError naming the values
  // for bucket sizes under 1 byte, negative gradient bytes or times, or more than kMaxBuckets.
  int64_t buckets() const;
};

struct StepPrediction {
  double communication_s = 0.0;  // every bucket's all-reduce, back to back
  double exposed_s = 0.0;        // of it, what backward does not hide
  double step_s = 0.0;
};

// Throws c10::ValueError for a step or shape that buckets() or ClusterShape::validate() refuses.
StepPrediction predict_step(const StepShape& step, const CollectiveCosts& costs, const ClusterShape& shape,
                            AllReduceAlgorithm algorithm);

}  // namespace lockstep::dist
