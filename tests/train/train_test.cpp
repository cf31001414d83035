#include "lockstep/train/train.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <sstream>

#include "../test_util.h"
#include "lockstep/core/atomic_file.h"
#include "lockstep/amp/opt_level.h"
#include "lockstep/core/names.h"
#include "lockstep/data/dataset.h"
#include "lockstep/data/distributed_sampler.h"
#include "lockstep/models/zoo.h"
#include "lockstep/train/lr_schedule.h"

namespace lockstep::train {
namespace {

using ::testing::HasSubstr;

bool have_fashion_mnist() {
  return ::access((std::string(data::kDefaultFashionMnistDir) + "/train-images-idx3-ubyte.gz").c_str(), R_OK) == 0;
}

// `o` without the progress display, its run's options (a Trainer's) set by `edit`.
TrainOptions quiet(TrainOptions o, const std::function<void(TrainerOptions&)>& edit = {}) {
  o.trainer().progress(nullptr);
  if (edit) edit(o.trainer());
  return o;
}

TrainOptions small_run(uint64_t seed) {
  return quiet(TrainOptions().model("convnet").limit(1200), [&](TrainerOptions& t) { t.batch_size(100).epochs(2).seed(seed); });
}

TEST(Trainer, SameSeedGivesBitIdenticalLossSequence) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  TrainResult a = train(small_run(11));
  TrainResult b = train(small_run(11));
  TrainResult c = train(small_run(12));
  ASSERT_EQ(a.step_losses.size(), 24u);  // 2 epochs x 1200 / 100
  EXPECT_EQ(a.step_losses, b.step_losses);  // exact, not approximate
  EXPECT_NE(a.step_losses, c.step_losses);
  EXPECT_EQ(a.test_acc, b.test_acc);
}

// --deterministic switches LibTorch to its deterministic algorithms (and the run still repeats
// bit for bit); it stays on for the process, so the test switches it off again.
TEST(Trainer, DeterministicTurnsOnDeterministicAlgorithms) {
  auto run = quiet(TrainOptions().model("convnet").data(DataSource::kSynthetic).limit(200).deterministic(true),
                   [](TrainerOptions& t) { t.batch_size(50).seed(3); });
  ASSERT_FALSE(at::globalContext().deterministicAlgorithms());
  TrainResult a = train(run);
  EXPECT_TRUE(at::globalContext().deterministicAlgorithms());
  TrainResult b = train(run);
  at::globalContext().setDeterministicAlgorithms(false, false);
  EXPECT_EQ(a.step_losses, b.step_losses);
}

TEST(Trainer, ConvNetLearnsFashionMnist) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  TrainResult r = train(quiet(TrainOptions().limit(6000)));
  // Chance is 0.10; the first 6000 samples for one epoch reach about 0.78 (0.70 leaves room).
  EXPECT_GT(r.test_acc, 0.70);
  EXPECT_LT(r.step_losses.back(), r.step_losses.front());
  EXPECT_EQ(r.samples, 6000);
  EXPECT_GT(r.samples_per_s, 0);
  EXPECT_GT(r.peak_rss_mib, 0);
}

TEST(Trainer, SyntheticDataTrainsResNet18Shapes) {
  TrainResult r = train(quiet(TrainOptions().model("resnet18").data(DataSource::kSynthetic).limit(8),
                              [](TrainerOptions& t) { t.batch_size(4); }));
  EXPECT_EQ(r.step_losses.size(), 2u);
  for (double l : r.step_losses) EXPECT_TRUE(std::isfinite(l));
}

