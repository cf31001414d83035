#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::train {

struct EpochResult {
  int64_t epoch = 0;         // 1-based
  double train_loss = 0.0;   // mean over the epoch's steps
  double test_acc = 0.0;     // fraction of the test split classified correctly (NaN: not measured, see Metric)
  double test_loss = NAN;    // mean loss on the held-out split: next-token (language model), per sample (Metric::kNone)
  double perplexity = NAN;   // exp(test_loss)
  double train_s = 0.0;      // training time, evaluation excluded
};

// One rank's figures, gathered to rank 0 in a run of several ranks.
struct RankFigures {
  int64_t rank = 0;
  double peak_rss_mib = 0.0;
  double step_ms = 0.0;          // mean wall time per step (--profile; else 0)
  double sync_ms = 0.0;          // of it, waiting on other ranks (--profile's sync phase)
  int64_t activation_bytes = 0;  // MemoryReport::activation_bytes (--report-memory; else 0)
};

struct TrainResult {
  int64_t world_size = 1;
  int64_t rank = 0;
  int64_t threads = 0;
  int64_t samples = 0;          // training samples processed by all ranks, all epochs
  double samples_per_s = 0.0;   // global: all ranks' samples per second
  double train_s = 0.0;         // all epochs' training time, evaluation excluded
  double test_acc = 0.0;        // after the last epoch (NaN: not measured, see Metric)
  double test_loss = NAN;       // language model or Metric::kNone: after the last epoch
  double perplexity = NAN;
  // The data's own figures (text: padding_fraction, vocab_size, unigram_perplexity), averaged
  // over the ranks; in the summary after the documented keys.
  std::vector<std::pair<std::string, double>> figures;
  double final_loss = 0.0;      // mean training loss of the last epoch
  double peak_rss_mib = 0.0;
  int64_t steps = 0;            // optimizer steps since the start of training (a resumed run counts on)
  int64_t skipped_steps = 0;    // of those, skipped for a non-finite loss or gradient
  bool stopped = false;         // ended early by TrainerOptions::stop_requested, at step `steps`
  int64_t param_bytes = 0;      // this rank's model parameters
  int64_t grad_bytes = 0;       // their gradients (and the fp32 masters' at O2)
  int64_t optim_bytes = 0;      // optimizer state (momentum, Adam moments), and fp32 master weights at O2
  int64_t sent_bytes_per_step = 0;  // this rank's collectives per optimizer step (Note [Counting bytes on the wire])
  std::vector<RankFigures> ranks;  // every rank's, on rank 0 of a run of several ranks; else empty
  std::string profile;          // --profile's table, "" without it
  std::vector<double> step_losses;  // every optimizer step's loss (mean over its samples), in order
  std::vector<EpochResult> epochs;

  // The one-line summary `lockstep train` prints last:
  // {"world_size":1,"samples_per_s":..,"train_s":..,"test_acc":..,"final_loss":..,"peak_rss_mib":..,
  //  "param_bytes":..,"grad_bytes":..,"optim_bytes":..,"sent_bytes_per_step":..,"steps":..,"skipped_steps":..};
  // a language model has "test_loss" and "perplexity" after "test_acc" (null), a run measured by
  // its loss only (Metric::kNone) "test_loss"; then figures; then,
  // when `ranks` is set, "ranks":[{"rank":0,"peak_rss_mib":..,"step_ms":..,"sync_ms":..,
  // "activation_bytes":..}, ...]
  std::string summary_json() const;
};

}  // namespace lockstep::train
