#include "lockstep/optim/optimizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <iostream>

#include "../test_util.h"
#include "lockstep/core/atomic_file.h"
#include "lockstep/core/torch_load.h"
#include "lockstep/core/torch_save.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/optim/state_dict.h"

namespace lockstep::optim {
namespace {

using ::testing::HasSubstr;

// The model of tests/python/optimizer_state.py: 4 -> 8 -> 3, 67 parameters in 4 tensors.
constexpr int64_t kNumParameters = 4 * 8 + 8 + 8 * 3 + 3;
// Steps taken before the state is handed over, and after.
constexpr int64_t kStepsBefore = 3;
constexpr int64_t kStepsAfter = 4;
// C++ and Python run the same LibTorch kernels in the same order; fp32 rounding may still differ
// in the last place, and Adam divides by sqrt(v) + eps, which can amplify that.
constexpr double kTolerance = 1e-6;

torch::nn::Sequential make_model(uint64_t seed = 0) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::Tanh(), torch::nn::Linear(8, 3));
}

// Batches for every step: x is (steps, 16, 4), y is (steps, 16, 3).
struct Data {
  torch::Tensor x, y;
  Data() {
    torch::manual_seed(1);
    x = torch::randn({kStepsBefore + kStepsAfter, 16, 4});
    y = torch::randn({kStepsBefore + kStepsAfter, 16, 3});
  }
};

void train(torch::nn::Sequential& model, torch::optim::Optimizer& optimizer, const Data& data, int64_t first,
           int64_t steps) {
  for (int64_t i = first; i < first + steps; ++i) {
    optimizer.zero_grad();
    torch::mse_loss(model->forward(data.x[i]), data.y[i]).backward();
    optimizer.step();
  }
}

c10::impl::GenericDict string_dict() { return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()); }

c10::impl::GenericDict load_dict(const std::string& path) {
  // torch_load, not torch::pickle_load: Python's files hold OrderedDicts and one-entry dicts.
  const c10::IValue v = torch_load(read_file(path));
  EXPECT_TRUE(v.isGenericDict()) << path << " holds a " << v.tagKind();
  return v.toGenericDict();
}

// The largest |a - b| over all parameters of `model` and the state dict `theirs`.
double max_abs_difference(const torch::nn::Sequential& model, const c10::IValue& theirs) {
  auto reference = make_model();
  models::load_state_dict(*reference, theirs, "Python's final weights");
  double worst = 0;
  auto ours = model->parameters(), python = reference->parameters();
  for (size_t i = 0; i < ours.size(); ++i)
    worst = std::max(worst, (ours[i] - python[i]).abs().max().item<double>());
  return worst;
}

int64_t state_bytes_after_one_step(const OptimizerOptions& options) {
  auto model = make_model();
  auto optimizer = make_optimizer(model->parameters(), options);
  EXPECT_EQ(optimizer_state_bytes(*optimizer), 0);
  train(model, *optimizer, Data(), 0, 1);
  return optimizer_state_bytes(*optimizer);
}

struct Case {
  std::string name;
  OptimizerOptions options;
  std::string python_kwargs;  // the same optimizer in Python's words
};

std::ostream& operator<<(std::ostream& out, const Case& c) { return out << c.name; }

std::vector<Case> cases() {
  return {
      {"sgd_momentum", OptimizerOptions(OptimizerKind::kSGD, 0.1).momentum(0.9).weight_decay(1e-3),
       R"({"lr": 0.1, "momentum": 0.9, "weight_decay": 0.001})"},
      {"sgd_nesterov", OptimizerOptions(OptimizerKind::kSGD, 0.05).momentum(0.8).nesterov(true),
       R"({"lr": 0.05, "momentum": 0.8, "nesterov": true})"},
      {"adam", OptimizerOptions(OptimizerKind::kAdam, 0.01), R"({"lr": 0.01})"},
      {"adam_amsgrad_l2", OptimizerOptions(OptimizerKind::kAdam, 0.01).beta2(0.99).amsgrad(true).weight_decay(0.01),
       R"({"lr": 0.01, "betas": [0.9, 0.99], "amsgrad": true, "weight_decay": 0.01})"},
      {"adamw", OptimizerOptions(OptimizerKind::kAdamW, 0.01), R"({"lr": 0.01})"},
      {"adamw_amsgrad", OptimizerOptions(OptimizerKind::kAdamW, 0.02).beta1(0.8).eps(1e-6).amsgrad(true).weight_decay(0.1),
       R"({"lr": 0.02, "betas": [0.8, 0.999], "eps": 1e-6, "amsgrad": true, "weight_decay": 0.1})"},
  };
}