// The figures are inputs to the formatting, not results of training: the same on every x86-64 CPU.
TEST(Trainer, SummaryJsonHasTheDocumentedKeysInOrder) {
  TrainResult r;
  r.world_size = 1;
  r.samples_per_s = 1234.56;
  r.train_s = 1.5;
  r.test_acc = 0.891234;
  r.final_loss = 0.25;
  r.peak_rss_mib = 300.04;
  r.sent_bytes_per_step = 4096;
  EXPECT_EQ(r.summary_json(),
            R"({"world_size":1,"samples_per_s":1234.6,"train_s":1.5,"test_acc":0.8912,)"
            R"("final_loss":0.25,"peak_rss_mib":300.0,"param_bytes":0,"grad_bytes":0,"optim_bytes":0,)"
            R"("sent_bytes_per_step":4096,"steps":0,"skipped_steps":0})");
}

TEST(Trainer, RejectsBadOptionsNamingTheValue) {
  auto msg = [](const TrainOptions& o) { return testing::error_message([&] { o.validate(); }); };
  EXPECT_THAT(msg(quiet(TrainOptions(), [](TrainerOptions& t) { t.batch_size(0); })), HasSubstr("batch size 0"));
  EXPECT_THAT(msg(TrainOptions().lr(-0.1)), HasSubstr("optimizer sgd: lr must be a finite number >= 0, got -0.1"));
  EXPECT_THAT(msg(TrainOptions().optimizer(optim::OptimizerOptions(optim::OptimizerKind::kAdamW, 0.0)).momentum(0.9)),
              HasSubstr("optimizer adamw: momentum=0.9 applies only to sgd"));
  EXPECT_THAT(msg(TrainOptions().model("lenet")), HasSubstr("unknown model 'lenet'"));
  EXPECT_THAT(testing::error_message([] { enum_from_name<DataSource>(data_source_names(), "cifar", "data"); }),
              HasSubstr("unknown data 'cifar'; choose fashion-mnist, synthetic"));
  EXPECT_THAT(msg(quiet(TrainOptions(), [](TrainerOptions& t) { t.epochs(0); })), HasSubstr("epochs=0"));
  EXPECT_THAT(msg(quiet(TrainOptions(), [](TrainerOptions& t) { t.accum_steps(0); })), HasSubstr("accum-steps=0"));
  EXPECT_THAT(msg(quiet(TrainOptions(), [](TrainerOptions& t) { t.strategy_options().clip_norm(-1); })),
              HasSubstr("clip-norm -1"));
  EXPECT_THAT(msg(quiet(TrainOptions(), [](TrainerOptions& t) { t.checkpoint().save_every(5); })),
              HasSubstr("need --checkpoint-dir"));
  EXPECT_THAT(msg(quiet(TrainOptions(), [](TrainerOptions& t) { t.checkpoint().resume("latest"); })),
              HasSubstr("--resume latest needs --checkpoint-dir"));
  EXPECT_THAT(msg(quiet(TrainOptions().init_weights("b"), [](TrainerOptions& t) { t.checkpoint().resume("a"); })),
              HasSubstr("pass one of them"));
  EXPECT_EQ(msg(TrainOptions()), "<no error>");
}

// Every output path is checked before any data is read or step taken: the data directory here does
// not exist, so an error about it would mean the path check came too late. Previously a bad
// --save-model or --trace failed only after the whole run.
TEST(Trainer, OutputPathsAreRefusedBeforeTrainingNamingTheOption) {
  testing::TempDir dir;
  const TrainOptions base = quiet(TrainOptions().data_dir("/nonexistent/fashion-mnist"));
  auto msg = [&base](const std::function<void(TrainerOptions&)>& edit) {
    return testing::error_message([&] { train(quiet(base, edit)); });
  };
  EXPECT_THAT(msg([](TrainerOptions& t) { t.save_model("/etc/hostname/model.pt"); }),
              HasSubstr("--save-model '/etc/hostname/model.pt': cannot create files in '/etc/hostname' (it is not a "
                        "directory)"));
  EXPECT_THAT(msg([&](TrainerOptions& t) { t.trace(dir / "no/such/dir/trace.json"); }),
              HasSubstr("--trace '" + (dir / "no/such/dir/trace.json") + "': cannot create files in '" +
                        (dir / "no/such/dir") + "' (it does not exist)"));
  EXPECT_THAT(msg([&](TrainerOptions& t) { t.log().jsonl(dir.path()); }),
              HasSubstr("--log-jsonl '" + dir.path() + "' is a directory"));
  EXPECT_THAT(msg([](TrainerOptions& t) { t.checkpoint().dir("/etc/hostname/ckpt"); }),
              HasSubstr("--checkpoint-dir '/etc/hostname/ckpt': cannot create it (Not a directory)"));
  // Good paths pass the check, and the run then stops at the missing data, as before.
  EXPECT_THAT(msg([&](TrainerOptions& t) { t.save_model(dir / "m.pt").checkpoint().dir(dir / "ckpt"); }),
              HasSubstr("/nonexistent/fashion-mnist"));
  EXPECT_TRUE(std::filesystem::is_directory(dir / "ckpt"));
}

