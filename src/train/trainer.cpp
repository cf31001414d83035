#include "lockstep/train/trainer.h"

#include <c10/util/StringUtil.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <iostream>
#include <limits>

#include "lockstep/amp/opt_level.h"
#include "lockstep/core/process.h"
#include "lockstep/core/world.h"
#include "lockstep/data/distributed_sampler.h"
#include "lockstep/dist/process_group.h"
#include "lockstep/log/progress.h"
#include "lockstep/log/tensorboard.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/models/zoo.h"
#include "lockstep/parallel/distributed_data_parallel.h"
#include "lockstep/train/checkpoint.h"
#include "lockstep/train/lr_schedule.h"
#include "lockstep/train/step_profiler.h"

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

amp::OptLevel resolved_opt_level(const TrainOptions& o) {
  if (!o.opt_level().empty()) return amp::parse_opt_level(o.opt_level());
  return o.precision() == "fp32" ? amp::OptLevel::kO0 : amp::OptLevel::kO1;
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

// Fraction of `ds` that `model` classifies correctly through `forward` (its precision's forward),
// in eval mode and without autograd. With a group, each rank scores a contiguous share of `ds`
// and the counts are summed.
double evaluate(models::Classifier& model, const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                const data::Dataset& ds, dist::ProcessGroup* group) {
  torch::NoGradGuard no_grad;
  model.eval();
  const int64_t rank = group ? group->rank() : 0, world = group ? group->size() : 1;
  const int64_t begin = ds.size() * rank / world, end = ds.size() * (rank + 1) / world;
  int64_t correct = 0;
  for (int64_t start = begin; start < end; start += kEvalBatch) {
    auto idx = torch::arange(start, std::min(start + kEvalBatch, end), torch::kInt64);
    auto [x, y] = ds.batch(idx);
    correct += forward(x).argmax(1).eq(y).sum().item<int64_t>();
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
  TORCH_CHECK_VALUE(save_every() >= 0, "save-every=", save_every(), " must be >= 0 (0: at epoch ends only)");
  TORCH_CHECK_VALUE(keep_last() >= 0, "keep-last=", keep_last(), " must be >= 0 (0 keeps all)");
  TORCH_CHECK_VALUE(checkpoint_dir().empty() ? save_every() == 0 && keep_last() == 0 : true,
                    "--save-every and --keep-last need --checkpoint-dir");
  TORCH_CHECK_VALUE(resume() != "latest" || !checkpoint_dir().empty(),
                    "--resume latest needs --checkpoint-dir (where to look for the latest checkpoint)");
  TORCH_CHECK_VALUE(resume().empty() || init_weights().empty(), "--resume '", resume(),
                    "' and --init-weights '", init_weights(),
                    "' both set: a resumed run takes its weights from the checkpoint; pass one of them");
  TORCH_CHECK_VALUE(accum_steps() >= 1, "accum-steps=", accum_steps(), " must be at least 1");
  TORCH_CHECK_VALUE(std::isfinite(clip_value()) && clip_value() >= 0, "clip-value ", clip_value(),
                    " must be >= 0 (0: no clipping)");
  TORCH_CHECK_VALUE(std::isfinite(clip_norm()) && clip_norm() >= 0, "clip-norm ", clip_norm(),
                    " must be >= 0 (0: no clipping)");
  TORCH_CHECK_VALUE(max_skipped_steps() >= 1, "max-skipped-steps=", max_skipped_steps(), " must be at least 1");
  TORCH_CHECK_VALUE(log_every() >= 1, "log-every=", log_every(), " must be at least 1");
  TORCH_CHECK_VALUE(warmup_steps() >= 0, "warmup-steps=", warmup_steps(), " must be >= 0");
  const auto& rules = lr_scale_rule_names();
  TORCH_CHECK_VALUE(std::find(rules.begin(), rules.end(), scale_lr()) != rules.end(), "unknown --scale-lr '",
                    scale_lr(), "'; choose ", c10::Join(", ", rules));
  TORCH_CHECK_VALUE(precision() == "fp32" || precision() == "bf16" || precision() == "fp16", "unknown precision '",
                    precision(), "'; choose fp32, bf16 or fp16");
  const amp::OptLevel level = resolved_opt_level(*this);
  TORCH_CHECK_VALUE(precision() != "fp32" || level == amp::OptLevel::kO0, "--opt-level ", opt_level(),
                    " needs a half precision: add --precision bf16 (or fp16)");
  TORCH_CHECK_VALUE(precision() == "fp32" || level != amp::OptLevel::kO0, "--precision ", precision(),
                    " with --opt-level O0 would train in fp32; use O1, O2 or O3");
  if (!loss_scale().empty() && loss_scale() != "dynamic" && loss_scale() != "none") {
    char* end = nullptr;
    const double v = std::strtod(loss_scale().c_str(), &end);
    TORCH_CHECK_VALUE(*end == '\0' && std::isfinite(v) && v > 0, "--loss-scale '", loss_scale(),
                      "' is not 'dynamic', 'none' or a positive number");
  }
}

std::string TrainResult::summary_json() const {
  nlohmann::ordered_json j;
  j["world_size"] = world_size;
  j["samples_per_s"] = round_to(samples_per_s, 1);
  j["train_s"] = round_to(train_s, 3);
  j["test_acc"] = round_to(test_acc, 4);
  j["final_loss"] = round_to(final_loss, 6);
  j["peak_rss_mib"] = round_to(peak_rss_mib, 1);
  j["param_bytes"] = param_bytes;
  j["grad_bytes"] = grad_bytes;
  j["optim_bytes"] = optim_bytes;
  j["steps"] = steps;
  j["skipped_steps"] = skipped_steps;
  return j.dump();
}

namespace {

// One training run: the model, its optimizer and data, where training stands, and what it
// reports. train() below drives it epoch by epoch.
class TrainingRun {
 public:
  explicit TrainingRun(const TrainOptions& o) : o_(o), world_(world_from_env()) {
    result_.threads = o.threads() > 0 ? o.threads() : default_intra_op_threads();
    torch::set_num_threads(static_cast<int>(result_.threads));
    torch::manual_seed(o.seed());
    if (o.deterministic()) at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);

    // Under a launcher (WORLD_SIZE > 1) every rank trains a replica through DDP on its share of
    // each global batch; rank 0 alone prints and writes files.
    if (world_.world_size > 1) group_ = dist::init_process_group();
    result_.world_size = world_.world_size;
    result_.rank = world_.rank;
    leader_ = world_.rank == 0;

    data_ = load_data(o);
    sampler_ = std::make_unique<data::DistributedSampler>(
        data_.train.size(),
        data::DistributedSamplerOptions().num_replicas(world_.world_size).rank(world_.rank).seed(o.seed()));
    model_ = models::make_model(o.model(), data_.train.num_classes);
    if (!o.init_weights().empty()) models::load_state_dict_file(*model_, o.init_weights());
    model_->train();
    optimizer_ = std::make_unique<torch::optim::SGD>(
        model_->parameters(),
        torch::optim::SGDOptions(o.lr()).momentum(o.momentum()).weight_decay(o.weight_decay()));
    schedule_ = std::make_unique<LrSchedule>(schedule_options());

    // Order matters: checkpoint weights (fp32: O2's masters) before amp::initialize converts the
    // model; optimizer and scaler state after it; DDP last, over the converted parameters.
    std::optional<Checkpoint> checkpoint = checkpoint_to_resume();
    if (checkpoint) models::load_state_dict(*model_, checkpoint->model, "checkpoint '" + resumed_from_ + "' model");
    amp_ = std::make_unique<amp::Amp>(amp::initialize(*model_, *optimizer_, resolved_opt_level(o), amp_options()));
    if (checkpoint) restore(*checkpoint);
    if (group_) check_same_position_on_all_ranks();
    if (group_) ddp_ = std::make_unique<parallel::DistributedDataParallel>(model_, *group_);

    if (leader_) open_logs();
    profiler_ = std::make_unique<StepProfiler>(StepProfilerOptions().enabled(o.profile() || !o.trace().empty()));
  }

  TrainResult run() {
    for (; pos_.epoch < o_.epochs(); pos_ = pos_.next_epoch()) {
      sampler_->set_epoch(pos_.epoch);
      train_epoch(sampler_->indices());
    }
    result_.samples_per_s = static_cast<double>(result_.samples) / result_.train_s;
    if (group_) result_.samples_per_s = group_->average(result_.samples_per_s);  // smooths rank jitter
    result_.test_acc = result_.epochs.back().test_acc;
    result_.final_loss = result_.epochs.back().train_loss;
    result_.steps = pos_.step;
    result_.skipped_steps = pos_.skipped_steps;
    account_memory();
    if (profiler_->enabled()) result_.profile = profiler_->report();
    if (leader_) {
      if (!o_.trace().empty()) profiler_->write_chrome_trace(o_.trace(), world_.rank);
      if (!o_.save_model().empty()) models::save_state_dict(full_precision_weights(), o_.save_model());
      close_tensorboard();
    }
    if (group_) group_->barrier();  // nobody exits (tearing the group down) while rank 0 still writes
    result_.peak_rss_mib = peak_rss_mib();
    return result_;
  }

 private:
  // Trains on this rank's share of the epoch, `order` (num_samples), from pos_.micro_batch on.
  void train_epoch(const torch::Tensor& order) {
    const int64_t n = order.size(0), b = o_.batch_size(), k = o_.accum_steps();
    const int64_t micro_batches = (n + b - 1) / b;
    const bool show = o_.progress() && leader_;
    log::Progress progress(std::cout, stdout_is_terminal(),
                           "epoch " + std::to_string(pos_.epoch + 1) + "/" + std::to_string(o_.epochs()), n);
    const int64_t first = pos_.micro_batch;
    const auto t0 = Clock::now();
    while (pos_.micro_batch < micro_batches) {
      // Groups of k micro-batches start at multiples of k, so a resumed epoch steps where the
      // original did.
      const int64_t begin = pos_.micro_batch, end = std::min(begin + k, micro_batches);
      const int64_t sample_end = std::min(end * b, n);
      const double loss = step(order, begin, end, sample_end - begin * b);
      pos_.micro_batch = end;
      {
        auto phase = profiler_->scope(Phase::kLogging);
        if (show) progress.update(sample_end, loss);
        if (pos_.step % o_.log_every() == 0)
          log_step(loss, static_cast<double>((sample_end - first * b) * world_.world_size) / seconds_since(t0));
      }
      profiler_->end_step();
      if (o_.save_every() > 0 && pos_.step % o_.save_every() == 0 && end < micro_batches) save_checkpoint(pos_);
    }
    if (show) progress.finish();

    EpochResult er;
    er.epoch = pos_.epoch + 1;
    er.train_s = seconds_since(t0);
    er.train_loss = pos_.epoch_steps > 0 ? pos_.epoch_loss_sum / static_cast<double>(pos_.epoch_steps) : NAN;
    if (group_) er.train_loss = group_->average(er.train_loss);
    er.test_acc = evaluate(*model_, [this](const torch::Tensor& x) { return forward(x); },
                           data_.test, group_.get());
    result_.train_s += er.train_s;
    result_.samples += (n - std::min(n, first * b)) * world_.world_size;  // every rank has n (padding)
    result_.epochs.push_back(er);
    if (show) {
      std::printf("epoch %lld/%lld done: train_loss %.4f test_acc %.4f (%.2f s)\n",
                  static_cast<long long>(er.epoch), static_cast<long long>(o_.epochs()), er.train_loss,
                  er.test_acc, er.train_s);
      std::fflush(stdout);
    }
    log_event({{"event", "epoch"}, {"epoch", er.epoch}, {"step", pos_.step}, {"train_loss", er.train_loss},
               {"test_acc", er.test_acc}, {"train_s", er.train_s}});
    log_scalar("test/accuracy", er.test_acc);
    if (!o_.checkpoint_dir().empty()) save_checkpoint(pos_.next_epoch());  // this epoch is done
  }

  // One optimizer step over micro-batches [begin, end) of `order`, `samples` samples in all.
  // Returns the step's loss: the mean over those samples, as one batch of that size would give.
  double step(const torch::Tensor& order, int64_t begin, int64_t end, int64_t samples) {
    amp_->zero_grad();
    double loss_sum = 0.0;
    for (int64_t i = begin; i < end; ++i) {
      if (ddp_ && i + 1 < end) {
        auto guard = ddp_->no_sync();  // held over forward and backward: accumulate locally
        loss_sum += micro_batch(order, i, samples, loss_sum, /*last=*/false);
      } else {
        loss_sum += micro_batch(order, i, samples, loss_sum, /*last=*/i + 1 == end);
      }
    }

    auto phase = profiler_->scope(Phase::kOptimizer);
    // With loss scaling the scaler finds non-finite gradients itself (and backs the scale off).
    bool stepped = false;
    if (all_ranks_finite(/*check_gradients=*/!amp_->grad_scaler().is_enabled())) {
      if (o_.clip_value() > 0 || o_.clip_norm() > 0) {
        amp_->unscale_();  // clip true gradients, in fp32 at O2
        if (o_.clip_value() > 0) torch::nn::utils::clip_grad_value_(amp_->master_params(), o_.clip_value());
        if (o_.clip_norm() > 0) torch::nn::utils::clip_grad_norm_(amp_->master_params(), o_.clip_norm());
      }
      schedule_->apply(*optimizer_, pos_.step);
      stepped = amp_->step();
      if (static_loss_scale_ > 0) {
        amp_->grad_scaler().update(static_loss_scale_);
      } else {
        amp_->update();
      }
      if (!stepped) count_skip("non-finite gradient (loss scale overflow)", "");
    }
    if (stepped) {
      pos_.consecutive_skips = 0;
      pos_.epoch_loss_sum += loss_sum;
      ++pos_.epoch_steps;
    }
    ++pos_.step;
    result_.step_losses.push_back(loss_sum);
    return loss_sum;
  }

  // Forward and backward of micro-batch `i` of `order`; returns its loss, weighted by its share of
  // the step's `samples` so the accumulated gradient is that of the mean over all of them.
  // `loss_before` is the step's loss so far; the `last` micro-batch starts the loss vote.
  double micro_batch(const torch::Tensor& order, int64_t i, int64_t samples, double loss_before, bool last) {
    const int64_t b = o_.batch_size(), size = std::min(b, order.size(0) - i * b);
    torch::Tensor x, y, out, loss;  // x (B, C, H, W), y (B)
    {
      auto phase = profiler_->scope(Phase::kData);
      std::tie(x, y) = data_.train.batch(order.narrow(0, i * b, size));
    }
    {
      auto phase = profiler_->scope(Phase::kForward);
      auto autocast = amp_->autocast();
      out = forward(x);
    }
    {
      auto phase = profiler_->scope(Phase::kLoss);
      auto autocast = amp_->autocast();
      loss = torch::nn::functional::cross_entropy(out, y) * (static_cast<double>(size) / static_cast<double>(samples));
    }
    double value = loss.item<double>();
    if (last) {
      // The injected NaN spoils only the loss value, not the gradients: only the vote can then
      // make the other ranks skip too.
      if (pos_.step == o_.inject_nan_step() && world_.rank == o_.inject_nan_rank())
        value = std::numeric_limits<double>::quiet_NaN();
      start_loss_vote(loss_before + value);  // travels while the last backward runs
    }
    {
      auto phase = profiler_->scope(Phase::kBackward);
      amp_->scale_loss(loss).backward();
    }
    // DDP's final wait for the gradient all-reduce runs at the end of the last backward.
    if (ddp_ && last) profiler_->split_tail(Phase::kSync, std::chrono::nanoseconds(ddp_->reducer_stats().finalize_ns));
    return value;
  }

  // The model's output for `x` (fp32), in the opt level's precision: O2/O3 cast the input to half.
  // Evaluation uses it without autocast, so at O1 test accuracy is measured in fp32, as the
  // Python peer does.
  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor in = amp_->cast_input(x);
    return amp_->cast_output(ddp_ ? ddp_->forward(in) : model_->forward(in));
  }

  // Note [Agreeing on non-finite steps]: a step whose loss or gradient is NaN or Inf on any rank
  // is skipped on every rank, or the replicas would diverge. The losses are voted on by one small
  // all-reduce (a flag per rank), started before the last backward so it travels while backward
  // runs. The gradients need no vote: after DDP's all-reduce every rank holds the same averaged
  // gradients, and a non-finite gradient on any rank makes the average non-finite everywhere.
  void start_loss_vote(double loss) {
    vote_ = torch::zeros({world_.world_size}, torch::kFloat32);  // 1: non-finite loss on that rank
    vote_[world_.rank] = std::isfinite(loss) ? 0.0f : 1.0f;
    if (group_) vote_work_ = group_->all_reduce_async(vote_);
  }

  // Whether this step may go ahead (see Note [Agreeing on non-finite steps]); a skipped step is
  // counted and logged, and max_skipped_steps in a row abort the run.
  bool all_ranks_finite(bool check_gradients) {
    if (vote_work_) group_->wait(vote_work_, "the non-finite loss vote");
    vote_work_.reset();
    bool gradients_finite = true;
    for (const auto& p : model_->parameters())
      if (gradients_finite && check_gradients && p.grad().defined())
        gradients_finite = torch::isfinite(p.grad()).all().item<bool>();
    if (vote_.sum().item<float>() == 0.0f) {
      if (gradients_finite) return true;
      count_skip("non-finite gradient", world_.world_size > 1 ? " (averaged over ranks)" : "");
      return false;
    }
    std::string ranks;
    for (int64_t r = 0; r < world_.world_size; ++r)
      if (vote_[r].item<float>() > 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    count_skip("non-finite loss", " on rank " + ranks);
    return false;
  }

  void count_skip(const std::string& why, const std::string& where) {
    ++pos_.skipped_steps;
    ++pos_.consecutive_skips;
    if (leader_) {
      std::fprintf(stderr, "lockstep: step %lld skipped: %s%s (%lld skipped so far)\n",
                   static_cast<long long>(pos_.step + 1), why.c_str(), where.c_str(),
                   static_cast<long long>(pos_.skipped_steps));
      log_event({{"event", "skipped_step"}, {"epoch", pos_.epoch + 1}, {"step", pos_.step + 1}, {"reason", why + where},
                 {"skipped_steps", pos_.skipped_steps}});
    }
    TORCH_CHECK(pos_.consecutive_skips < o_.max_skipped_steps(), "rank ", world_.rank, ": aborting: ", pos_.consecutive_skips,
                " consecutive steps had a non-finite loss or gradient (the last, step ", pos_.step + 1, ": ", why,
                where, "); lower --lr, set --clip-norm, or check the data. --max-skipped-steps=",
                o_.max_skipped_steps(), " sets how many in a row are tolerated");
  }

  // --- logging (rank 0) ------------------------------------------------------------------------

  void open_logs() {
    if (!o_.log_jsonl().empty()) {
      jsonl_.open(o_.log_jsonl(), resumed_from_.empty() ? std::ios::trunc : std::ios::app);
      TORCH_CHECK(jsonl_, "cannot open --log-jsonl file '", o_.log_jsonl(), "': ", std::strerror(errno));
    }
    if (!o_.tensorboard().empty()) tensorboard_ = std::make_unique<log::SummaryWriter>(o_.tensorboard());
  }

  void log_step(double loss, double samples_per_s) {
    if (!leader_) return;
    const double lr = optimizer_->param_groups()[0].options().get_lr();
    nlohmann::ordered_json j{{"event", "step"}, {"epoch", pos_.epoch + 1}, {"step", pos_.step}, {"loss", loss},
                             {"lr", lr}, {"samples_per_s", samples_per_s}, {"skipped_steps", pos_.skipped_steps}};
    if (amp_->grad_scaler().is_enabled()) j["loss_scale"] = amp_->grad_scaler().get_scale();
    log_event(j);
    log_scalar("train/loss", loss);
    log_scalar("train/lr", lr);
    log_scalar("train/samples_per_s", samples_per_s);
    if (amp_->grad_scaler().is_enabled()) log_scalar("amp/loss_scale", amp_->grad_scaler().get_scale());
  }

  void log_event(const nlohmann::ordered_json& j) {
    if (leader_ && jsonl_.is_open()) jsonl_ << j.dump() << '\n' << std::flush;
  }

  // A TensorBoard scalar at the current step. A failed write (a full disk) stops TensorBoard
  // logging, with one error message, rather than the run.
  void log_scalar(const std::string& tag, double value) {
    if (!leader_ || !tensorboard_) return;
    try {
      tensorboard_->add_scalar(tag, value, pos_.step);
    } catch (const c10::Error& e) {
      std::fprintf(stderr, "lockstep: error: TensorBoard logging stopped: %s\n", e.what_without_backtrace());
      tensorboard_.reset();
    }
  }

  void close_tensorboard() {
    if (!tensorboard_) return;
    try {
      tensorboard_->close();
    } catch (const c10::Error& e) {
      std::fprintf(stderr, "lockstep: error: TensorBoard logging stopped: %s\n", e.what_without_backtrace());
    }
    tensorboard_.reset();
  }

  // --- checkpoints -----------------------------------------------------------------------------

  // The model's state dict with O2's half parameters replaced by their fp32 masters, so a
  // checkpoint resumes exactly and --save-model files are fp32 as usual. O3 has no masters: its
  // files hold the half weights it trains.
  c10::Dict<std::string, torch::Tensor> full_precision_weights() const {
    c10::Dict<std::string, torch::Tensor> weights = models::state_dict_to_dict(*model_);
    const auto params = model_->named_parameters();
    for (size_t i = 0; i < params.size(); ++i)
      weights.insert_or_assign(params[i].key(), amp_->master_params()[i].detach().cpu());
    return weights;
  }

  // Everything a resumed run needs to continue exactly from `at`. Collective: every rank
  // contributes its RNG state; rank 0 writes and the others wait for it.
  void save_checkpoint(const TrainingPosition& at) {
    torch::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();  // (5056) uint8
    std::vector<torch::Tensor> rngs = group_ ? group_->all_gather(rng) : std::vector<torch::Tensor>{rng};
    if (leader_) {
      Checkpoint c;
      c.position = at;
      c.run = run_settings();
      c.model = full_precision_weights();
      c.optimizer = sgd_state_dict(*optimizer_);
      c.scaler = amp_->grad_scaler().state_dict();
      c.rng = rngs;
      const std::string path = checkpoint_path(o_.checkpoint_dir(), at.step);
      try {
        std::filesystem::create_directories(o_.checkpoint_dir());
        train::save_checkpoint(c, path);
        remove_old_checkpoints(o_.checkpoint_dir(), o_.keep_last());
      } catch (const std::exception& e) {
        const auto last = latest_checkpoint(o_.checkpoint_dir());
        std::fprintf(stderr, "lockstep: error: checkpoint at step %lld not saved: %s; training goes on, the last "
                     "good checkpoint is %s\n", static_cast<long long>(at.step), error_text(e).c_str(),
                     last ? ("'" + *last + "'").c_str() : "(none)");
      }
    }
    if (group_) group_->barrier();
  }

  static std::string error_text(const std::exception& e) {
    auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    return c10_error ? c10_error->what_without_backtrace() : e.what();
  }

  // What must be equal for a checkpoint to continue this run exactly (data order, step layout,
  // precision).
  c10::impl::GenericDict run_settings() const {
    c10::impl::GenericDict run = string_dict();
    run.insert("model", o_.model());
    run.insert("data", o_.data());
    run.insert("limit", o_.limit());
    run.insert("world_size", world_.world_size);
    run.insert("batch_size", o_.batch_size());
    run.insert("accum_steps", o_.accum_steps());
    run.insert("seed", static_cast<int64_t>(o_.seed()));
    run.insert("precision", o_.precision());
    run.insert("opt_level", amp::to_string(resolved_opt_level(o_)));
    run.insert("loss_scale", amp_loss_scale());
    return run;
  }

  // The checkpoint --resume names, checked against this run; none when not resuming (or when
  // "latest" finds no checkpoint yet: a first start under a restart loop).
  std::optional<Checkpoint> checkpoint_to_resume() {
    if (o_.resume().empty()) return std::nullopt;
    std::string path = o_.resume();
    if (path == "latest" || std::filesystem::is_directory(path)) {
      const std::string dir = path == "latest" ? o_.checkpoint_dir() : path;
      const auto latest = latest_checkpoint(dir);
      if (!latest && path == "latest") {
        if (leader_) std::printf("no checkpoint in '%s' yet: starting from scratch\n", dir.c_str());
        return std::nullopt;
      }
      TORCH_CHECK_VALUE(latest, "rank ", world_.rank, ": --resume '", path, "': no checkpoint (step-*.pt) in it");
      path = *latest;
    }
    Checkpoint c = load_checkpoint(path);
    check_same_run(c, run_settings(), path);
    TORCH_CHECK_VALUE(c.position.epoch < o_.epochs(), "checkpoint '", path, "' has completed ", c.position.epoch,
                      " epochs and --epochs is ", o_.epochs(), "; --epochs counts from the start of training: pass ",
                      "more than ", c.position.epoch, " to train further");
    resumed_from_ = path;
    return c;
  }

  // Optimizer, loss scaler, RNG and position from `c` (the weights were loaded before amp).
  void restore(const Checkpoint& c) {
    load_sgd_state_dict(*optimizer_, c.optimizer, "checkpoint '" + resumed_from_ + "'");
    if (amp_->grad_scaler().is_enabled()) amp_->grad_scaler().load_state_dict(c.scaler.toGenericDict());
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    {
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(c.rng[world_.rank]);
    }
    pos_ = c.position;
    if (leader_)
      std::printf("resumed from '%s': epoch %lld, step %lld\n", resumed_from_.c_str(),
                  static_cast<long long>(pos_.epoch + 1), static_cast<long long>(pos_.step));
  }

  // Every rank resumes from the same step, or none does: a rank that found another checkpoint
  // (no shared filesystem, a file written in between) would train a different number of steps.
  void check_same_position_on_all_ranks() {
    torch::Tensor steps = torch::tensor({pos_.step, -pos_.step}, torch::kInt64);
    group_->all_reduce(steps, dist::ReduceOp::kMax);
    TORCH_CHECK(steps[0].item<int64_t>() == -steps[1].item<int64_t>(), "rank ", world_.rank, " resumes at step ",
                pos_.step, (resumed_from_.empty() ? " (no checkpoint)" : " from '" + resumed_from_ + "'"),
                " but other ranks resume between steps ", -steps[1].item<int64_t>(), " and ", steps[0].item<int64_t>(),
                ": every rank must see the same checkpoint directory (a shared filesystem across nodes)");
  }

  // --- set-up ----------------------------------------------------------------------------------

  LrScheduleOptions schedule_options() const {
    const int64_t micro_batches = (sampler_->num_samples() + o_.batch_size() - 1) / o_.batch_size();
    const int64_t steps_per_epoch = (micro_batches + o_.accum_steps() - 1) / o_.accum_steps();
    return LrScheduleOptions(scale_lr(o_.lr(), o_.scale_lr(), world_.world_size * o_.accum_steps()))
        .kind(o_.lr_schedule())
        .total_steps(steps_per_epoch * o_.epochs())
        .warmup_steps(o_.warmup_steps())
        .step_size(o_.lr_step_size())
        .gamma(o_.lr_gamma())
        .milestones(o_.lr_milestones());
  }

  // --loss-scale with its default filled in: bf16 has fp32's exponent range, so its gradients need
  // no scaling (torch.autocast recipes use no GradScaler with bf16); fp16 takes the opt level's
  // default, as in Apex ("" here).
  std::string amp_loss_scale() const {
    if (!o_.loss_scale().empty()) return o_.loss_scale();
    return o_.precision() == "bf16" ? "none" : "";
  }

  amp::AmpOptions amp_options() {
    amp::AmpOptions a = amp::AmpOptions().group(group_.get());
    a.dtype(o_.precision() == "fp16" ? torch::kHalf : torch::kBFloat16);
    const std::string scale = amp_loss_scale();
    if (scale == "none") {
      a.loss_scale(amp::GradScalerOptions().enabled(false));
    } else if (scale == "dynamic") {
      a.loss_scale(amp::GradScalerOptions());
    } else if (!scale.empty()) {
      static_loss_scale_ = std::stod(o_.loss_scale());  // validate() checked it
      a.loss_scale(amp::GradScalerOptions().init_scale(static_loss_scale_));
    }
    return a;
  }

  // Bytes this rank holds for the model, its gradients and the optimizer (see TrainResult).
  void account_memory() {
    auto bytes = [](const torch::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; };
    const auto params = model_->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      result_.param_bytes += bytes(params[i]);
      result_.grad_bytes += bytes(params[i].grad());
      const torch::Tensor& master = amp_->master_params()[i];
      if (!master.is_same(params[i])) {
        result_.optim_bytes += bytes(master);
        result_.grad_bytes += bytes(master.grad());
      }
    }
    for (const auto& [key, state] : optimizer_->state())
      result_.optim_bytes += bytes(static_cast<const torch::optim::SGDParamState&>(*state).momentum_buffer());
    if (o_.report_memory()) {
      const double mib = 1024.0 * 1024.0;
      std::printf("rank %lld memory: parameters %.2f MiB, gradients %.2f MiB, optimizer %.2f MiB "
                  "(momentum and fp32 master weights), peak RSS %.1f MiB\n",
                  static_cast<long long>(world_.rank), static_cast<double>(result_.param_bytes) / mib,
                  static_cast<double>(result_.grad_bytes) / mib, static_cast<double>(result_.optim_bytes) / mib,
                  peak_rss_mib());
      std::fflush(stdout);
    }
  }

  const TrainOptions& o_;
  const WorldInfo world_;
  bool leader_ = true;
  std::unique_ptr<dist::ProcessGroup> group_;
  Splits data_;
  std::unique_ptr<data::DistributedSampler> sampler_;
  std::shared_ptr<models::Classifier> model_;
  std::unique_ptr<torch::optim::SGD> optimizer_;
  std::unique_ptr<LrSchedule> schedule_;
  std::unique_ptr<amp::Amp> amp_;
  double static_loss_scale_ = 0.0;  // --loss-scale N: the scale every update restores; 0: dynamic
  std::unique_ptr<parallel::DistributedDataParallel> ddp_;
  std::unique_ptr<StepProfiler> profiler_;
  TrainingPosition pos_;
  std::string resumed_from_;
  torch::Tensor vote_;                          // See Note [Agreeing on non-finite steps]
  c10::intrusive_ptr<c10d::Work> vote_work_;
  std::ofstream jsonl_;
  std::unique_ptr<log::SummaryWriter> tensorboard_;
  TrainResult result_;
};

}  // namespace

TrainResult train(const TrainOptions& options) {
  options.validate();
  return TrainingRun(options).run();
}

}  // namespace lockstep::train
