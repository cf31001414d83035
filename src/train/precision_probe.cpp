#include "precision_probe.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "lockstep/parallel/local_strategy.h"

namespace lockstep::train {
namespace {

// Note [Choosing the precision by timing it]
// bf16 autocast pays on a CPU whose oneDNN kernels for it beat fp32's, and loses elsewhere: the
// convnet trained 2.4x faster in bf16 on the AMD EPYC machines of 2026-11 and 13% slower on an
// Intel Xeon with AVX512-BF16 (issue 35). Which kind a CPU is cannot be read from its flags, as
// the kernels oneDNN picks depend on its version, the shapes and the memory formats, so --precision
// auto measures: the local strategy runs the run's model on the run's first batch, one warm-up
// step (oneDNN builds its primitives, autocast fills its cache) and then kRounds rounds of
// kSteps steps, fp32 and bf16 alternating so that a change in the machine's load meets both, and
// the median step of each decides. With several ranks, train() averages the ranks' medians, so
// every rank picks the same. It costs 2 x (1 + kRounds x kSteps) steps at the start.
constexpr int kRounds = 3;
constexpr int kSteps = 2;

using Clock = std::chrono::steady_clock;

struct Timed {
  std::unique_ptr<parallel::LocalStrategy> strategy;
  std::vector<double> ms;
};

Timed make(const ReferenceData& data, const TrainOptions& o, Precision precision) {
  TrainOptions run = o;
  resolve_precision(run, precision);
  auto model = data.make_model(nullptr, /*initial_weights=*/false);
  model->train();
  Timed t;
  t.strategy = std::make_unique<parallel::LocalStrategy>(
      torch::nn::AnyModule(model), run.strategy_options(nullptr).reporter([](ReportKind, const std::string&) {}));
  return t;
}

void steps(Timed& t, const std::vector<parallel::MicroBatch>& batch, const parallel::LossFunction& loss, int n,
           bool record) {
  for (int i = 0; i < n; ++i) {
    const auto start = Clock::now();
    t.strategy->forward_backward(batch, loss);
    t.strategy->step();
    if (record) t.ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

void resolve_precision(TrainOptions& o, Precision precision) {
  o.precision(precision);
  if (precision == Precision::kFp32) o.opt_level(c10::nullopt);
}

PrecisionTiming time_precisions(const ReferenceData& data, const TrainOptions& o) {
  const auto batches = data.train->batches(EpochBatches{0, 1, 0, o.trainer().batch_size(), o.trainer().seed()});
  TORCH_CHECK(!batches.empty(), "--precision auto: the training data has no batch to time");
  Example example = data.train->get_batch(batches.front());
  const std::vector<parallel::MicroBatch> batch{{example.data, example.target, 1.0}};
  Timed fp32 = make(data, o, Precision::kFp32), bf16 = make(data, o, Precision::kBf16);
  steps(fp32, batch, data.loss, 1, false);
  steps(bf16, batch, data.loss, 1, false);
  for (int round = 0; round < kRounds; ++round) {
    steps(fp32, batch, data.loss, kSteps, true);
    steps(bf16, batch, data.loss, kSteps, true);
  }
  return {median(fp32.ms), median(bf16.ms)};
}

}  // namespace lockstep::train