TEST(Trainer, ResNetOnFashionMnistSuggestsSynthetic) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  EXPECT_THAT(testing::error_message([] { train(quiet(TrainOptions().model("resnet18"))); }),
              HasSubstr("--data synthetic"));
}

// Final parameters (by state-dict key) of a run that saved its model to `path`.
std::vector<std::pair<std::string, torch::Tensor>> saved(const std::string& path) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& e : torch::pickle_load(read_file(path)).toGenericDict())
    out.emplace_back(e.key().toStringRef(), e.value().toTensor());
  return out;
}

TEST(Trainer, FourAccumulatedMicroBatchesEqualOneBatchFourTimesLarger) {
  testing::TempDir dir;
  auto run = quiet(TrainOptions().model("mlp").data(DataSource::kSynthetic).limit(960),
                   [](TrainerOptions& t) { t.epochs(2).seed(4); });
  TrainResult accumulated = train(quiet(run, [&](TrainerOptions& t) { t.batch_size(30).accum_steps(4).save_model(dir / "a.pt"); }));
  TrainResult large = train(quiet(run, [&](TrainerOptions& t) { t.batch_size(120).save_model(dir / "b.pt"); }));
  ASSERT_EQ(accumulated.step_losses.size(), 16u);  // 2 epochs x 960 / 120
  ASSERT_EQ(large.step_losses.size(), 16u);
  for (size_t i = 0; i < 16; ++i) EXPECT_NEAR(accumulated.step_losses[i], large.step_losses[i], 1e-5) << "step " << i;
  auto a = saved(dir / "a.pt"), b = saved(dir / "b.pt");
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_LE((a[i].second - b[i].second).abs().max().item<double>(), 1e-5) << a[i].first;
}

// --global-batch-size 120 with micro-batches of 30 on one rank accumulates 4: the run above.
TEST(Trainer, GlobalBatchSizeSetsTheAccumulationForTheWorldSize) {
  auto run = quiet(TrainOptions().model("mlp").data(DataSource::kSynthetic).limit(960).global_batch_size(120),
                   [](TrainerOptions& t) { t.epochs(2).seed(4).batch_size(30); });
  TrainResult global = train(run);
  TrainOptions plain = run;
  TrainResult accumulated = train(quiet(plain.global_batch_size(0), [](TrainerOptions& t) { t.accum_steps(4); }));
  ASSERT_EQ(global.step_losses.size(), 16u);
  for (size_t i = 0; i < 16; ++i) EXPECT_EQ(global.step_losses[i], accumulated.step_losses[i]) << "step " << i;
  EXPECT_EQ(accum_steps_for_global_batch(48, 4, 3), 4);
  EXPECT_EQ(accum_steps_for_global_batch(48, 4, 4), 3);
  const std::string refused = testing::error_message([] { accum_steps_for_global_batch(48, 4, 5); });
  EXPECT_THAT(refused, HasSubstr("global batch 48 is not a multiple of batch 4 x 5 replicas (20)"));
  EXPECT_THAT(refused, HasSubstr("it fits 1, 2, 3, 4, 6, 12 replica(s)"));
  EXPECT_THAT(testing::error_message([&] { train(quiet(run, [](TrainerOptions& t) { t.accum_steps(2); })); }),
              HasSubstr("give one"));
}