class OptimizerMatchesPython : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    python_ = testing::python_with_torch();
    if (python_.empty()) GTEST_SKIP() << testing::kNoPythonTorch;
  }
  // IN for tests/python/optimizer_state.py: kind, model, data, and the optimizer state if given.
  void write_input(const std::string& path, const torch::nn::Sequential& model, const c10::IValue& optimizer) {
    auto in = string_dict();
    in.insert("kind", to_string(GetParam().options.kind()));
    in.insert("model", models::state_dict_to_dict(*model));
    if (!optimizer.isNone()) in.insert("optimizer", optimizer);
    in.insert("x", data_.x);
    in.insert("y", data_.y);
    write_file_atomic(path, torch_save(in));
  }
  std::string script(const std::vector<std::string>& args) const {
    std::string command = python_ + " " LOCKSTEP_SOURCE_DIR "/tests/python/optimizer_state.py";
    for (const auto& a : args) command += " '" + a + "'";
    return command;
  }

  std::string python_;
  Data data_;
  testing::TempDir dir_;
};

// C++ steps, saves model and optimizer; Python's torch.optim loads both and continues; C++
// continues the same steps with its own optimizer; the weights agree.
TEST_P(OptimizerMatchesPython, PythonContinuesFromOurStateAsWeDo) {
  const Case& c = GetParam();
  auto model = make_model();
  auto optimizer = make_optimizer(model->parameters(), c.options);
  train(model, *optimizer, data_, 0, kStepsBefore);
  write_input(dir_ / "in.pt", model, optimizer_state_dict(*optimizer));

  const auto r = testing::run_command(script({"continue", dir_ / "in.pt", c.python_kwargs,
                                              std::to_string(kStepsBefore), std::to_string(kStepsAfter),
                                              dir_ / "out.pt"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  train(model, *optimizer, data_, kStepsBefore, kStepsAfter);

  const double difference = max_abs_difference(model, load_dict(dir_ / "out.pt").at("model"));
  std::cout << "[ measured ] " << c.name << ": max |C++ - Python| after " << kStepsBefore << "+" << kStepsAfter
            << " steps = " << difference << "\n";
  EXPECT_LE(difference, kTolerance);

  // The layout is Python's: same group keys in the same order (sgd: lockstep's older five, see
  // Note [Optimizer state layout]), same values for the same constructor arguments (so lockstep's
  // defaults are PyTorch's), same state entries and types, step a float32 0-dim tensor.
  const auto report = nlohmann::json::parse(testing::last_json_line(r.output));
  SCOPED_TRACE(report.dump());
  auto python_keys = report["group_keys"]["python"].get<std::vector<std::string>>();
  if (c.options.kind() == OptimizerKind::kSGD) {
    EXPECT_EQ(python_keys, (std::vector<std::string>{"lr", "momentum", "dampening", "weight_decay", "nesterov",
                                                     "maximize", "foreach", "differentiable", "fused", "params"}));
    EXPECT_EQ(report["group_keys"]["ours"], nlohmann::json({"lr", "momentum", "dampening", "weight_decay",
                                                            "nesterov", "params"}));
  } else {
    EXPECT_EQ(report["group_keys"]["ours"], report["group_keys"]["python"]);
    EXPECT_EQ(report["step"]["ours"], nlohmann::json({"torch.float32", nlohmann::json::array(), kStepsBefore}));
    EXPECT_EQ(report["step"]["python"][0], "torch.float32");
  }
  EXPECT_EQ(report["group_values_differing"], nlohmann::json::object());
  EXPECT_EQ(report["state_keys"]["ours"], report["state_keys"]["python"]);
  EXPECT_EQ(report["state_types"]["ours"], report["state_types"]["python"]);
  EXPECT_EQ(report["loaded_lr"].get<double>(), c.options.lr());
}

// Python steps and torch.saves {"model": model.state_dict(), "optimizer": opt.state_dict()}; C++
// loads both into an optimizer made with other hyperparameters, continues, and lands where Python
// does.
TEST_P(OptimizerMatchesPython, WeContinueFromPythonsStateAsPythonDoes) {
  const Case& c = GetParam();
  auto model = make_model();
  write_input(dir_ / "in.pt", model, c10::IValue());
  const auto r = testing::run_command(script({"train", dir_ / "in.pt", c.python_kwargs, std::to_string(kStepsBefore),
                                              std::to_string(kStepsAfter), dir_ / "saved.pt", dir_ / "final.pt"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const auto saved = load_dict(dir_ / "saved.pt");
  auto resumed = make_model(/*seed=*/7);
  models::load_state_dict(*resumed, saved.at("model"), "Python's saved model");
  auto optimizer = make_optimizer(resumed->parameters(), OptimizerOptions(c.options.kind(), 0.5));
  load_optimizer_state_dict(*optimizer, saved.at("optimizer"), dir_ / "saved.pt");
  EXPECT_EQ(optimizer->param_groups()[0].options().get_lr(), c.options.lr());
  EXPECT_EQ(optimizer_state_bytes(*optimizer), state_bytes_after_one_step(c.options));
  train(resumed, *optimizer, data_, kStepsBefore, kStepsAfter);

  const double difference = max_abs_difference(resumed, load_dict(dir_ / "final.pt").at("model"));
  std::cout << "[ measured ] " << c.name << ": max |C++ - Python| after Python's " << kStepsBefore << " + "
            << kStepsAfter << " steps = " << difference << "\n";
  EXPECT_LE(difference, kTolerance);
}

INSTANTIATE_TEST_SUITE_P(OptimizerKinds, OptimizerMatchesPython, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// Our own state, loaded into a fresh model and an optimizer made with other hyperparameters,
// continues bit for bit as the original.
TEST(Optimizer, RoundTripContinuesBitForBit) {
  const Data data;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    auto model = make_model();
    auto optimizer = make_optimizer(model->parameters(), c.options);
    train(model, *optimizer, data, 0, kStepsBefore);
    const c10::IValue saved = torch::pickle_load(torch::pickle_save(optimizer_state_dict(*optimizer)));

    auto copy = make_model(/*seed=*/3);
    models::load_state_dict(*copy, models::state_dict_to_dict(*model), "test");
    auto loaded = make_optimizer(copy->parameters(), OptimizerOptions(c.options.kind(), 0.5));
    load_optimizer_state_dict(*loaded, saved, "test");
    train(model, *optimizer, data, kStepsBefore, kStepsAfter);
    train(copy, *loaded, data, kStepsBefore, kStepsAfter);
    auto a = model->parameters(), b = copy->parameters();
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
  }
}

// A checkpoint written by lockstep's SGD code before this module (train/checkpoint.cpp's
// sgd_state_dict: doubles, no maximize/foreach/differentiable, {} for a parameter without a
// buffer) loads, and Python's momentum-less SGD state ({"momentum_buffer": None}) too.
TEST(Optimizer, OlderLockstepAndMomentumlessPythonSgdStatesLoad) {
  auto model = make_model();
  auto optimizer = make_optimizer(model->parameters(), OptimizerOptions(OptimizerKind::kSGD, 0.5));
  auto group = string_dict();
  group.insert("lr", 0.1);
  group.insert("momentum", 0.9);
  group.insert("dampening", 0.0);
  group.insert("weight_decay", 1e-4);
  group.insert("nesterov", false);
  group.insert("params", c10::List<int64_t>({0, 1, 2, 3}));
  c10::impl::GenericList groups(c10::DictType::create(c10::StringType::get(), c10::AnyType::get()));
  groups.push_back(group);
  c10::Dict<int64_t, c10::Dict<std::string, torch::Tensor>> state;
  c10::Dict<std::string, torch::Tensor> buffer;
  buffer.insert("momentum_buffer", torch::full({3}, 2.0));
  state.insert(3, buffer);
  state.insert(1, c10::Dict<std::string, torch::Tensor>());
  auto old = string_dict();
  old.insert("state", state);
  old.insert("param_groups", groups);
  load_optimizer_state_dict(*optimizer, old, "old checkpoint");
  const auto& o = static_cast<const torch::optim::SGDOptions&>(optimizer->param_groups()[0].options());
  EXPECT_EQ(o.lr(), 0.1);
  EXPECT_EQ(o.momentum(), 0.9);
  EXPECT_EQ(o.weight_decay(), 1e-4);
  EXPECT_EQ(optimizer_state_bytes(*optimizer), 3 * 4);
  // Written back exactly as it was read.
  const auto again = optimizer_state_dict(*optimizer).toGenericDict();
  EXPECT_EQ(again.at("param_groups"), c10::IValue(groups));
  EXPECT_EQ(again.at("state").toGenericDict().size(), 2u);

  // Python 1.13's SGD without momentum: int hyperparameters, its three extra flags, None buffers.
  auto python_group = string_dict();
  python_group.insert("lr", 0.3);
  python_group.insert("momentum", int64_t{0});
  python_group.insert("dampening", int64_t{0});
  python_group.insert("weight_decay", int64_t{0});
  python_group.insert("nesterov", false);
  python_group.insert("maximize", false);
  python_group.insert("foreach", c10::IValue());
  python_group.insert("differentiable", false);
  python_group.insert("params", c10::List<int64_t>({0, 1, 2, 3}));
  c10::impl::GenericList python_groups(c10::DictType::create(c10::StringType::get(), c10::AnyType::get()));
  python_groups.push_back(python_group);
  c10::impl::GenericDict python_state(c10::IntType::get(), c10::AnyType::get());
  for (int64_t i = 0; i < 4; ++i) {
    auto entry = string_dict();
    entry.insert("momentum_buffer", c10::IValue());
    python_state.insert(i, entry);
  }
  auto python = string_dict();
  python.insert("state", python_state);
  python.insert("param_groups", python_groups);
  load_optimizer_state_dict(*optimizer, python, "Python's SGD");
  EXPECT_EQ(optimizer->param_groups()[0].options().get_lr(), 0.3);
  EXPECT_EQ(static_cast<const torch::optim::SGDOptions&>(optimizer->param_groups()[0].options()).momentum(), 0.0);
  EXPECT_EQ(optimizer_state_bytes(*optimizer), 0);
}

TEST(Optimizer, UnknownNameIsRefusedListingTheNames) {
  EXPECT_EQ(optimizer_names(), (std::vector<std::string>{"sgd", "adam", "adamw"}));
  for (const std::string& name : optimizer_names()) EXPECT_EQ(to_string(parse_optimizer(name)), name);
  EXPECT_EQ(testing::error_message([] { parse_optimizer("adamax"); }),
            "unknown optimizer 'adamax'; choose sgd, adam, adamw");
  EXPECT_THAT(testing::error_message([] { parse_optimizer("Adam"); }), HasSubstr("'Adam'"));
}

TEST(Optimizer, DefaultsArePyTorchs) {
  EXPECT_EQ(OptimizerOptions(OptimizerKind::kSGD, 0.1).weight_decay_or_default(), 0.0);
  EXPECT_EQ(OptimizerOptions(OptimizerKind::kAdam, 0.1).weight_decay_or_default(), 0.0);
  EXPECT_EQ(OptimizerOptions(OptimizerKind::kAdamW, 0.1).weight_decay_or_default(), 0.01);
  EXPECT_EQ(OptimizerOptions(OptimizerKind::kAdamW, 0.1).weight_decay(0.0).weight_decay_or_default(), 0.0);
  auto model = make_model();
  auto adamw = make_optimizer(model->parameters(), OptimizerOptions(OptimizerKind::kAdamW, 1e-3));
  const auto& o = static_cast<const torch::optim::AdamWOptions&>(adamw->param_groups()[0].options());
  EXPECT_EQ(o.weight_decay(), 0.01);
  EXPECT_EQ(o.betas(), std::make_tuple(0.9, 0.999));
  EXPECT_EQ(o.eps(), 1e-8);
  EXPECT_FALSE(o.amsgrad());
}

TEST(Optimizer, InvalidOptionsAreRefusedNamingTheOptionAndValue) {
  auto message = [](const OptimizerOptions& o) { return testing::error_message([&] { o.validate(); }); };
  using K = OptimizerKind;
  EXPECT_EQ(message(OptimizerOptions(K::kSGD, -1)), "optimizer sgd: lr must be a finite number >= 0, got -1");
  EXPECT_EQ(message(OptimizerOptions(K::kAdam, std::nan(""))), "optimizer adam: lr must be a finite number >= 0, got nan");
  EXPECT_EQ(message(OptimizerOptions(K::kAdam, 1e-3).beta1(1.0)), "optimizer adam: beta1 must be in [0, 1), got 1");
  EXPECT_EQ(message(OptimizerOptions(K::kAdamW, 1e-3).beta2(-0.1)), "optimizer adamw: beta2 must be in [0, 1), got -0.1");
  EXPECT_EQ(message(OptimizerOptions(K::kAdam, 1e-3).eps(0)), "optimizer adam: eps must be a finite number > 0, got 0");
  EXPECT_EQ(message(OptimizerOptions(K::kSGD, 0.1).momentum(-0.5)),
            "optimizer sgd: momentum must be a finite number >= 0, got -0.5");
  EXPECT_EQ(message(OptimizerOptions(K::kSGD, 0.1).weight_decay(-1e-4)),
            "optimizer sgd: weight_decay must be a finite number >= 0, got -0.0001");
  EXPECT_EQ(message(OptimizerOptions(K::kSGD, 0.1).nesterov(true)),
            "optimizer sgd: nesterov needs momentum > 0, got momentum=0");
  EXPECT_EQ(message(OptimizerOptions(K::kAdam, 1e-3).momentum(0.9)),
            "optimizer adam: momentum=0.9 applies only to sgd (adam's momentum is beta1)");
  EXPECT_EQ(message(OptimizerOptions(K::kAdamW, 1e-3).nesterov(true)), "optimizer adamw: nesterov applies only to sgd");
  EXPECT_EQ(message(OptimizerOptions(K::kSGD, 0.1).beta2(0.99)), "optimizer sgd: beta2=0.99 applies only to adam and adamw");
  EXPECT_EQ(message(OptimizerOptions(K::kSGD, 0.1).amsgrad(true)), "optimizer sgd: amsgrad applies only to adam and adamw");
  EXPECT_EQ(message(OptimizerOptions(K::kSGD, 0.1).momentum(0.9).nesterov(true)), "<no error>");
  // make_optimizer validates.
  auto model = make_model();
  EXPECT_THAT(testing::error_message([&] { make_optimizer(model->parameters(), OptimizerOptions(K::kAdam, -2)); }),
              HasSubstr("lr must be a finite number >= 0, got -2"));
}

// State saved for one model does not load into an optimizer over another: the parameter, the
// entry and both shapes are named, and the optimizer is left as it was.
TEST(Optimizer, StateOfTheWrongShapeIsRefusedNamingParameterAndShapes) {
  auto model = make_model();
  auto optimizer = make_optimizer(model->parameters(), OptimizerOptions(OptimizerKind::kAdam, 0.01));
  train(model, *optimizer, Data(), 0, 1);
  const c10::IValue saved = optimizer_state_dict(*optimizer);

  torch::manual_seed(0);
  torch::nn::Sequential other(torch::nn::Linear(4, 9), torch::nn::Tanh(), torch::nn::Linear(9, 3));
  auto target = make_optimizer(other->parameters(), OptimizerOptions(OptimizerKind::kAdam, 0.5));
  EXPECT_EQ(testing::error_message([&] { load_optimizer_state_dict(*target, saved, "'run/ckpt.pt'"); }),
            "'run/ckpt.pt' state of parameter 0: 'exp_avg' has shape [8, 4] but the parameter has shape [9, 4] "
            "(was it saved from a different model?)");
  EXPECT_EQ(target->param_groups()[0].options().get_lr(), 0.5);
  EXPECT_TRUE(target->state().empty());

  auto sgd = make_optimizer(other->parameters(), OptimizerOptions(OptimizerKind::kSGD, 0.5).momentum(0.9));
  auto sgd_model = make_model();
  auto sgd_source = make_optimizer(sgd_model->parameters(), OptimizerOptions(OptimizerKind::kSGD, 0.5).momentum(0.9));
  train(sgd_model, *sgd_source, Data(), 0, 1);
  EXPECT_EQ(testing::error_message(
                [&] { load_optimizer_state_dict(*sgd, optimizer_state_dict(*sgd_source), "'c.pt'"); }),
            "'c.pt' state of parameter 0: 'momentum_buffer' has shape [8, 4] but the parameter has shape [9, 4] "
            "(was it saved from a different model?)");
}

TEST(Optimizer, WrongNumberOfGroupsOrParametersIsRefusedNamingBoth) {
  auto model = make_model();
  auto params = model->parameters();
  auto one_group = make_optimizer(params, OptimizerOptions(OptimizerKind::kAdamW, 0.01));
  const c10::IValue saved = optimizer_state_dict(*one_group);

  torch::optim::AdamW two_groups({torch::optim::OptimizerParamGroup({params[0], params[1]}),
                                  torch::optim::OptimizerParamGroup({params[2], params[3]})});
  EXPECT_EQ(testing::error_message([&] { load_optimizer_state_dict(two_groups, saved, "'a.pt'"); }),
            "'a.pt' has 1 parameter groups but this adamw optimizer has 2");

  auto fewer = make_optimizer({params[0], params[1]}, OptimizerOptions(OptimizerKind::kAdamW, 0.01));
  EXPECT_EQ(testing::error_message([&] { load_optimizer_state_dict(*fewer, saved, "'a.pt'"); }),
            "'a.pt' param group 0 has 4 parameters but this optimizer's group 0 has 2");
}

TEST(Optimizer, AnotherKindsStateIsRefused) {
  auto model = make_model();
  auto adam = make_optimizer(model->parameters(), OptimizerOptions(OptimizerKind::kAdam, 0.01));
  auto sgd = make_optimizer(model->parameters(), OptimizerOptions(OptimizerKind::kSGD, 0.01));
  EXPECT_EQ(testing::error_message([&] { load_optimizer_state_dict(*sgd, optimizer_state_dict(*adam), "'a.pt'"); }),
            "'a.pt' param group 0 has no 'momentum' entry");
  EXPECT_EQ(testing::error_message([&] { load_optimizer_state_dict(*adam, optimizer_state_dict(*sgd), "'s.pt'"); }),
            "'s.pt' param group 0 has no 'betas' entry");
  torch::optim::RMSprop rmsprop(model->parameters());
  EXPECT_THAT(testing::error_message([&] { optimizer_state_dict(rmsprop); }),
              HasSubstr("optimizer_state_dict supports torch::optim::SGD, Adam and AdamW (lockstep's sgd, adam, "
                        "adamw), not torch::optim::RMSprop"));
}

TEST(Optimizer, StateBytesCountEveryStateTensorAfterOneStep) {
  const int64_t fp32 = 4;
  struct Expected {
    OptimizerOptions options;
    int64_t bytes;
  };
  const std::vector<Expected> expected = {
      {OptimizerOptions(OptimizerKind::kSGD, 0.1), 0},  // no momentum, no buffer
      {OptimizerOptions(OptimizerKind::kSGD, 0.1).momentum(0.9), kNumParameters * fp32},
      {OptimizerOptions(OptimizerKind::kAdam, 0.01), 2 * kNumParameters * fp32},
      {OptimizerOptions(OptimizerKind::kAdam, 0.01).amsgrad(true), 3 * kNumParameters * fp32},
      {OptimizerOptions(OptimizerKind::kAdamW, 0.01), 2 * kNumParameters * fp32},
      {OptimizerOptions(OptimizerKind::kAdamW, 0.01).amsgrad(true), 3 * kNumParameters * fp32},
  };
  for (const auto& e : expected)
    EXPECT_EQ(state_bytes_after_one_step(e.options), e.bytes) << to_string(e.options.kind());
}

}  // namespace
}  // namespace lockstep::optim
