// Models written in Python (tests/python/torchscript_models.py), trained by lockstep as a user
// reaches it: `lockstep train --model-file`, under every strategy, against one process and against
// Python's own training of the same model; and what Python makes of the files lockstep writes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "../test_util.h"
#include "lockstep/core/atomic_file.h"
#include "lockstep/core/torch_load.h"
#include "lockstep/core/torch_save.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/models/torchscript_module.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/optim/state_dict.h"
#include "lockstep/train/trainer.h"

namespace lockstep::train {
namespace {

using ::testing::HasSubstr;

const std::string kCli = LOCKSTEP_CLI;
const std::string kScripts = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/python/";

// The TorchScript files torchscript_models.py writes, once per test.
class TorchScriptTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    python_ = testing::python_with_torch();
    ASSERT_FALSE(python_.empty()) << testing::kNoPythonTorch;
    const auto made = testing::run_command(python_ + " " + kScripts + "torchscript_models.py " + dir_.path());
    ASSERT_EQ(made.exit_code, 0) << made.output;
  }

  // `lockstep train --quiet --model-file FILE` with `args`, by default for one epoch on
  // Fashion-MNIST's first 400 images, under `lockstep run` when `ranks` > 1.
  testing::CommandResult train(const std::string& file, const std::string& args, int ranks = 1) const {
    std::string command = "timeout 300 ";
    if (ranks > 1) command += kCli + " run --nproc-per-node " + std::to_string(ranks) + " -- ";
    command += kCli + " train --quiet --model-file " + (dir_ / file) + " --seed 4 --threads 1 " + args;
    for (const std::string flag : {"--limit 400", "--epochs 1"})
      if (args.find(flag.substr(0, flag.find(' '))) == std::string::npos) command += " " + flag;
    return testing::run_command(command);
  }

  std::string python_;
  testing::TempDir dir_;
};

c10::Dict<std::string, torch::Tensor> load_weights(const std::string& path) {
  c10::IValue value = torch_load(read_file(path));
  auto dict = value.toGenericDict();
  if (dict.contains("model")) dict = dict.at("model").toGenericDict();
  c10::Dict<std::string, torch::Tensor> out;
  for (const auto& entry : dict) out.insert(entry.key().toStringRef(), entry.value().toTensor());
  return out;
}

// The largest |a - b| over the state dicts' tensors, which must have the same keys.
double max_difference(const std::string& a_path, const std::string& b_path) {
  const auto a = load_weights(a_path), b = load_weights(b_path);
  EXPECT_EQ(a.size(), b.size()) << a_path << " against " << b_path;
  double worst = 0;
  for (const auto& entry : a) {
    EXPECT_TRUE(b.contains(entry.key())) << entry.key() << " missing in " << b_path;
    if (!b.contains(entry.key())) continue;
    worst = std::max(worst, (entry.value().to(torch::kDouble) - b.at(entry.key()).to(torch::kDouble)).abs().max().item<double>());
  }
  return worst;
}