// --precision auto times both precisions, says what it measured, and trains in the faster one: the
// run's settings then name fp32 or bf16, never auto.
TEST(Trainer, PrecisionAutoTrainsInTheFasterPrecisionAndSaysWhich) {
  testing::TempDir dir;
  std::vector<std::string> said;
  auto o = quiet(TrainOptions().model("convnet").data(DataSource::kSynthetic).limit(200).precision(Precision::kAuto),
                 [&](TrainerOptions& t) {
                   t.batch_size(50).log(log::RunLogOptions().jsonl(dir / "run.jsonl"));
                   t.reporter([&](ReportKind, const std::string& line) { said.push_back(line); });
                 });
  const TrainResult r = train(o);
  EXPECT_EQ(r.steps, 4);
  const auto line = std::find_if(said.begin(), said.end(), [](const std::string& l) { return l.rfind("precision auto:", 0) == 0; });
  ASSERT_NE(line, said.end());
  double fp32 = 0, bf16 = 0;
  char chosen[8] = {};
  ASSERT_EQ(std::sscanf(line->c_str(), "precision auto: a step of the first batch took %lf ms in fp32 and %lf ms in bf16 "
                                       "(O1) on this CPU: training in %7s", &fp32, &bf16, chosen), 3) << *line;
  EXPECT_EQ(std::string(chosen), bf16 < fp32 ? "bf16" : "fp32") << *line;
  EXPECT_THAT(testing::read_text(dir / "run.jsonl"), HasSubstr(std::string("\"precision\":\"") + chosen + "\""));
  // O0 is fp32's level: with auto it could only mean fp32, so it is refused.
  EXPECT_THAT(testing::error_message([&] { train(TrainOptions(o).opt_level(amp::OptLevel::kO0)); }),
              HasSubstr("--precision auto with --opt-level O0"));
}

// A run checkpointed mid-epoch and resumed from there ends exactly where an uninterrupted one does.
TEST(Trainer, ResumingMidEpochContinuesBitForBit) {
  testing::TempDir dir;
  auto run = quiet(TrainOptions().model("convnet").data(DataSource::kSynthetic).limit(400),
                   [](TrainerOptions& t) { t.batch_size(50).epochs(2).seed(8); });
  TrainResult straight = train(quiet(run, [&](TrainerOptions& t) { t.save_model(dir / "straight.pt"); }));
  train(quiet(run, [&](TrainerOptions& t) { t.checkpoint().dir(dir / "ckpt").save_every(3); }));
  // 8 steps per epoch: checkpoints at steps 3, 6, 9, 12, 15 and the epoch ends 8, 16. Step 12 is mid epoch 2.
  ASSERT_TRUE(std::filesystem::exists(dir / "ckpt/step-00000012.pt"));
  TrainResult resumed = train(quiet(run, [&](TrainerOptions& t) {
    t.save_model(dir / "resumed.pt").checkpoint().resume(dir / "ckpt/step-00000012.pt");
  }));
  ASSERT_EQ(resumed.step_losses.size(), 4u);  // steps 13..16
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(resumed.step_losses[i], straight.step_losses[12 + i]) << "step " << 13 + i;
  EXPECT_EQ(resumed.steps, 16);
  EXPECT_EQ(resumed.final_loss, straight.final_loss);  // the epoch mean includes the steps before the resume
  auto a = saved(dir / "straight.pt"), b = saved(dir / "resumed.pt");
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
}

