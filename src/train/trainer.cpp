#include "lockstep/train/trainer.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "lockstep/core/process.h"
#include "lockstep/core/world.h"
#include "lockstep/data/distributed_sampler.h"
#include "lockstep/dist/process_group.h"
#include "lockstep/log/progress.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/models/zoo.h"
#include "lockstep/parallel/distributed_data_parallel.h"

namespace lockstep::train {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kEvalBatch = 200;
constexpr int64_t kSyntheticTrainSize = 10000;
constexpr int64_t kSyntheticTestSize = 2000;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double round_to(double x, int digits) {
  const double scale = std::pow(10.0, digits);
  return std::round(x * scale) / scale;
}

struct Splits {
  data::Dataset train, test;
};

Splits load_data(const TrainOptions& o) {
  if (o.data() == "synthetic") {
    auto base = data::SyntheticOptions().shape(models::input_shape(o.model()));
    const int64_t train_size = o.limit() > 0 ? o.limit() : kSyntheticTrainSize;
    // Distinct seeds so the test split is not a copy of the training split.
    return {data::make_synthetic(base.size(train_size).seed(o.seed())),
            data::make_synthetic(base.size(kSyntheticTestSize).seed(o.seed() + 1))};
  }
  Splits s{data::load_fashion_mnist(o.data_dir(), data::Split::kTrain).take(o.limit()),
           data::load_fashion_mnist(o.data_dir(), data::Split::kTest)};
  const auto want = models::input_shape(o.model());
  const auto have = s.train.images.sizes().slice(1);
  TORCH_CHECK_VALUE(have.equals(want), "model '", o.model(), "' expects images of shape ", c10::IntArrayRef(want),
                    " but ", o.data(), " has ", have, "; use --data synthetic for this model");
  return s;
}

// Fraction of `ds` that `model` classifies correctly, in eval mode and without autograd. With a
// group, each rank scores a contiguous share of `ds` and the counts are summed.
double evaluate(models::Classifier& model, const data::Dataset& ds, dist::ProcessGroup* group) {
  torch::NoGradGuard no_grad;
  model.eval();
  const int64_t rank = group ? group->rank() : 0, world = group ? group->size() : 1;
  const int64_t begin = ds.size() * rank / world, end = ds.size() * (rank + 1) / world;
  int64_t correct = 0;
  for (int64_t start = begin; start < end; start += kEvalBatch) {
    auto idx = torch::arange(start, std::min(start + kEvalBatch, end), torch::kInt64);
    auto [x, y] = ds.batch(idx);
    correct += model.forward(x).argmax(1).eq(y).sum().item<int64_t>();
  }
  model.train();
  torch::Tensor counts = torch::tensor({correct}, torch::kInt64);
  if (group) group->all_reduce(counts);
  return static_cast<double>(counts.item<int64_t>()) / static_cast<double>(ds.size());
}

}  // namespace

void TrainOptions::validate() const {
  models::check_model_name(model());
  TORCH_CHECK_VALUE(data() == "fashion-mnist" || data() == "synthetic", "unknown data '", data(),
                    "'; choose fashion-mnist or synthetic");
  TORCH_CHECK_VALUE(limit() >= 0, "limit=", limit(), " must be >= 0 (0 means all samples)");
  TORCH_CHECK_VALUE(epochs() >= 1, "epochs=", epochs(), " must be at least 1");
  TORCH_CHECK_VALUE(batch_size() >= 1, "batch size ", batch_size(), " must be at least 1");
  TORCH_CHECK_VALUE(std::isfinite(lr()) && lr() >= 0, "learning rate ", lr(), " must be >= 0");
  TORCH_CHECK_VALUE(std::isfinite(momentum()) && momentum() >= 0, "momentum ", momentum(),
                    " must be >= 0");
  TORCH_CHECK_VALUE(std::isfinite(weight_decay()) && weight_decay() >= 0, "weight decay ",
                    weight_decay(), " must be >= 0");
  TORCH_CHECK_VALUE(threads() >= 0, "threads=", threads(), " must be >= 0 (0 means automatic)");
}

