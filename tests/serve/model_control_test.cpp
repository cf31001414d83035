// The repository's model control (Triton's --model-control-mode): explicit loads and unloads,
// poll's rescans, and what requests in flight see meanwhile (Note [Loading and unloading while
// serving]); the clients' side is tests/serve/tritonclient_model_control.py.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>

#include "lockstep/serve/http_protocol.h"
#include "lockstep/serve/model_repository.h"
#include "serve_process.h"

namespace lockstep {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

class ModelControl : public testing::ConvnetWeightsTest {
 protected:
  // A convnet model; a queue delay keeps a lone request queued that long (or until an unload).
  void add(const std::string& name, int64_t max_queue_delay_us = 0, int64_t max_batch_size = 8) {
    testing::write_repository_model(repo_, name, testing::convnet_config(max_batch_size, max_queue_delay_us),
                                    weights());
  }
  std::unique_ptr<serve::ModelRepository> open(serve::ModelControlMode mode, std::vector<std::string> startup = {}) {
    return serve::ModelRepository::load(
        repo_, serve::RepositoryOptions()
                   .threads(1)
                   .model_control_mode(mode)
                   .startup_models(std::move(startup))
                   .poll_interval_s(3600)  // rescans by hand: poll()
                   .on_change([this](const std::string& line) { changes_.push_back(line); }));
  }
  static torch::Tensor answer(const serve::ServedModel& m) {
    return m.versions.at(0).batcher->submit({torch::zeros({1, 1, 28, 28})}).get().at(0);
  }
  testing::TempDir dir_;
  std::string repo_ = dir_ / "models";
  std::vector<std::string> changes_;  // what the repository reported
};

// Explicit mode loads only the startup models; a load brings one in, an unload takes it out (listed
// as "unloaded"), and a request that held the model before the unload is still answered.
TEST_F(ModelControl, ExplicitModeLoadsAndUnloadsOnRequest) {
  add("a");
  add("b", 60'000'000);  // its request waits in the queue: a minute, or until the unload runs it
  const auto repo = open(serve::ModelControlMode::kExplicit, {"a"});
  ASSERT_TRUE(repo->find("a")->ready);
  EXPECT_FALSE(repo->find("b")->loaded);
  EXPECT_EQ(repo->find("b")->reason, "unloaded");
  repo->load_model("b");
  const std::shared_ptr<const serve::ServedModel> held = repo->find("b");
  ASSERT_TRUE(held->ready);
  std::future<serve::Tensors> queued = held->versions.at(0).batcher->submit({torch::zeros({1, 1, 28, 28})});
  repo->unload_model("b");
  ASSERT_EQ(queued.wait_for(std::chrono::seconds(0)), std::future_status::ready);  // run by the unload
  EXPECT_EQ(queued.get().at(0).sizes(), (std::vector<int64_t>{1, 10}));
  EXPECT_FALSE(repo->find("b")->loaded);
  EXPECT_THROW(held->versions.at(0).batcher->submit({torch::zeros({1, 1, 28, 28})}), serve::Unavailable);
  EXPECT_THAT(testing::error_message([&] { repo->unload_model("b"); }), HasSubstr("model 'b' is not loaded"));
  EXPECT_THAT(testing::error_message([&] { repo->load_model("../x"); }), HasSubstr("no model directory '../x'"));
  EXPECT_EQ(answer(*repo->find("a")).sizes(), (std::vector<int64_t>{1, 10}));  // the other serves on
}

// A reload whose config.pbtxt no longer parses leaves the loaded model serving (Triton's rule);
// one that is fine replaces it; modes other than explicit refuse loads and unloads.
TEST_F(ModelControl, ABrokenReloadLeavesTheLoadedModelServing) {
  add("a");
  const auto repo = open(serve::ModelControlMode::kExplicit, {"*"});
  const auto first = repo->find("a");
  std::ofstream(repo_ + "/a/config.pbtxt") << "max_batch_size: [";
  EXPECT_THAT(testing::error_message([&] { repo->load_model("a"); }), HasSubstr("serve on"));
  EXPECT_EQ(repo->find("a"), first);
  EXPECT_EQ(answer(*first).sizes(), (std::vector<int64_t>{1, 10}));
  std::ofstream(repo_ + "/a/config.pbtxt") << testing::convnet_config(8, 0);
  repo->load_model("a");
  EXPECT_NE(repo->find("a"), first);
  EXPECT_TRUE(repo->find("a")->ready);
  const auto none = open(serve::ModelControlMode::kNone);
  EXPECT_THROW(none->load_model("a"), serve::ModelControlRefused);
  EXPECT_THROW(none->unload_model("a"), serve::ModelControlRefused);
  EXPECT_THAT(testing::error_message([&] { open(serve::ModelControlMode::kExplicit, {"zz"}); }),
              HasSubstr("startup model 'zz' has no directory"));
}

// A load's config override (Triton's "config" parameter: the configuration as JSON) is used in place
// of config.pbtxt for that load; the next load without one reads config.pbtxt again; an override
// that does not parse leaves the loaded model serving, as a broken config.pbtxt does.
TEST_F(ModelControl, AConfigOverrideLoadsInPlaceOfConfigPbtxtForThatLoad) {
  add("a", 0, 8);
  const auto repo = open(serve::ModelControlMode::kExplicit);
  nlohmann::json override = serve::model_config_json(
      serve::parse_model_config(testing::convnet_config(8, 0), "config.pbtxt", "a"));
  override["max_batch_size"] = 2;
  repo->load_model("a", override.dump());
  EXPECT_EQ(repo->find("a")->config->max_batch_size, 2);
  EXPECT_EQ(answer(*repo->find("a")).sizes(), (std::vector<int64_t>{1, 10}));
  const auto loaded = repo->find("a");
  EXPECT_THAT(testing::error_message([&] { repo->load_model("a", R"({"max_batch_size": "two"})"); }),
              AllOf(HasSubstr("serve on"), HasSubstr("the load's config override"), HasSubstr("max_batch_size")));
  EXPECT_EQ(repo->find("a"), loaded);
  repo->load_model("a");
  EXPECT_EQ(repo->find("a")->config->max_batch_size, 8);
}

// Poll mode: a rescan loads a model added to the repository, reloads one whose files changed,
// unloads one removed, and leaves alone one whose config broke and one unchanged.
TEST_F(ModelControl, PollRescansLoadAddedChangedAndRemovedModels) {
  add("a");
  add("keep");
  const auto repo = open(serve::ModelControlMode::kPoll);
  EXPECT_TRUE(repo->poll().empty());  // nothing changed
  const auto keep = repo->find("keep");
  add("b");
  std::ofstream(repo_ + "/keep/config.pbtxt", std::ios::app) << "\n";  // a changed file: reloaded
  EXPECT_EQ(repo->poll(), (std::vector<std::string>{"b", "keep"}));
  EXPECT_TRUE(repo->find("b")->ready);
  EXPECT_NE(repo->find("keep"), keep);
  const auto a = repo->find("a");
  std::ofstream(repo_ + "/a/config.pbtxt") << "max_batch_size: [";
  fs::remove_all(repo_ + "/b");
  EXPECT_EQ(repo->poll(), (std::vector<std::string>{"b"}));
  EXPECT_EQ(repo->find("b"), nullptr);
  EXPECT_EQ(repo->find("a"), a);  // the broken config: the loaded model serves on
  EXPECT_EQ(answer(*a).sizes(), (std::vector<int64_t>{1, 10}));
  EXPECT_THROW(repo->load_model("a"), serve::ModelControlRefused);
  EXPECT_EQ(changes_, (std::vector<std::string>{"model 'b' loaded: version(s) 1", "model 'keep' loaded: version(s) 1",
                                                 "model 'b' unloaded"}));
}

// Triton's clients drive the model repository extension (tests/serve/tritonclient_model_control.py,
// tritonclient.http and .grpc): the index lists what is not loaded, load and unload over both
// protocols, a missing or broken model's load is refused with the reason while the others serve, a
// config override is refused, and an unload in the middle of 200 async calls answers every one:
// OK, or UNAVAILABLE for those that came after it (nothing accepted is dropped, none hangs).
TEST_F(ModelControl, TritonsClientsLoadAndUnloadOverHttpAndGrpc) {
  if (testing::run_command(std::string(LOCKSTEP_PYTHON) + " -c 'import tritonclient.grpc'").exit_code != 0)
    GTEST_SKIP() << "tritonclient[grpc] is not installed in the venv (scripts/bootstrap --test)";
  add("a");
  add("b", 500'000, 64);  // batches of 64 or a 0.5 s wait: calls are queued when the unload comes
  fs::create_directories(repo_ + "/broken/1");
  std::ofstream(repo_ + "/broken/config.pbtxt") << "max_batch_size: [";
  testing::ServeProcess server({"--model-repository", repo_, "--threads", "1", "--model-control-mode", "explicit",
                                "--load-model", "a"},
                               dir_ / "log");
  ASSERT_TRUE(server.wait_ready()) << server.log();
  const std::string script = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/serve/tritonclient_model_control.py";
  const auto r = testing::run_command("timeout 120 " + std::string(LOCKSTEP_PYTHON) + " " + script + " 127.0.0.1:" +
                                      std::to_string(server.port()) + " " + server.grpc_target() + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto report = nlohmann::json::parse(testing::last_json_line(r.output));
  std::cout << "[ measured ] unload amid 200 calls: " << report["unload_under_load"].dump() << "\n";
  EXPECT_EQ(report["checks"].size(), 7u);
  for (const auto& [name, outcome] : report["checks"].items()) EXPECT_EQ(outcome, "ok") << name;
}

}  // namespace
}  // namespace lockstep