// Note [A reference loop instead of golden runs]
// The local strategy must train exactly as the plain loop a LibTorch user writes by hand: the
// sampler's order cut into batches, the model's forward under the opt level, cross-entropy
// weighted by each micro-batch's share of the step, backward, unscale and clip, the optimizer
// step and the scaler's update. That loop is written out below and run in the same process, so
// both sides use the same CPU, BLAS kernels and thread count and must agree bit for bit. (Losses
// and CRCs recorded on one CPU once stood here; oneDNN and OpenBLAS pick other kernels on another
// CPU, and the 6th loss moved in its 6th digit on an Intel Xeon.)
struct ReferenceRun {
  std::vector<double> step_losses;
  std::map<std::string, torch::Tensor> weights;  // parameters (fp32 masters at O2) and buffers, by name
};

ReferenceRun reference_loop(const std::string& model_name, int64_t size, int64_t batch_size, int64_t accum_steps,
                            int64_t epochs, uint64_t seed, amp::OptLevel level, double clip_norm) {
  torch::set_num_threads(1);
  torch::manual_seed(seed);
  const data::Dataset train_set = data::make_synthetic(
      data::SyntheticOptions().shape(models::input_shape(model_name)).size(size).seed(seed));
  auto model = models::make_model(model_name, train_set.num_classes);
  model->train();
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.02).momentum(0.9));
  amp::Amp amp = amp::initialize(*model, sgd, level);
  data::DistributedSampler sampler(size, data::DistributedSamplerOptions().num_replicas(1).rank(0).seed(seed));
  ReferenceRun run;
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    sampler.set_epoch(epoch);
    const torch::Tensor order = sampler.indices();  // (size) int64
    const int64_t batches = (size + batch_size - 1) / batch_size;
    for (int64_t first = 0; first < batches; first += accum_steps) {
      const int64_t last = std::min(first + accum_steps, batches);
      const int64_t step_samples = std::min(last * batch_size, size) - first * batch_size;
      amp.zero_grad(/*set_to_none=*/true);
      double step_loss = 0.0;
      for (int64_t b = first; b < last; ++b) {
        const int64_t rows = std::min(batch_size, size - b * batch_size);
        auto [x, y] = train_set.batch(order.narrow(0, b * batch_size, rows));
        torch::Tensor loss;
        {
          auto autocast = amp.autocast();
          const torch::Tensor out = amp.cast_output(model->forward(amp.cast_input(x)));
          loss = torch::nn::functional::cross_entropy(out, y) *
                 (static_cast<double>(rows) / static_cast<double>(step_samples));
        }
        step_loss += loss.item<double>();
        amp.scale_loss(loss).backward();
      }
      if (clip_norm > 0) {
        amp.unscale_();
        torch::nn::utils::clip_grad_norm_(amp.master_params(), clip_norm);
      }
      amp.step();
      amp.update();
      run.step_losses.push_back(step_loss);
    }
  }
  const auto params = model->named_parameters();
  for (size_t i = 0; i < params.size(); ++i) run.weights.emplace(params[i].key(), amp.master_params()[i]);
  for (const auto& b : model->named_buffers()) run.weights.emplace(b.key(), b.value());
  return run;
}