std::string TrainResult::summary_json() const {
  nlohmann::ordered_json j;
  j["world_size"] = world_size;
  j["samples_per_s"] = round_to(samples_per_s, 1);
  j["train_s"] = round_to(train_s, 3);
  j["test_acc"] = round_to(test_acc, 4);
  j["final_loss"] = round_to(final_loss, 6);
  j["peak_rss_mib"] = round_to(peak_rss_mib, 1);
  return j.dump();
}

TrainResult train(const TrainOptions& options) {
  options.validate();
  TrainResult result;
  result.threads = options.threads() > 0 ? options.threads() : default_intra_op_threads();
  torch::set_num_threads(static_cast<int>(result.threads));
  torch::manual_seed(options.seed());

  // Under a launcher (WORLD_SIZE > 1) every rank trains a replica through DDP on its share of each
  // global batch; rank 0 alone prints and writes files.
  const WorldInfo world = world_from_env();
  std::unique_ptr<dist::ProcessGroup> group;
  if (world.world_size > 1) group = dist::init_process_group();
  result.world_size = world.world_size;
  result.rank = world.rank;
  const bool leader = world.rank == 0;
  const bool show_progress = options.progress() && leader;

  Splits data = load_data(options);
  std::shared_ptr<models::Classifier> model = models::make_model(options.model(), data.train.num_classes);
  model->train();
  std::unique_ptr<parallel::DistributedDataParallel> ddp;
  if (group) ddp = std::make_unique<parallel::DistributedDataParallel>(model, *group);
  auto forward = [&](const torch::Tensor& x) { return ddp ? ddp->forward(x) : model->forward(x); };
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(options.lr())
                                                       .momentum(options.momentum())
                                                       .weight_decay(options.weight_decay()));
  data::DistributedSampler sampler(data.train.size(), data::DistributedSamplerOptions()
                                                          .num_replicas(world.world_size)
                                                          .rank(world.rank)
                                                          .seed(options.seed()));
  const bool terminal = stdout_is_terminal();

  for (int64_t epoch = 0; epoch < options.epochs(); ++epoch) {
    sampler.set_epoch(epoch);
    const torch::Tensor order = sampler.indices();  // (num_samples)
    const int64_t n = order.size(0);
    log::Progress progress(std::cout, terminal,
                           "epoch " + std::to_string(epoch + 1) + "/" + std::to_string(options.epochs()), n);
    double loss_sum = 0.0;
    int64_t steps = 0;
    const auto t0 = Clock::now();
    for (int64_t start = 0; start < n; start += options.batch_size()) {
      const int64_t b = std::min(options.batch_size(), n - start);
      auto [x, y] = data.train.batch(order.narrow(0, start, b));  // x (B, C, H, W), y (B)
      optimizer.zero_grad();
      torch::Tensor loss = torch::nn::functional::cross_entropy(forward(x), y);
      loss.backward();
      optimizer.step();
      const double l = loss.item<double>();
      result.step_losses.push_back(l);
      loss_sum += l;
      ++steps;
      if (show_progress) progress.update(start + b, l);
    }
    if (show_progress) progress.finish();
    EpochResult er;
    er.epoch = epoch + 1;
    er.train_s = seconds_since(t0);
    er.train_loss = loss_sum / static_cast<double>(steps);
    if (group) er.train_loss = group->average(er.train_loss);
    er.test_acc = evaluate(*model, data.test, group.get());
    result.train_s += er.train_s;
    result.samples += n * world.world_size;  // every rank processes the same count (padding)
    result.epochs.push_back(er);
    if (show_progress) {
      std::printf("epoch %lld/%lld done: train_loss %.4f test_acc %.4f (%.2f s)\n",
                  static_cast<long long>(er.epoch), static_cast<long long>(options.epochs()),
                  er.train_loss, er.test_acc, er.train_s);
      std::fflush(stdout);
    }
  }
  result.samples_per_s = static_cast<double>(result.samples) / result.train_s;
  result.test_acc = result.epochs.back().test_acc;
  result.final_loss = result.epochs.back().train_loss;
  if (group) result.samples_per_s = group->average(result.samples_per_s);  // smooths rank jitter
  if (!options.save_model().empty() && leader) models::save_state_dict(*model, options.save_model());
  if (group) group->barrier();  // nobody exits (tearing the group down) while rank 0 still writes
  result.peak_rss_mib = peak_rss_mib();
  return result;
}

}  // namespace lockstep::train