// 2 ranks x batch 20 equal 1 process x batch 40 (DistributedSampler and the averaged gradient), for
// Python's residual MLP (LayerNorm is per sample, so the halves add up) under ddp, zero1 and zero2;
// and dp's 2 replicas on threads in one process.
TEST_F(TorchScriptTrain, TwoRanksUnderDdpAndZeroEqualOneProcessWithTheDoubleBatch) {
  const auto one = train("image_mlp.pt", "--batch-size 40 --save-model " + (dir_ / "one.pt"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const auto dp = testing::run_command("timeout 300 " + kCli + " train --quiet --model-file " + (dir_ / "image_mlp.pt") +
                                       " --seed 4 --threads 2 --limit 400 --batch-size 40 --strategy dp --replicas 2 "
                                       "--save-model " + (dir_ / "dp.pt"));
  ASSERT_EQ(dp.exit_code, 0) << dp.output;
  std::cout << "[ measured ] dp with 2 replicas against 1 process: max |difference| "
            << max_difference(dir_ / "one.pt", dir_ / "dp.pt") << "\n";
  EXPECT_LE(max_difference(dir_ / "one.pt", dir_ / "dp.pt"), 1e-5);
  for (const std::string strategy : {"ddp", "zero1", "zero2"}) {
    const auto two = train("image_mlp.pt", "--batch-size 20 --strategy " + strategy + " --save-model " +
                                               (dir_ / (strategy + ".pt")), 2);
    ASSERT_EQ(two.exit_code, 0) << two.output;
    const double difference = max_difference(dir_ / "one.pt", dir_ / (strategy + ".pt"));
    std::cout << "[ measured ] " << strategy << " on 2 ranks against 1 process: max |difference| " << difference << "\n";
    EXPECT_LE(difference, 1e-5) << strategy;
  }
}

// The strategies that cut the model into blocks (Note [Blocks of a TorchScript module]) end where
// the plain run ends: fsdp's units on 2 ranks, a pipeline of 2 stages, and recomputed activations,
// for the scripted and the traced module.
TEST_F(TorchScriptTrain, FsdpPipelineAndCheckpointedActivationsEqualOneProcess) {
  for (const std::string file : {"image_mlp.pt", "image_mlp_traced.pt"}) {
    const auto one = train(file, "--batch-size 40 --save-model " + (dir_ / "one.pt"));
    ASSERT_EQ(one.exit_code, 0) << one.output;
    const std::vector<std::pair<std::string, std::pair<std::string, int>>> runs{
        {"fsdp", {"--batch-size 20 --strategy fsdp", 2}},
        {"pipeline", {"--batch-size 40 --strategy pipeline --stages 2 --micro-batches 4", 2}},
        {"checkpointed", {"--batch-size 40 --checkpoint-activations", 1}}};
    for (const auto& [name, run] : runs) {
      const auto r = train(file, run.first + " --save-model " + (dir_ / (name + ".pt")), run.second);
      ASSERT_EQ(r.exit_code, 0) << file << " " << name << ":\n" << r.output;
      const double difference = max_difference(dir_ / "one.pt", dir_ / (name + ".pt"));
      std::cout << "[ measured ] " << file << " " << name << " against 1 process: max |difference| " << difference << "\n";
      EXPECT_LE(difference, 1e-5) << file << " " << name;
    }
  }
}

// The CNN with BatchNorm, dropout and a frozen first convolution under ddp on 2 ranks, in bf16
// autocast with clipping and accumulation: the frozen weights do not move (nor under zero2), the
// running statistics do, and Python reads both files lockstep writes: the state dict into its own class, the
// TorchScript module with torch.jit.load; each gives the logits the C++ module gives (1e-6).
TEST_F(TorchScriptTrain, CnnTrainsOnTwoRanksAndPythonRunsBothSavedFiles) {
  const auto r = train("cnn.pt", "--limit 2000 --batch-size 25 --precision bf16 --clip-norm 5 --accum-steps 2 "
                       "--lr 0.05 --save-model " + (dir_ / "trained.pt") + " --save-torchscript " +
                       (dir_ / "trained_script.pt"), 2);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto summary = nlohmann::json::parse(testing::last_json_line(r.output.substr(r.output.rfind("[rank 0] {") + 9)));
  EXPECT_GT(summary["test_acc"].get<double>(), 0.5) << r.output;

  const auto trained = load_weights(dir_ / "trained.pt");
  const models::TorchScriptModule cnn(dir_ / "cnn.pt");
  const auto initial = cnn->named_parameters();
  EXPECT_EQ(trained.size(), initial.size() + cnn->named_buffers().size());
  for (const std::string frozen : {"features.0.weight", "features.0.bias"})
    EXPECT_TRUE(torch::equal(trained.at(frozen), initial[frozen])) << frozen << " moved";
  EXPECT_FALSE(torch::equal(trained.at("fc.weight"), initial["fc.weight"]));
  // Under zero2 too, with AdamW, whose weight decay would move a frozen weight that was stepped.
  const auto zero2 = train("cnn.pt", "--batch-size 20 --strategy zero2 --optimizer adamw --save-model " +
                                         (dir_ / "zero2.pt"), 2);
  ASSERT_EQ(zero2.exit_code, 0) << zero2.output;
  for (const std::string frozen : {"features.0.weight", "features.0.bias"})
    EXPECT_TRUE(torch::equal(load_weights(dir_ / "zero2.pt").at(frozen), initial[frozen])) << frozen << " moved in zero2";
  EXPECT_GT(trained.at("features.1.num_batches_tracked").item<int64_t>(), 0);
  EXPECT_GT((trained.at("features.1.running_var") - 1).abs().max().item<double>(), 1e-3);

  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const torch::Tensor x = torch::randn({6, 1, 28, 28}, gen);
  write_file_atomic(dir_ / "x.pt", torch_save(x));
  const auto py = testing::run_command(python_ + " " + kScripts + "torchscript_training.py logits cnn.pt " +
                                       (dir_ / "trained.pt") + " " + (dir_ / "trained_script.pt") + " " +
                                       (dir_ / "x.pt") + " " + (dir_ / "logits.json"));
  ASSERT_EQ(py.exit_code, 0) << py.output;
  const auto logits = nlohmann::json::parse(testing::read_text(dir_ / "logits.json"));
  models::TorchScriptModule script(dir_ / "trained_script.pt");
  script->eval();
  const torch::Tensor ours = script->forward(x);
  for (const std::string which : {"class", "script"}) {
    std::vector<torch::Tensor> rows;
    for (const auto& row : logits[which]) rows.push_back(torch::tensor(row.get<std::vector<float>>()));
    const double difference = (torch::stack(rows) - ours).abs().max().item<double>();
    std::cout << "[ measured ] Python's " << which << " with lockstep's trained weights against C++: max |difference| "
              << difference << "\n";
    EXPECT_LE(difference, 1e-6) << which;
  }
}

// 2 epochs in one go, or 1 epoch and then --resume for the second, under zero2 on 2 ranks in bf16
// with clipping and accumulation: the same weights bit for bit (optimizer state, data order and the
// model file's identity carry over in the checkpoint).
TEST_F(TorchScriptTrain, AResumedRunEndsWhereAnUninterruptedRunEnds) {
  const std::string common = "--batch-size 20 --strategy zero2 --precision bf16 --clip-norm 1 --accum-steps 2 ";
  const auto straight = train("image_mlp.pt", common + "--epochs 2 --save-model " + (dir_ / "straight.pt"), 2);
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const auto first = train("image_mlp.pt", common + "--checkpoint-dir " + (dir_ / "ckpt"), 2);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const auto second = train("image_mlp.pt", common + "--epochs 2 --checkpoint-dir " + (dir_ / "ckpt") +
                                                " --resume latest --save-model " + (dir_ / "resumed.pt"), 2);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_EQ(max_difference(dir_ / "straight.pt", dir_ / "resumed.pt"), 0.0);
  // Another file is another model: its checkpoint is refused, naming both.
  const auto other = train("image_mlp_traced.pt", common + "--epochs 2 --checkpoint-dir " + (dir_ / "ckpt") +
                                                      " --resume latest", 2);
  EXPECT_NE(other.exit_code, 0);
  EXPECT_THAT(other.output, HasSubstr("torchscript:image_mlp.pt"));
  EXPECT_THAT(other.output, HasSubstr("torchscript:image_mlp_traced.pt"));
}

// The data both sides train on: 240 Fashion-MNIST-shaped samples of 10 classes.
std::shared_ptr<TensorData> samples(const std::string& file) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const torch::Tensor x = torch::randn({240, 1, 28, 28}, gen), y = torch::randint(0, 10, {240}, gen, torch::kInt64);
  c10::Dict<std::string, torch::Tensor> dict;
  dict.insert("x", x);
  dict.insert("y", y);
  write_file_atomic(file, torch_save(dict));
  return std::make_shared<TensorData>(x, y);
}

constexpr double kLr = 0.05;
constexpr int64_t kBatch = 40;
constexpr uint64_t kSeed = 3;

TrainerOptions local_sgd() {
  const auto o = optim::OptimizerOptions(optim::OptimizerKind::kSGD, kLr).momentum(0.9);
  return TrainerOptions()
      .strategy(parallel::StrategyKind::kLocal)
      .strategy_options(parallel::StrategyOptions().optimizer(
          [o](std::vector<torch::Tensor> p) { return optim::make_optimizer(std::move(p), o); }))
      .batch_size(kBatch)
      .seed(kSeed)
      .reporter([](ReportKind, const std::string&) {});
}

// Python picks up lockstep's checkpoint (model and optimizer in PyTorch's layout) and trains the
// next epoch; lockstep resumes the same checkpoint: both end equal. The other way, lockstep picks
// up what Python saved and trains as Python goes on to: equal again. And the first epoch, trained
// by each from the same file, ends equal.
TEST_F(TorchScriptTrain, PythonContinuesLockstepsCheckpointAndLockstepContinuesPythons) {
  const auto data = samples(dir_ / "data.pt");
  const std::string py = python_ + " " + kScripts + "torchscript_training.py ";
  const std::string hyper = " " + std::to_string(kBatch) + " " + std::to_string(kSeed) + " " + std::to_string(kLr) + " ";
  const auto python = [&](const std::string& args) {
    const auto r = testing::run_command(py + args);
    EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.output;
  };
  const auto fit = [&](TrainerOptions options, const std::function<void(Trainer&)>& before = nullptr) {
    torch::set_num_threads(1);
    Trainer trainer(torch::nn::AnyModule(models::TorchScriptModule(dir_ / "image_mlp.pt")), data, options);
    if (before) before(trainer);
    trainer.fit();
    models::save_state_dict(trainer.strategy().module(), dir_ / "lockstep_final.pt");
  };
  const auto report = [](const std::string& what, double difference) {
    std::cout << "[ measured ] " << what << ": max |difference| " << difference << "\n";
    EXPECT_LE(difference, 1e-5) << what;
  };

  // lockstep's epoch 0 with a checkpoint; Python's epoch 0 from the same file.
  models::save_state_dict(*models::TorchScriptModule(dir_ / "image_mlp.pt"), dir_ / "initial.pt");
  fit(local_sgd().epochs(1).checkpoint(CheckpointerOptions().dir(dir_ / "ckpt")));
  python("train " + (dir_ / "image_mlp.pt") + " " + (dir_ / "data.pt") + " 0" + hyper + (dir_ / "python_0.pt"));
  report("epoch 0, lockstep against Python", max_difference(dir_ / "lockstep_final.pt", dir_ / "python_0.pt"));
  EXPECT_GT(max_difference(dir_ / "initial.pt", dir_ / "python_0.pt"), 1e-3) << "the epoch moved nothing";

  // Epoch 1 from lockstep's checkpoint: Python continues it, lockstep resumes it.
  const std::string checkpoint = dir_ / "ckpt/step-00000006.pt";
  ASSERT_TRUE(std::filesystem::exists(checkpoint));
  python("continue " + checkpoint + " " + (dir_ / "data.pt") + " 1" + hyper + (dir_ / "python_1.pt"));
  fit(local_sgd().epochs(2).checkpoint(CheckpointerOptions().dir(dir_ / "ckpt").resume("latest")));
  report("epoch 1 from lockstep's checkpoint, lockstep against Python",
         max_difference(dir_ / "lockstep_final.pt", dir_ / "python_1.pt"));

  // Python's epoch 0 again, from Python's own file: lockstep starts from that file's model and
  // optimizer state.
  python("continue " + (dir_ / "python_0.pt") + " " + (dir_ / "data.pt") + " 0" + hyper + (dir_ / "python_00.pt"));
  fit(local_sgd().epochs(1), [&](Trainer& trainer) {
    const c10::IValue saved = torch_load(read_file(dir_ / "python_0.pt"));
    models::load_state_dict(trainer.strategy().module(), saved, "python_0.pt");
    optim::load_optimizer_state_dict(trainer.strategy().optimizer(), saved.toGenericDict().at("optimizer"),
                                     "python_0.pt");
  });
  report("an epoch from Python's checkpoint, lockstep against Python",
         max_difference(dir_ / "lockstep_final.pt", dir_ / "python_00.pt"));
}

// Each file that cannot train is refused before anything is written, naming the file and what was
// expected.
TEST_F(TorchScriptTrain, FilesThatCannotTrainAreRefusedNamingThemAndNothingIsWritten) {
  std::ofstream(dir_ / "random.pt") << "\x93NUMPY not a zip archive at all";
  std::filesystem::create_directory(dir_ / "out");
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases{
      {"state_dict.pt", {"is not a TorchScript module (torch.jit.save"}},
      {"random.pt", {"is not a TorchScript module (torch.jit.save"}},
      {"two_tensors.pt", {"forward(", "Tensor y", "takes one tensor (the batch)"}},
      {"no_parameters.pt", {"has no parameters: there is nothing to train"}},
      {"mlp16_traced.pt", {"cannot take --data fashion-mnist: a batch of shape [10, 1, 28, 28] fails in its forward",
                           "mat1 and mat2 shapes cannot be multiplied", "'embed.weight' has shape [32, 16]"}}};
  for (const auto& [file, messages] : cases) {
    const auto r = train(file, "--batch-size 10 --save-model " + (dir_ / "out/model.pt") + " --save-torchscript " +
                                   (dir_ / "out/script.pt") + " --checkpoint-dir " + (dir_ / "out/ckpt"));
    EXPECT_NE(r.exit_code, 0) << file;
    EXPECT_THAT(r.output, HasSubstr("'" + (dir_ / file) + "'")) << file;
    for (const auto& message : messages) EXPECT_THAT(r.output, HasSubstr(message)) << file;
    for (const auto& written : std::filesystem::recursive_directory_iterator(dir_ / "out"))
      EXPECT_FALSE(written.is_regular_file()) << file << ": " << written.path();
  }
  // The CNN flattens inside its own forward: it has no chain of blocks to cut.
  for (const std::string strategy : {"--strategy fsdp", "--strategy pipeline", "--checkpoint-activations"}) {
    const auto r = train("cnn.pt", strategy + " --batch-size 10", strategy == "--checkpoint-activations" ? 1 : 2);
    EXPECT_NE(r.exit_code, 0) << strategy;
    EXPECT_THAT(r.output, HasSubstr("runs aten::flatten (")) << strategy;
    EXPECT_THAT(r.output, HasSubstr("torchscript_models.py:")) << strategy;
    EXPECT_THAT(r.output, HasSubstr("torch.nn.Flatten()")) << strategy;
  }
}

}  // namespace
}  // namespace lockstep::train