// See Note [A reference loop instead of golden runs]: fp32 SGD on the convnet (BatchNorm buffers
// included), and O2 bf16 with dynamic loss scaling, clipping and accumulation on the mlp.
TEST(Trainer, LocalStrategyTrainsBitForBitAsAPlainReferenceLoop) {
  struct Case {
    std::string model;
    int64_t size, batch_size, accum_steps;
    uint64_t seed;
    amp::OptLevel level;
    double clip_norm;
  };
  const std::vector<Case> cases{{"convnet", 400, 50, 1, 8, amp::OptLevel::kO0, 0.0},
                                {"mlp", 240, 20, 2, 4, amp::OptLevel::kO2, 1.0}};
  for (const Case& c : cases) {
    testing::TempDir dir;
    TrainOptions o = quiet(TrainOptions().data(DataSource::kSynthetic).threads(1).model(c.model).limit(c.size),
                           [&](TrainerOptions& t) {
                             t.strategy(parallel::StrategyKind::kLocal).batch_size(c.batch_size)
                                 .accum_steps(c.accum_steps).epochs(2).seed(c.seed).save_model(dir / "model.pt")
                                 .strategy_options().clip_norm(c.clip_norm);
                           });
    if (c.level == amp::OptLevel::kO2) o.precision(Precision::kBf16).opt_level(c.level).loss_scale("dynamic");
    const TrainResult r = train(o);
    const ReferenceRun ref = reference_loop(c.model, c.size, c.batch_size, c.accum_steps, 2, c.seed, c.level, c.clip_norm);
    ASSERT_EQ(r.step_losses.size(), ref.step_losses.size()) << c.model;
    EXPECT_EQ(r.step_losses, ref.step_losses) << c.model;  // exact: same process, same kernels
    const auto trained = saved(dir / "model.pt");
    ASSERT_EQ(trained.size(), ref.weights.size()) << c.model;
    for (const auto& [name, t] : trained) {
      ASSERT_EQ(ref.weights.count(name), 1u) << c.model << " " << name;
      EXPECT_TRUE(torch::equal(t, ref.weights.at(name))) << c.model << " " << name;
    }
  }
}

// A state dict written by Python's torch.save, with DDP's "module." prefix, starts training.
TEST(Trainer, InitWeightsReadsPythonTorchSaveWithDdpPrefix) {
  const std::string python = testing::python_with_torch();
  if (python.empty()) GTEST_SKIP() << testing::kNoPythonTorch;
  testing::TempDir dir;
  auto r = testing::run_command(
      python + " -c \"import sys; sys.path.insert(0, '" LOCKSTEP_SOURCE_DIR "/tests/python'); import torch, "
      "reference_models as m; torch.manual_seed(7); s = m.ConvNet().state_dict(); "
      "torch.save({'module.' + k: v for k, v in s.items()}, '" + (dir / "py.pt") + "')\"");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // lr 0: the weights stay what Python wrote (batch norm's running statistics still move).
  train(quiet(TrainOptions().model("convnet").data(DataSource::kSynthetic).limit(50).lr(0).init_weights(dir / "py.pt"),
              [&](TrainerOptions& t) { t.batch_size(50).save_model(dir / "out.pt"); }));
  auto ours = saved(dir / "out.pt");
  auto theirs = torch::pickle_load(read_file(dir / "py.pt")).toGenericDict();
  for (const auto& [key, tensor] : ours) {
    if (key.find("running_") != std::string::npos || key.find("num_batches") != std::string::npos) continue;
    EXPECT_TRUE(torch::equal(tensor, theirs.at("module." + key).toTensor())) << key;
  }
}

