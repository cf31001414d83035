// The hierarchical all-reduce (Note [Hierarchical all-reduce]) on real hosts as the topology sees
// them: two network namespaces joined by a veth pair, two ranks in each. Ranks are threads that
// enter their namespace (setns) before they join; a run of `lockstep train` under two launchers
// checks the same end to end.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <cmath>
#include <functional>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "../launch/namespaces.h"
#include "../test_util.h"
#include "lockstep/bench/collectives_bench.h"
#include "lockstep/dist/process_group.h"

namespace lockstep::dist {
namespace {

using testing::NamespacePair;
using ::testing::HasSubstr;

void enter(const std::string& netns) {
  const int fd = ::open(("/var/run/netns/" + netns).c_str(), O_RDONLY | O_CLOEXEC);
  TORCH_CHECK(fd >= 0, "cannot open network namespace ", netns);
  const int entered = ::setns(fd, CLONE_NEWNET);
  ::close(fd);
  TORCH_CHECK(entered == 0, "setns into ", netns, " failed");
}

using Body = std::function<void(int64_t rank, ProcessGroup& hierarchical, ProcessGroup& flat)>;

// `placement[r]`: the namespace (0 or 1) of rank r. Each rank makes a group with `algorithm` and
// a flat one to compare with, both with Gloo bound to the veth.
void run_on_two_hosts(const NamespacePair& ns, const std::vector<int>& placement, AllReduceAlgorithm algorithm,
                      const Body& body) {
  const int64_t world = static_cast<int64_t>(placement.size());
  const int port = testing::free_port_pair();
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        enter(ns.name(placement[r]));
        const auto options = [&](int p) {
          return InitOptions().init_method("tcp://" + std::string(NamespacePair::kAddresses[placement[0]]) + ":" +
                                           std::to_string(p))
              .rank(r).world_size(world).timeout(std::chrono::seconds(20)).iface(NamespacePair::kDevice);
        };
        auto tested = init_process_group(options(port).allreduce(algorithm));
        auto flat = init_process_group(options(port + 1).allreduce(AllReduceAlgorithm::kFlat));
        body(r, *tested, *flat);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

#define SKIP_WITHOUT_NAMESPACES(ns)                                                                          \
  if (const std::string why = testing::namespaces_unavailable(); !why.empty()) GTEST_SKIP() << why;          \
  NamespacePair ns;                                                                                          \
  if (!ns.error().empty()) GTEST_SKIP() << "cannot create network namespaces here: " << ns.error()

// Rank r's input: distinct per rank and element, of mixed signs and magnitudes.
torch::Tensor input(int64_t rank, int64_t numel, torch::ScalarType dtype) {
  torch::manual_seed(1000 + rank);
  return (torch::randn({numel}, torch::kDouble) * torch::exp(torch::randn({numel}, torch::kDouble))).to(dtype);
}

TEST(HierarchicalAllReduce, SumsAsFlatDoesWithinReassociationAndEveryRankGetsTheSameBits) {
  SKIP_WITHOUT_NAMESPACES(ns);
  run_on_two_hosts(ns, {0, 0, 1, 1}, AllReduceAlgorithm::kAuto, [](int64_t rank, ProcessGroup& hier, ProcessGroup& flat) {
    ASSERT_EQ(hier.all_reduce_algorithm(), AllReduceAlgorithm::kHierarchical);  // auto's choice for 2 x 2
    ASSERT_EQ(flat.all_reduce_algorithm(), AllReduceAlgorithm::kFlat);
    EXPECT_EQ(hier.host_of_rank(), (std::vector<int64_t>{0, 0, 1, 1}));
    EXPECT_EQ(hier.hosts(), 2);
    EXPECT_FALSE(hier.uses_shared_memory());  // the world spans two hosts
    EXPECT_THAT(hier.describe(), HasSubstr("all-reduce: hierarchical (2 hosts x 2 ranks; inside a host through "
                                           "shared memory, across hosts over Gloo)"));
    EXPECT_THAT(flat.describe(), HasSubstr("all-reduce: flat (one Gloo ring over 4 ranks on 2 hosts)"));
    const int64_t world = hier.size();
    // 1 and 3 elements leave shards empty; 2^20 + 7 fp32 crosses a 2 MiB shared-memory slot.
    for (const torch::ScalarType dtype : {torch::kFloat, torch::kDouble, torch::kHalf}) {
      for (const int64_t numel : {int64_t{1}, int64_t{3}, int64_t{1000}, (int64_t{1} << 20) + 7}) {
        SCOPED_TRACE(c10::str(dtype, " x ", numel));
        torch::Tensor a = input(rank, numel, dtype), b = a.clone();
        torch::Tensor magnitude = a.to(torch::kDouble).abs();
        hier.all_reduce(a);
        flat.all_reduce(b);
        flat.all_reduce(magnitude);
        // Two orders of summing `world` numbers differ by at most 2 (world - 1) u sum |x| (Note
        // [Hierarchical all-reduce]); fp16 also rounds each partial sum, once per addition.
        const double u = dtype == torch::kHalf ? std::ldexp(1.0, -11) : dtype == torch::kFloat ? std::ldexp(1.0, -24)
                                                                                                : std::ldexp(1.0, -53);
        const torch::Tensor bound = magnitude * (2.0 * static_cast<double>(world) * u);
        const torch::Tensor diff = (a.to(torch::kDouble) - b.to(torch::kDouble)).abs();
        EXPECT_TRUE(diff.le(bound).all().item<bool>()) << "worst excess " << (diff - bound).max().item<double>();
        const std::vector<torch::Tensor> everyone = flat.all_gather(a);
        for (int64_t r = 1; r < world; ++r) EXPECT_TRUE(torch::equal(everyone[r], everyone[0])) << "rank " << r;
      }
    }
    torch::Tensor mean = input(rank, 100, torch::kFloat), sum = mean.clone();
    hier.all_reduce(mean, ReduceOp::kMean);
    hier.all_reduce(sum);
    EXPECT_TRUE(torch::equal(mean, sum / world));
  });
}

TEST(HierarchicalAllReduce, AsyncAllReducesRunInIssueOrderBesideFlatCollectivesAndCountTheRingsBytes) {
  SKIP_WITHOUT_NAMESPACES(ns);
  // Hosts interleaved: host 0 holds ranks 0 and 3, host 1 ranks 1 and 2.
  run_on_two_hosts(ns, {0, 1, 1, 0}, AllReduceAlgorithm::kHierarchical,
                   [](int64_t rank, ProcessGroup& hier, ProcessGroup& flat) {
    EXPECT_EQ(hier.host_of_rank(), (std::vector<int64_t>{0, 1, 1, 0}));
    std::vector<torch::Tensor> sent, expected;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (int64_t i = 0; i < 6; ++i) {
      sent.push_back(input(rank * 10 + i, 5000 + 1000 * i, torch::kFloat));
      expected.push_back(sent.back().clone());
      works.push_back(hier.all_reduce_async(sent.back()));
    }
    torch::Tensor largest = torch::tensor({static_cast<float>(rank)});
    hier.all_reduce(largest, ReduceOp::kMax);  // flat Gloo, while the sums are in flight
    EXPECT_EQ(largest.item<float>(), 3.0f);
    for (int64_t i = 0; i < 6; ++i) {
      hier.wait(works[i], "async all-reduce");
      flat.all_reduce(expected[i]);
      EXPECT_TRUE(torch::allclose(sent[i], expected[i], 1e-5, 1e-5)) << "all-reduce " << i;
    }
    // The ring model, not the subgroups' own traffic; the max of one float adds 2 x 3/4 x 4 bytes.
    EXPECT_EQ(hier.bytes_sent(), flat.bytes_sent() + 6);
  });
}

TEST(HierarchicalAllReduce, HostsWithDifferentRankCountsAreRefusedWhenAskedAndFlatUnderAuto) {
  SKIP_WITHOUT_NAMESPACES(ns);
  EXPECT_THAT([&] { run_on_two_hosts(ns, {0, 0, 1}, AllReduceAlgorithm::kHierarchical, [](auto, auto&, auto&) {}); },
              ::testing::ThrowsMessage<c10::ValueError>(
                  HasSubstr("a hierarchical all-reduce needs as many ranks on every host, but the 2 hosts hold 2, 1 "
                            "ranks; start the same number on each, or choose the flat all-reduce (--allreduce flat)")));
  run_on_two_hosts(ns, {0, 0, 1}, AllReduceAlgorithm::kAuto, [](int64_t rank, ProcessGroup& group, ProcessGroup&) {
    EXPECT_EQ(group.all_reduce_algorithm(), AllReduceAlgorithm::kFlat);
    torch::Tensor t = torch::full({3}, static_cast<float>(rank + 1));
    group.all_reduce(t);
    EXPECT_TRUE(torch::equal(t, torch::full({3}, 6.0f)));
  });
}

TEST(HierarchicalAllReduce, TheCollectivesBenchMeasuresBothAlgorithmsAcrossHosts) {
  SKIP_WITHOUT_NAMESPACES(ns);
  run_on_two_hosts(ns, {0, 0, 1, 1}, AllReduceAlgorithm::kFlat, [](int64_t, ProcessGroup& world, ProcessGroup&) {
    const auto rows = bench::run_collectives_bench(
        world, bench::CollectivesBenchOptions().min_bytes(4096).max_bytes(4096).iterations(2));
    std::vector<std::string> measured;
    for (const auto& r : rows) measured.push_back(r.collective + " " + r.algorithm);
    EXPECT_EQ(measured, (std::vector<std::string>{"all_reduce flat", "all_reduce hierarchical", "reduce_scatter flat",
                                                  "all_gather flat", "broadcast flat"}));
    EXPECT_EQ(rows[1].hosts, 2);
  });
}

// What a user runs: a launcher per host, `lockstep train --allreduce`, over links shaped as a
// cluster's (1 Gbit/s). The same seeds give the same losses within float reassociation, and rank 0
// says which all-reduce it uses.
TEST(HierarchicalAllReduce, TrainUnderTwoLaunchersOverShapedLinksMatchesFlatAndSaysWhichItUses) {
  SKIP_WITHOUT_NAMESPACES(ns);
  ASSERT_EQ(ns.shape("1gbit"), "");
  std::vector<double> losses;
  int port = 29500;
  for (const std::string algorithm : {"flat", "hierarchical"}) {
    testing::TempDir dir;
    std::vector<std::unique_ptr<testing::ChildProcess>> nodes;
    for (int n = 0; n < 2; ++n) {
      std::vector<std::string> argv = ns.exec(n);
      argv.insert(argv.end(), {LOCKSTEP_CLI, "run", "--nnodes", "2", "--node-rank", std::to_string(n),
                               "--nproc-per-node", "2", "--master-addr", NamespacePair::kAddresses[0],
                               "--master-port", std::to_string(port), "--rdzv-timeout", "20", "--iface",
                               ns.device(n), "--", LOCKSTEP_CLI, "train", "--model", "mlp", "--data", "synthetic",
                               "--limit", "512", "--batch-size", "16", "--epochs", "1", "--quiet", "--timeout", "20",
                               "--threads", "1", "--allreduce", algorithm});
      nodes.push_back(std::make_unique<testing::ChildProcess>(argv, dir / ("node" + std::to_string(n) + ".out")));
    }
    std::vector<std::string> out(2);
    for (int n = 0; n < 2; ++n) {
      const std::optional<int> code = nodes[n]->wait_for(std::chrono::seconds(90));
      out[n] = testing::read_text(dir / ("node" + std::to_string(n) + ".out"));
      ASSERT_EQ(code.value_or(-1), 0) << algorithm << ", node " << n << ":\n" << out[n];
    }
    EXPECT_THAT(out[0], HasSubstr(algorithm == "flat" ? "all-reduce: flat (one Gloo ring over 4 ranks on 2 hosts)"
                                                      : "all-reduce: hierarchical (2 hosts x 2 ranks; inside a host "
                                                        "through shared memory, across hosts over Gloo)"));
    std::string summary_line;  // rank 0's summary, under the launcher's "[rank 0] " prefix
    std::istringstream lines(out[0]);
    for (std::string line; std::getline(lines, line);)
      if (line.rfind("[rank 0] {", 0) == 0) summary_line = line.substr(9);
    const auto summary = nlohmann::json::parse(summary_line);
    losses.push_back(summary.at("final_loss").get<double>());
    port += 10;
  }
  EXPECT_NEAR(losses[1], losses[0], 1e-4 * std::abs(losses[0])) << "flat " << losses[0] << ", hierarchical " << losses[1];
}

}  // namespace
}  // namespace lockstep::dist
