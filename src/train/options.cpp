#include "lockstep/train/options.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "lockstep/core/names.h"
#include "lockstep/core/output_path.h"
#include "lockstep/core/process.h"
#include "lockstep/models/zoo.h"
#include "lockstep/parallel/sync_batch_norm.h"
#include "lockstep/train/checkpoint.h"

namespace lockstep::train {
namespace {

constexpr int64_t kSyntheticTrainSize = 10000;
constexpr int64_t kSyntheticTestSize = 2000;

}  // namespace

const std::vector<std::string>& precision_names() {
  static const std::vector<std::string> names{"fp32", "bf16", "fp16", "auto"};
  return names;
}

const std::vector<std::string>& data_source_names() {
  static const std::vector<std::string> names{"fashion-mnist", "synthetic", "fortunes", "text", "imagefolder", "csv"};
  return names;
}

const std::vector<std::string>& text_task_names() {
  static const std::vector<std::string> names{"lm", "classify"};
  return names;
}

DataSplits load_data(const TrainOptions& o) {
  if (o.data() == DataSource::kSynthetic) {
    // A TorchScript model says nothing of its input: it gets Fashion-MNIST's shape.
    auto base = data::SyntheticOptions().shape(o.model_file().empty() ? models::input_shape(o.model())
                                                                       : std::vector<int64_t>{1, 28, 28});
    const int64_t train_size = o.limit() > 0 ? o.limit() : kSyntheticTrainSize;
    // Distinct seeds so the test split is not a copy of the training split.
    return {data::make_synthetic(base.size(train_size).seed(o.trainer().seed())),
            data::make_synthetic(base.size(kSyntheticTestSize).seed(o.trainer().seed() + 1))};
  }
  DataSplits s{data::load_fashion_mnist(o.data_dir(), data::Split::kTrain).take(o.limit()),
           data::load_fashion_mnist(o.data_dir(), data::Split::kTest)};
  // A TorchScript model's first forward checks the shape instead (image_data.cpp).
  const auto want = o.model_file().empty() ? models::input_shape(o.model()) : std::vector<int64_t>{};
  for (const auto& [split, data] : {std::pair<const char*, const data::Dataset&>{"training", s.train}, {"test", s.test}}) {
    TORCH_CHECK_VALUE(data.size() > 0, "the ", split, " split in --data-dir '", o.data_dir(), "' holds no images: ",
                      "there is nothing to ", split == std::string("test") ? "measure accuracy on" : "train on",
                      "; point --data-dir at Fashion-MNIST's four IDX files");
    const auto have = data.images.sizes().slice(1);
    if (want.empty()) continue;
    const bool fashion_mnist_shape = have.equals({1, 28, 28});
    TORCH_CHECK_VALUE(have.equals(want), "model '", o.model(), "' takes images of shape ", c10::IntArrayRef(want),
                      " but the ", split, " images in --data-dir '", o.data_dir(), "' have shape ", have,
                      fashion_mnist_shape ? "; use --data synthetic for this model"
                                          : "; point --data-dir at Fashion-MNIST's IDX files (1 x 28 x 28 images)");
  }
  return s;
}

c10::impl::GenericDict TrainOptions::run_settings(int64_t world_size) const {
  const TrainOptions& o = *this;
  c10::impl::GenericDict run = string_dict();
  run.insert("model", o.model_name());
  run.insert("data", enum_name(data_source_names(), o.data()));
  run.insert("limit", o.limit());
  run.insert("world_size", world_size);
  run.insert("batch_size", o.trainer().batch_size());
  run.insert("accum_steps", o.trainer().accum_steps());
  run.insert("seed", static_cast<int64_t>(o.trainer().seed()));
  run.insert("precision", enum_name(precision_names(), o.precision()));
  run.insert("opt_level", amp::to_string(o.resolved_opt_level()));
  run.insert("loss_scale", o.resolved_loss_scale());
  run.insert("optimizer", optim::to_string(o.optimizer().kind()));
  if (o.text()) {  // the batches of an epoch depend on these
    run.insert("task", enum_name(text_task_names(), o.task()));
    run.insert("max_tokens", o.max_tokens());
    run.insert("sort_size", o.sort_size());
    run.insert("max_length", o.max_length());
    run.insert("n_layer", o.n_layer());
    run.insert("n_head", o.n_head());
    run.insert("n_embd", o.n_embd());
  }
  return run;
}


namespace {

// The options of --data imagefolder and csv: given where they apply, and only there.
void validate_data_files(const TrainOptions& o) {
  const std::string data = enum_name(data_source_names(), o.data());
  const bool folder = o.data() == DataSource::kImageFolder, csv = o.data() == DataSource::kCsv;
  TORCH_CHECK_VALUE(!folder || o.data_dir() != data::kDefaultFashionMnistDir, "--data imagefolder needs --data-dir: ",
                    "a directory with one sub-directory of images per class (torchvision's ImageFolder layout)");
  TORCH_CHECK_VALUE(!csv || !o.data_file().empty(), "--data csv needs --data-file: a CSV file with a header line ",
                    "and a label column (--label-column, default 'label')");
  TORCH_CHECK_VALUE(csv || o.data_file().empty(), "--data-file '", o.data_file(), "' is read by --data csv, not --data ",
                    data, "; add --data csv or drop --data-file");
  TORCH_CHECK_VALUE(folder || (o.transform().empty() && o.val_transform().empty() && o.val_dir().empty()),
                    "--transform, --val-transform and --val-dir apply to --data imagefolder, not --data ", data);
  TORCH_CHECK_VALUE(o.files() || (o.val_split() == 0.0 && !o.skip_bad_samples()),
                    "--val-split and --skip-bad-samples apply to --data imagefolder and csv, not --data ", data);
  TORCH_CHECK_VALUE(o.val_split() == 0.0 || (o.val_split() > 0.0 && o.val_split() < 1.0), "--val-split ",
                    o.val_split(), " must be a fraction in (0, 1), e.g. 0.1 to hold out a tenth of the samples");
  TORCH_CHECK_VALUE(o.val_split() == 0.0 || o.val_dir().empty(), "--val-split ", o.val_split(), " and --val-dir '",
                    o.val_dir(), "' both name the held-out images; pass one of them");
}

}  // namespace

void TrainOptions::validate() const {
  const TrainerOptions& t = trainer();
  const parallel::StrategyOptions& so = t.strategy_options();
  const parallel::PipelineOptions& pipe = so.pipeline();
  const CheckpointerOptions& ckpt = t.checkpoint();
  const auto& text_models = models::text_model_names();
  const bool text_model = std::count(text_models.begin(), text_models.end(), model()) > 0;
  if (!model_file().empty()) {
    TORCH_CHECK_VALUE(!text(), "--model-file '", model_file(), "' with --data ", enum_name(data_source_names(), data()),
                      ": a TorchScript model trains on images or tables (--data fashion-mnist, synthetic, imagefolder ",
                    "or csv) so far");
    TORCH_CHECK_VALUE(!sync_bn(), "--sync-bn with --model-file '", model_file(), "': its BatchNorm layers run inside ",
                      "the TorchScript file, where lockstep cannot replace them by SyncBatchNorm; drop --sync-bn (each rank's "
                      "BatchNorm then normalises over its own batch, as DDP without SyncBatchNorm does in Python)");
  } else {
    TORCH_CHECK_VALUE(save_torchscript().empty(), "--save-torchscript '", save_torchscript(), "' writes the trained ",
                      "TorchScript module of --model-file, but this run trains --model ", model(), "; use --save-model ",
                      "(a state dict), or lockstep export for ONNX");
    if (!text_model) models::check_model_name(model());
  }
  TORCH_CHECK_VALUE(text() == text_model || !model_file().empty(), "--model ", model(), " and --data ",
                    enum_name(data_source_names(), data()), " do not go together: gpt-mini trains on text (--data ",
                    "fortunes or --data text:FILE), the other models on images (--data fashion-mnist, synthetic or ",
                    "imagefolder) and mlp on --data csv");
  validate_data_files(*this);
  TORCH_CHECK_VALUE(data() != DataSource::kText || !text_file().empty(), "--data text needs a file: --data text:FILE");
  TORCH_CHECK_VALUE(max_tokens() >= 0, "--max-tokens ", max_tokens(), " must be >= 0 (0: --batch-size sequences)");
  TORCH_CHECK_VALUE(max_length() >= 2, "--max-length ", max_length(), " must be at least 2 tokens");
  TORCH_CHECK_VALUE(max_tokens() == 0 || max_tokens() >= max_length(), "--max-tokens ", max_tokens(),
                    " is smaller than one sequence of --max-length ", max_length(), " tokens: a batch of the longest "
                    "sequence would not fit; raise --max-tokens to at least ", max_length(), " or lower --max-length");
  TORCH_CHECK_VALUE(n_layer() >= 1 && n_head() >= 1 && n_embd() % std::max<int64_t>(n_head(), 1) == 0, "gpt-mini: --n-embd ",
                    n_embd(), " must be a multiple of --n-head ", n_head(), " (each head takes n_embd / n_head "
                    "features), and --n-layer ", n_layer(), " at least 1");
  TORCH_CHECK_VALUE(sort_size() >= 0, "--sort-size ", sort_size(), " must be >= 0 (0: 1024 x world size)");
  if (sync_bn() && (text_model || !models::has_norm_layers(model()))) {
    std::vector<std::string> with_bn;
    for (const auto& name : models::model_names())
      if (models::has_norm_layers(name)) with_bn.push_back(name);
    TORCH_CHECK_VALUE(false, "--sync-bn: model '", model(), "' has no BatchNorm layer to synchronise; choose one that has (",
                      c10::Join(", ", with_bn), ") or drop --sync-bn");
  }
  TORCH_CHECK_VALUE(so.replicas() >= 0, "replicas=", so.replicas(), " must be >= 0 (0: the intra-op thread count, at least 2)");
  TORCH_CHECK_VALUE(so.replicas() == 0 || t.strategy() == parallel::StrategyKind::kDp, "--replicas ", so.replicas(),
                    " applies to --strategy dp (DataParallel's replicas); add --strategy dp or drop --replicas");
  const bool fsdp = t.strategy() == parallel::StrategyKind::kFsdp;
  TORCH_CHECK_VALUE(fsdp || (so.fsdp().min_params() == 0 && so.fsdp().reshard_after_forward() && so.fsdp().prefetch()),
                    "--fsdp-min-params, --fsdp-no-reshard-after-forward and --fsdp-no-prefetch set FSDP's units: add "
                    "--strategy fsdp");
  TORCH_CHECK_VALUE(so.fsdp().min_params() >= 0, "--fsdp-min-params ", so.fsdp().min_params(),
                    " must be >= 0 (0: one unit per block)");
  TORCH_CHECK_VALUE(!fsdp || !t.checkpoint_activations(), "--checkpoint-activations with --strategy fsdp: fsdp runs ",
                    "each block itself to gather and free its unit, so it cannot also recompute it; drop one of them");
  TORCH_CHECK_VALUE(limit() >= 0, "limit=", limit(), " must be >= 0 (0 means all samples)");
  TORCH_CHECK_VALUE(t.epochs() >= 1, "epochs=", t.epochs(), " must be at least 1");
  TORCH_CHECK_VALUE(t.batch_size() >= 1, "batch size ", t.batch_size(), " must be at least 1");
  const bool pipeline = t.strategy() == parallel::StrategyKind::kPipeline;
  TORCH_CHECK_VALUE(pipeline || (pipe.stages() == 0 && pipe.micro_batches() == 1 && pipe.split().empty() &&
                                 pipe.schedule() == parallel::PipelineSchedule::kGPipe &&
                                 pipe.balance() == parallel::PipelineBalance::kParams),
                    "--stages, --micro-batches, --schedule, --split and --balance set a pipeline: add --strategy pipeline");
  TORCH_CHECK_VALUE(pipe.split().empty() || pipe.balance() == parallel::PipelineBalance::kParams, "--split ",
                    c10::Join(",", pipe.split()), " and --balance time both say where to cut the stages: give one of them");
  TORCH_CHECK_VALUE(pipe.stages() >= 0, "--stages ", pipe.stages(), " must be >= 1 (0: one stage per rank)");
  TORCH_CHECK_VALUE(pipe.micro_batches() >= 1, "--micro-batches ", pipe.micro_batches(), " must be at least 1");
  TORCH_CHECK_VALUE(pipe.micro_batches() <= t.batch_size(), "--micro-batches ", pipe.micro_batches(),
                    " is larger than the batch (--batch-size ", t.batch_size(), "): every micro-batch needs at least ",
                    "one sample; use at most ", t.batch_size(), " micro-batches or a larger batch");
  TORCH_CHECK_VALUE(pipe.split().empty() || pipe.stages() == 0 || static_cast<int64_t>(pipe.split().size()) == pipe.stages(),
                    "--split has ", pipe.split().size(), " entries but --stages is ", pipe.stages(),
                    ": give one block count per stage");
  optimizer_options().validate();
  TORCH_CHECK_VALUE(threads() >= 0, "threads=", threads(), " must be >= 0 (0 means automatic)");
  TORCH_CHECK_VALUE(threads() <= available_cores(), "threads=", threads(), " exceeds the ", available_cores(),
                    " cores this process may use: threads beyond the cores take turns and run many times slower. ",
                    "Pass at most ", available_cores(), " (0: the cores divided among this node's ranks)");
  // c10d takes 0 ms as "no timeout", and a timeout must fit in milliseconds.
  TORCH_CHECK_VALUE(timeout() >= 0.01 && timeout() <= 604800.0, "timeout=", timeout(),
                    " s is out of range: give the seconds the rendezvous and each collective may take, in ",
                    "[0.01, 604800] (up to 7 days); the default is 300");
  TORCH_CHECK_VALUE(ckpt.save_every() >= 0, "save-every=", ckpt.save_every(), " must be >= 0 (0: at epoch ends only)");
  TORCH_CHECK_VALUE(ckpt.keep_last() >= 0, "keep-last=", ckpt.keep_last(), " must be >= 0 (0 keeps all)");
  TORCH_CHECK_VALUE(ckpt.dir().empty() ? ckpt.save_every() == 0 && ckpt.keep_last() == 0 : true,
                    "--save-every and --keep-last need --checkpoint-dir");
  if (ckpt.format() == CheckpointFormat::kSharded) {
    TORCH_CHECK_VALUE(!ckpt.dir().empty(), "--checkpoint-format sharded needs --checkpoint-dir (where each rank ",
                      "writes its file)");
    TORCH_CHECK_VALUE(t.strategy() && parallel::has_sharded_state(*t.strategy()), "--checkpoint-format sharded with ",
                      "--strategy ", t.strategy() ? parallel::to_string(*t.strategy()) : "unset (ddp or local)",
                      ": every rank of that strategy holds the whole model, so there are no shards to write; use ",
                      "--strategy fsdp, zero1 or zero2, or --checkpoint-format full");
  }
  TORCH_CHECK_VALUE(ckpt.resume() != "latest" || !ckpt.dir().empty(),
                    "--resume latest needs --checkpoint-dir (where to look for the latest checkpoint)");
  TORCH_CHECK_VALUE(ckpt.resume().empty() || init_weights().empty(), "--resume '", ckpt.resume(),
                    "' and --init-weights '", init_weights(),
                    "' both set: a resumed run takes its weights from the checkpoint; pass one of them");
  TORCH_CHECK_VALUE(t.accum_steps() >= 1, "accum-steps=", t.accum_steps(), " must be at least 1");
  TORCH_CHECK_VALUE(global_batch_size() >= 0, "global-batch-size=", global_batch_size(), " must be >= 0 (0: off)");
  TORCH_CHECK_VALUE(global_batch_size() == 0 || t.accum_steps() == 1, "global-batch-size=", global_batch_size(),
                    " sets the accumulation steps itself, but accum-steps=", t.accum_steps(), " was given too; give one");
  TORCH_CHECK_VALUE(std::isfinite(so.clip_value()) && so.clip_value() >= 0, "clip-value ", so.clip_value(),
                    " must be >= 0 (0: no clipping)");
  TORCH_CHECK_VALUE(std::isfinite(so.clip_norm()) && so.clip_norm() >= 0, "clip-norm ", so.clip_norm(),
                    " must be >= 0 (0: no clipping)");
  TORCH_CHECK_VALUE(t.max_skipped_steps() >= 1, "max-skipped-steps=", t.max_skipped_steps(), " must be at least 1");
  TORCH_CHECK_VALUE(t.log_every() >= 1, "log-every=", t.log_every(), " must be at least 1");
  TORCH_CHECK_VALUE(lr_schedule().warmup_steps() >= 0, "warmup-steps=", lr_schedule().warmup_steps(), " must be >= 0");
  const amp::OptLevel level = resolved_opt_level();
  TORCH_CHECK_VALUE(precision() != Precision::kFp32 || level == amp::OptLevel::kO0, "--opt-level ",
                    amp::to_string(level), " needs a half precision: add --precision bf16 (or fp16)");
  TORCH_CHECK_VALUE(precision() == Precision::kFp32 || level != amp::OptLevel::kO0, "--precision ",
                    enum_name(precision_names(), precision()), " with --opt-level O0 would train in fp32; use O1, O2 or O3");
  if (!loss_scale().empty() && loss_scale() != "dynamic" && loss_scale() != "none") {
    char* end = nullptr;
    const double v = std::strtod(loss_scale().c_str(), &end);
    TORCH_CHECK_VALUE(*end == '\0' && std::isfinite(v) && v > 0, "--loss-scale '", loss_scale(),
                      "' is not 'dynamic', 'none' or a positive number");
  }
}

void TrainOptions::check_output_paths() const {
  check_output_file("--save-model", trainer().save_model());
  check_output_file("--save-torchscript", save_torchscript());
  check_output_file("--trace", trainer().trace());
  check_output_file("--log-jsonl", trainer().log().jsonl());
  check_output_directory("--checkpoint-dir", trainer().checkpoint().dir());
  check_output_directory("--tensorboard", trainer().log().tensorboard());
}

std::string TrainOptions::model_name() const {
  if (model_file().empty()) return model();
  return "torchscript:" + model_file().substr(model_file().rfind('/') + 1);
}

amp::OptLevel TrainOptions::resolved_opt_level() const {
  return opt_level().value_or(precision() == Precision::kFp32 ? amp::OptLevel::kO0 : amp::OptLevel::kO1);
}

parallel::StrategyKind TrainOptions::resolved_strategy(int64_t world_size) const {
  return trainer().strategy().value_or(world_size > 1 ? parallel::StrategyKind::kDdp : parallel::StrategyKind::kLocal);
}

std::string TrainOptions::resolved_loss_scale() const {
  if (!loss_scale().empty()) return loss_scale();
  return precision() == Precision::kBf16 || precision() == Precision::kAuto ? "none" : "";
}

optim::OptimizerOptions TrainOptions::optimizer_options() const {
  const bool sgd = optimizer().kind() == optim::OptimizerKind::kSGD;
  optim::OptimizerOptions o = optimizer();
  o.lr(lr().value_or(sgd ? 0.02 : 1e-3));
  if (momentum() || sgd) o.momentum(momentum().value_or(0.9));  // refused by validate() for adam, adamw
  return o;
}

models::NormLayer TrainOptions::norm_layer(dist::ProcessGroup* group) const {
  if (!sync_bn()) return models::batch_norm_2d;
  TORCH_CHECK_VALUE(group != nullptr, "--sync-bn synchronises BatchNorm across ranks, but this run is one process "
                    "without a process group: start it under a launcher (lockstep run --nproc-per-node N -- lockstep "
                    "train ...), or drop --sync-bn");
  return parallel::sync_batch_norm_layer(*group);
}

parallel::StrategyOptions TrainOptions::strategy_options(std::shared_ptr<dist::ProcessGroup> group) const {
  const optim::OptimizerOptions optimizer = optimizer_options();
  parallel::StrategyOptions s = trainer().strategy_options();
  s.optimizer([optimizer](std::vector<torch::Tensor> params) { return optim::make_optimizer(std::move(params), optimizer); })
      .opt_level(resolved_opt_level())
      .half_dtype(precision() == Precision::kFp16 ? torch::kHalf : torch::kBFloat16)
      .group(group);
  const std::string scale = resolved_loss_scale();
  if (scale == "none") {
    s.loss_scale(amp::GradScalerOptions().enabled(false));
  } else if (scale == "dynamic") {
    s.loss_scale(amp::GradScalerOptions());
  } else if (!scale.empty()) {
    s.loss_scale(amp::GradScalerOptions().init_scale(std::stod(scale))).fixed_loss_scale(true);  // validate() checked it
  }
  return s;
}

int64_t TrainOptions::replicas(int64_t world_size) const {
  if (resolved_strategy(world_size) != parallel::StrategyKind::kPipeline) return world_size;
  const int64_t stages = trainer().strategy_options().pipeline().stages();
  return stages > 0 ? std::max<int64_t>(1, world_size / stages) : 1;
}

int64_t accum_steps_for_global_batch(int64_t global_batch, int64_t batch_size, int64_t replicas) {
  TORCH_CHECK_VALUE(global_batch > 0 && batch_size > 0 && replicas > 0, "global batch ", global_batch, ", batch ",
                    batch_size, " and replicas ", replicas, " must all be positive");
  const int64_t per_micro_batch = batch_size * replicas;
  if (global_batch % per_micro_batch == 0) return global_batch / per_micro_batch;
  std::string fitting;
  for (int64_t r = 1; r <= global_batch / batch_size; ++r)
    if (global_batch % (batch_size * r) == 0) fitting += (fitting.empty() ? "" : ", ") + std::to_string(r);
  TORCH_CHECK_VALUE(false, "global batch ", global_batch, " is not a multiple of batch ", batch_size, " x ", replicas,
                    " replicas (", per_micro_batch, "): the rule is global batch = batch x accumulation steps x "
                    "replicas; with batch ", batch_size, " it fits ",
                    fitting.empty() ? std::string("no replica count") : fitting + " replica(s)",
                    "; change the world size, --batch-size or --global-batch-size");
}

}  // namespace lockstep::train