// What --log-jsonl and --tensorboard record agree, read back by the independent TensorBoard reader;
// the learning rates follow the warmup + cosine schedule.
TEST(Trainer, TensorBoardAndJsonlRecordTheSameScalarsOnTheSchedule) {
  testing::TempDir dir;
  auto cosine = TrainOptions().model("mlp").data(DataSource::kSynthetic).limit(400);
  cosine.lr_schedule().kind(LrScheduleKind::kCosine).warmup_steps(5);
  train(quiet(cosine, [&](TrainerOptions& t) {
    t.batch_size(20).epochs(2).log_every(4).log().jsonl(dir / "log.jsonl").tensorboard(dir / "tb");
  }));
  std::vector<nlohmann::json> steps, epochs, others;
  std::istringstream lines(testing::read_text(dir / "log.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    auto j = nlohmann::json::parse(line);
    (j["event"] == "step" ? steps : j["event"] == "epoch" ? epochs : others).push_back(j);
  }
  ASSERT_EQ(steps.size(), 10u);  // 40 steps, every 4th
  ASSERT_EQ(epochs.size(), 2u);
  ASSERT_EQ(others.size(), 2u);  // the run's settings first, its summary last
  EXPECT_EQ(others[0]["settings"]["lr_schedule"], "cosine");
  EXPECT_EQ(others[1]["event"], "summary");
  EXPECT_EQ(others[1]["steps"], 40);
  const LrSchedule schedule(LrScheduleOptions(0.02).kind(LrScheduleKind::kCosine).warmup_steps(5).total_steps(40));
  for (const auto& j : steps)  // the lr the logged step used
    EXPECT_DOUBLE_EQ(j["lr"].get<double>(), schedule.lr_at(j["step"].get<int64_t>() - 1)) << j.dump();

  std::string tb_file;
  for (const auto& e : std::filesystem::directory_iterator(dir / "tb")) tb_file = e.path().string();
  auto r = testing::run_command(LOCKSTEP_PYTHON " " LOCKSTEP_SOURCE_DIR "/tests/python/read_tfevents.py " + tb_file);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::map<std::pair<std::string, int64_t>, double> scalars;
  const auto read_back = nlohmann::json::parse(testing::last_json_line(r.output));
  for (const auto& v : read_back["scalars"])
    scalars[{v["tag"].get<std::string>(), v["step"].get<int64_t>()}] = v["value"].get<double>();
  EXPECT_EQ(scalars.size(), 3 * steps.size() + epochs.size());  // loss, lr, samples/s per logged step; accuracy per epoch
  for (const auto& j : steps) {
    const int64_t step = j["step"];
    // TensorBoard stores float32, as in PyTorch.
    EXPECT_EQ(scalars.at({"train/loss", step}), static_cast<float>(j["loss"].get<double>()));
    EXPECT_EQ(scalars.at({"train/lr", step}), static_cast<float>(j["lr"].get<double>()));
    EXPECT_EQ(scalars.at({"train/samples_per_s", step}), static_cast<float>(j["samples_per_s"].get<double>()));
  }
  for (const auto& j : epochs)
    EXPECT_EQ(scalars.at({"test/accuracy", j["step"].get<int64_t>()}), static_cast<float>(j["test_acc"].get<double>()));
}

// --clip-norm bounds each update: with plain SGD (no momentum) one step moves the parameters by
// exactly lr x the clipped norm.
TEST(Trainer, ClipNormBoundsTheUpdate) {
  testing::TempDir dir;
  auto run = quiet(TrainOptions().model("mlp").data(DataSource::kSynthetic).limit(20).momentum(0).lr(0.5),
                   [](TrainerOptions& t) { t.batch_size(20); });
  train(quiet(TrainOptions(run).lr(0), [&](TrainerOptions& t) { t.save_model(dir / "before.pt"); }));
  train(quiet(run, [&](TrainerOptions& t) { t.save_model(dir / "after.pt").strategy_options().clip_norm(1e-3); }));
  auto before = saved(dir / "before.pt"), after = saved(dir / "after.pt");
  double squared = 0;
  for (size_t i = 0; i < before.size(); ++i) squared += (after[i].second - before[i].second).square().sum().item<double>();
  EXPECT_NEAR(std::sqrt(squared), 0.5 * 1e-3, 1e-7);
}

// --profile: every phase of the step with its mean and share. The steps' total, read from the
// report, must account for most of the training time the trainer measured with its own clock (the
// rest is progress output and epoch bookkeeping) and cannot exceed it.
TEST(Trainer, ProfileReportsEveryPhaseAndAccountsForTheTrainingTime) {
  TrainResult r = train(quiet(TrainOptions().model("mlp").data(DataSource::kSynthetic).limit(200),
                              [](TrainerOptions& t) { t.batch_size(20).profile(true); }));
  std::map<std::string, double> ms;  // phase -> ms per step
  std::istringstream rows(r.profile);
  for (std::string line; std::getline(rows, line);) {
    std::istringstream row(line);
    std::string name, mean, pct;
    if (row >> name >> mean >> pct && pct.back() == '%') ms[name] = std::stod(mean);
  }
  for (const char* phase : {"data", "forward", "loss", "backward", "sync", "optimizer", "logging", "other", "step"})
    EXPECT_TRUE(ms.count(phase)) << phase << " missing from\n" << r.profile;
  for (const char* phase : {"forward", "backward", "optimizer"}) EXPECT_GT(ms[phase], 0.0) << phase << "\n" << r.profile;
  EXPECT_EQ(ms["sync"], 0.0) << "one process has no gradient all-reduce to wait for\n" << r.profile;
  const double steps_ms = 10 * ms["step"], train_ms = 1000 * r.train_s;
  EXPECT_LE(steps_ms, train_ms + 10 * 0.0005) << r.profile;  // the report rounds the step mean to 0.001 ms
  EXPECT_GE(steps_ms, 0.5 * train_ms) << r.profile;
  EXPECT_THAT(r.profile, HasSubstr("(10 steps)"));
}

// O2 keeps an mlp's weights in bf16 (half the bytes) and fp32 masters beside the momentum
// buffers in the optimizer; a checkpointed O2 run resumes bit for bit from the masters.
TEST(Trainer, O2HalvesParameterBytesAndResumesExactly) {
  testing::TempDir dir;
  auto run = quiet(TrainOptions().model("mlp").data(DataSource::kSynthetic).limit(200),
                   [](TrainerOptions& t) { t.batch_size(20).epochs(2); });
  TrainResult o0 = train(run);
  auto o2 = TrainOptions(run).precision(Precision::kBf16).opt_level(amp::OptLevel::kO2).loss_scale("dynamic");
  TrainResult straight = train(quiet(o2, [&](TrainerOptions& t) { t.save_model(dir / "straight.pt"); }));
  EXPECT_EQ(straight.param_bytes * 2, o0.param_bytes);
  EXPECT_EQ(straight.optim_bytes, 2 * o0.param_bytes);             // momentum + masters, both fp32
  EXPECT_EQ(straight.grad_bytes, o0.param_bytes + o0.param_bytes / 2);  // bf16 grads + fp32 master grads

  train(quiet(o2, [&](TrainerOptions& t) { t.checkpoint().dir(dir / "ckpt").save_every(7); }));
  TrainResult resumed = train(quiet(o2, [&](TrainerOptions& t) {
    t.save_model(dir / "resumed.pt").checkpoint().resume(dir / "ckpt/step-00000014.pt");
  }));
  for (size_t i = 0; i < resumed.step_losses.size(); ++i) EXPECT_EQ(resumed.step_losses[i], straight.step_losses[14 + i]);
  auto a = saved(dir / "straight.pt"), b = saved(dir / "resumed.pt");
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].second.scalar_type(), torch::kFloat32) << a[i].first;  // --save-model writes the masters
    EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
  }
}

// LibTorch 2.x's CPU kernels take fp16 (1.13's did not, and the precision probe refused it).
TEST(Trainer, Fp16TrainsOnThisCpuAndOptionsAreChecked) {
  const TrainResult fp16 =
      train(quiet(TrainOptions().model("mlp").data(DataSource::kSynthetic).limit(40).precision(Precision::kFp16)));
  EXPECT_TRUE(std::isfinite(fp16.final_loss)) << fp16.final_loss;
  EXPECT_THAT(testing::error_message([] { TrainOptions().opt_level(amp::OptLevel::kO2).validate(); }),
              HasSubstr("--opt-level O2 needs a half precision"));
  EXPECT_THAT(testing::error_message([] { TrainOptions().precision(Precision::kBf16).loss_scale("big").validate(); }),
              HasSubstr("--loss-scale 'big' is not 'dynamic', 'none' or a positive number"));
}

}  // namespace
}  // namespace lockstep::train
