#include "lockstep/dist/process_group.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include <atomic>
#include <cstdlib>
#include <optional>
#include <thread>
#include <future>
#include <mutex>

#include "../test_util.h"
#include "multi_rank.h"

namespace lockstep::dist {
namespace {

using ::testing::HasSubstr;
using lockstep::testing::run_ranks;

TEST(ProcessGroup, CollectivesOnThreeRanks) {
  run_ranks(3, [](int64_t rank, ProcessGroup& pg) {
    EXPECT_EQ(pg.rank(), rank);
    EXPECT_EQ(pg.size(), 3);
    torch::Tensor sum = torch::full({4}, static_cast<float>(rank + 1));
    pg.all_reduce(sum);
    EXPECT_TRUE(torch::allclose(sum, torch::full({4}, 6.0f)));
    torch::Tensor mean = torch::full({2}, static_cast<float>(rank));
    pg.all_reduce(mean, ReduceOp::kMean);
    EXPECT_TRUE(torch::allclose(mean, torch::full({2}, 1.0f)));
    torch::Tensor max = torch::tensor({static_cast<float>(rank), -static_cast<float>(rank)});
    pg.all_reduce(max, ReduceOp::kMax);
    EXPECT_TRUE(torch::equal(max, torch::tensor({2.0f, 0.0f})));
    torch::Tensor b = rank == 1 ? torch::arange(5, torch::kFloat) : torch::zeros({5});
    pg.broadcast(b, /*root=*/1);
    EXPECT_TRUE(torch::equal(b, torch::arange(5, torch::kFloat)));
    auto gathered = pg.all_gather(torch::full({2}, rank * 10, torch::kInt64));
    ASSERT_EQ(gathered.size(), 3u);
    for (int64_t r = 0; r < 3; ++r) EXPECT_EQ(gathered[r][1].item<int64_t>(), r * 10);
    EXPECT_DOUBLE_EQ(pg.average(static_cast<double>(rank) * 3.0), 3.0);
    pg.barrier();
  });
}

// new_group on 4 ranks (Note [Subgroups]): {0, 2} and {1, 3} each reduce, broadcast and exchange
// among themselves only, numbered 0 and 1; ranks outside a subgroup get nullptr; the subgroups'
// bytes count in the parent's; a bad list of ranks is refused naming it.
TEST(ProcessGroup, SubgroupsReduceAmongTheirOwnRanks) {
  std::vector<float> sums(4), received(4);
  std::vector<int64_t> parent_bytes(4);
  run_ranks(4, [&](int64_t rank, ProcessGroup& pg) {
    std::unique_ptr<ProcessGroup> mine;
    for (const std::vector<int64_t>& ranks : {std::vector<int64_t>{0, 2}, std::vector<int64_t>{1, 3}}) {
      auto g = pg.new_group(ranks);
      EXPECT_EQ(g != nullptr, ranks[0] % 2 == rank % 2) << "rank " << rank;
      if (g) mine = std::move(g);
    }
    ASSERT_NE(mine, nullptr);
    EXPECT_EQ(mine->rank(), rank / 2);
    EXPECT_EQ(mine->size(), 2);
    const int64_t before = pg.bytes_sent();
    torch::Tensor t = torch::full({3}, static_cast<float>(rank));
    mine->all_reduce(t);
    sums[rank] = t[0].item<float>();
    parent_bytes[rank] = pg.bytes_sent() - before;
    torch::Tensor b = torch::full({1}, static_cast<float>(rank));
    mine->broadcast(b, 1);
    received[rank] = b.item<float>();
    EXPECT_THAT(testing::error_message([&] { pg.new_group({2, 1}); }),
                HasSubstr("new_group on rank " + std::to_string(rank) + ": ranks [2, 1] must be ascending ranks of a group of 4"));
  });
  EXPECT_EQ(sums, (std::vector<float>{2, 4, 2, 4}));        // 0 + 2, 1 + 3
  EXPECT_EQ(received, (std::vector<float>{2, 3, 2, 3}));    // each subgroup's rank 1
  for (int64_t bytes : parent_bytes) EXPECT_EQ(bytes, 12);  // 2 (N-1)/N x 12 bytes on N = 2
}

// Rank r's input of `numel` elements: seeded by r, so every rank can rebuild every other's.
torch::Tensor rank_input(int64_t r, int64_t numel, torch::ScalarType dtype = torch::kFloat) {
  return torch::randn({numel}, at::make_generator<at::CPUGeneratorImpl>(100 + r)).to(dtype);
}

// reduce_scatter (alltoall + local reduction) gives each rank its chunk of what all_reduce gives
// everyone: sums within 1e-6 (fp32 additions of 2 or 3 terms, perhaps in another order), max exactly.
TEST(ProcessGroup, ReduceScatterEqualsAllReduceThenSliceOnTwoAndThreeRanks) {
  for (const int64_t world : {2, 3}) {
    run_ranks(world, [world](int64_t rank, ProcessGroup& pg) {
      const int64_t n = 5;  // elements per rank's output
      const torch::Tensor input = rank_input(rank, world * n).reshape({world, n});
      for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax}) {
        torch::Tensor reduced = input.clone();
        pg.all_reduce(reduced, op);
        torch::Tensor out = torch::full({n}, -7.0f);
        pg.reduce_scatter(out, input, op);
        const torch::Tensor expected = reduced[rank];
        if (op == ReduceOp::kMax) {
          EXPECT_TRUE(torch::equal(out, expected)) << "world " << world << " rank " << rank;
        } else {
          EXPECT_LE((out - expected).abs().max().item<double>(), 1e-6) << "world " << world << " rank " << rank;
        }
      }
    });
  }
}

// bf16 travels as 16-bit words and is summed in fp32, rounded once: exactly the fp32 sum of the
// ranks' bf16 chunks rounded to bf16, and within bf16's rounding (2^-8 relative) of the fp32 sum.
TEST(ProcessGroup, ReduceScatterSumsBf16InFp32AndRoundsOnce) {
  run_ranks(3, [](int64_t rank, ProcessGroup& pg) {
    const int64_t n = 64;
    torch::Tensor out = torch::empty({n}, torch::kBFloat16);
    pg.reduce_scatter(out, rank_input(rank, 3 * n, torch::kBFloat16));
    torch::Tensor fp32_sum = torch::zeros({n});
    std::vector<torch::Tensor> chunks;
    for (int64_t r = 0; r < 3; ++r) chunks.push_back(rank_input(r, 3 * n, torch::kBFloat16).narrow(0, rank * n, n));
    const torch::Tensor expected = torch::stack(chunks).to(torch::kFloat).sum(0).to(torch::kBFloat16);
    EXPECT_TRUE(torch::equal(out, expected));
    for (int64_t r = 0; r < 3; ++r) fp32_sum += rank_input(r, 3 * n).narrow(0, rank * n, n);
    EXPECT_TRUE(torch::allclose(out.to(torch::kFloat), fp32_sum, /*rtol=*/1.0 / 128, /*atol=*/0.05));
  });
}

// all_gather_into fills one flat tensor with every rank's input in rank order, bit for bit, in fp32
// and bf16, as the list all_gather does.
TEST(ProcessGroup, AllGatherIntoFillsOneFlatTensorInRankOrder) {
  run_ranks(3, [](int64_t rank, ProcessGroup& pg) {
    for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
      torch::Tensor out = torch::empty({3, 4}, dtype);
      pg.all_gather_into(out, rank_input(rank, 4, dtype));
      std::vector<torch::Tensor> expected;
      for (int64_t r = 0; r < 3; ++r) expected.push_back(rank_input(r, 4, dtype));
      EXPECT_TRUE(torch::equal(out, torch::stack(expected))) << dtype;
      EXPECT_TRUE(torch::equal(out, torch::stack(pg.all_gather(rank_input(rank, 4, dtype))))) << dtype;
    }
  });
}

// Counts split the input unevenly, a rank's count may be 0 (it receives nothing but still takes
// part): each rank gets the sum of its chunk, as all_reduce then a slice gives it.
TEST(ProcessGroup, ReduceScatterWithCountsGivesEachRankItsUnevenChunk) {
  for (const std::vector<int64_t>& counts : {std::vector<int64_t>{4, 1, 2}, std::vector<int64_t>{0, 6, 1}}) {
    run_ranks(3, [&counts](int64_t rank, ProcessGroup& pg) {
      const torch::Tensor input = rank_input(rank, 7);
      torch::Tensor expected = input.clone();
      pg.all_reduce(expected);
      int64_t begin = 0;
      for (int64_t r = 0; r < rank; ++r) begin += counts[r];
      torch::Tensor out = torch::empty({counts[rank]});
      pg.reduce_scatter(out, input, counts);
      EXPECT_TRUE(torch::allclose(out, expected.narrow(0, begin, counts[rank]), 1e-6, 1e-6)) << "rank " << rank;
    });
  }
  run_ranks(2, [](int64_t /*rank*/, ProcessGroup& pg) {
    torch::Tensor out = torch::empty({2});
    EXPECT_THAT(testing::error_message([&] { pg.reduce_scatter(out, torch::ones({5}), {2, 2}); }),
                HasSubstr("input has 5 elements and output 2, but the counts sum to 4"));
    pg.barrier();
  });
}

// See Note [Counting bytes on the wire]: each collective adds this rank's share by the ring cost
// model, in bytes of the buffer's dtype.
TEST(ProcessGroup, BytesSentFollowTheRingCostModel) {
  run_ranks(2, [](int64_t /*rank*/, ProcessGroup& pg) {
    const int64_t start = pg.bytes_sent();
    torch::Tensor t = torch::ones({100});  // 400 bytes
    pg.all_reduce(t);
    EXPECT_EQ(pg.bytes_sent() - start, 400);  // 2 (N-1)/N x 400
    torch::Tensor out = torch::empty({50});
    pg.reduce_scatter(out, torch::ones({100}));
    EXPECT_EQ(pg.bytes_sent() - start, 600);  // + the other rank's 50 floats
    torch::Tensor full = torch::empty({100});
    pg.all_gather_into(full, torch::ones({50}));
    EXPECT_EQ(pg.bytes_sent() - start, 800);  // + (N-1)/N x 400
    torch::Tensor bf = torch::ones({100}, torch::kBFloat16);
    pg.broadcast(bf);
    EXPECT_EQ(pg.bytes_sent() - start, 900);  // + (N-1)/N x 200
  });
}

// Shapes are checked on each rank before anything travels, so both ranks fail at once.
TEST(ProcessGroup, UnevenOrEmptyShardsAreRejectedNamingTheSizes) {
  run_ranks(2, [](int64_t rank, ProcessGroup& pg) {
    torch::Tensor out = torch::empty({3});
    auto uneven = testing::error_message([&] { pg.reduce_scatter(out, torch::ones({7})); });
    EXPECT_THAT(uneven, HasSubstr("reduce_scatter on rank " + std::to_string(rank) + " of 2: input has 7 elements and "
                                  "output 3; the input must hold 2 equal, non-empty chunks"));
    EXPECT_THAT(uneven, HasSubstr("pad it to a multiple of 2"));
    torch::Tensor none = torch::empty({0});
    EXPECT_THAT(testing::error_message([&] { pg.reduce_scatter(none, none); }), HasSubstr("input has 0 elements"));
    EXPECT_THAT(testing::error_message([&] { pg.all_gather_into(out, torch::ones({2})); }),
                HasSubstr("input has 2 elements and output 3; the output must hold 2 x input elements"));
    EXPECT_THAT(testing::error_message([&] { pg.all_gather_into(out, torch::ones({2}, torch::kDouble)); }),
                HasSubstr("input is Double but output is Float"));
    pg.barrier();  // the group still works
  });
}

// Rank 1 skips a reduce_scatter: rank 0's error comes within the timeout and names rank 1 and the
// last collective it did call. Rank 1 waits for rank 0's verdict, not for a time.
TEST(ProcessGroup, ReduceScatterTimeoutNamesTheRankThatDidNotArrive) {
  std::promise<std::string> verdict;
  auto rank0_error = verdict.get_future().share();
  const auto t0 = std::chrono::steady_clock::now();
  run_ranks(2, [&](int64_t rank, ProcessGroup& pg) {
    torch::Tensor gathered = torch::empty({4});
    pg.all_gather_into(gathered, torch::ones({2}));
    if (rank == 0) {
      torch::Tensor out = torch::empty({2});
      verdict.set_value(testing::error_message([&] { pg.reduce_scatter(out, torch::ones({4})); }));
    } else {
      rank0_error.wait();
    }
  }, std::chrono::milliseconds(1500));
  const std::string msg = rank0_error.get();
  EXPECT_THAT(msg, HasSubstr("reduce_scatter failed on rank 0 of 2 (timeout 1.5 s)"));
  EXPECT_THAT(msg, HasSubstr("Rank 1 did not sign in within 1.5 s of the failure"));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15));
}

TEST(ProcessGroup, FileInitMethodWorks) {
  testing::TempDir dir;
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto pg = init_process_group(InitOptions().init_method("file://" + (dir / "rdzv")).rank(r)
                                       .world_size(2).timeout(std::chrono::seconds(20)));
      torch::Tensor t = torch::ones({1});
      pg->all_reduce(t);
      if (t.item<float>() == 2.0f) ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 2);
}

TEST(ProcessGroup, RankOutsideWorldIsRejected) {
  auto msg = testing::error_message([] { init_process_group(testing::loopback(2, 2, 1)); });
  EXPECT_THAT(msg, HasSubstr("rank 2 is not smaller than world size 2"));
}

TEST(ProcessGroup, MissingRankTimesOutSayingHowManyArrived) {
  const int port = testing::free_port();
  const auto t0 = std::chrono::steady_clock::now();
  auto msg = testing::error_message(
      [&] { init_process_group(testing::loopback(0, 3, port, std::chrono::milliseconds(1500))); });
  EXPECT_THAT(msg, HasSubstr("1 of 3 ranks arrived"));
  EXPECT_THAT(msg, HasSubstr("127.0.0.1:" + std::to_string(port)));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
}

TEST(ProcessGroup, SilentMasterIsNamedWithAddressAndPort) {
  const int port = testing::free_port();  // nobody listens there
  auto msg = testing::error_message(
      [&] { init_process_group(testing::loopback(1, 2, port, std::chrono::milliseconds(1500))); });
  EXPECT_THAT(msg, HasSubstr("rank 1 of 2: the master at 127.0.0.1:" + std::to_string(port)));
  EXPECT_THAT(msg, HasSubstr("never answered"));
}

TEST(ProcessGroup, PortInUseIsReported) {
  const int port = testing::free_port();
  std::unique_ptr<ProcessGroup> first;
  std::thread peer([&] { first = init_process_group(testing::loopback(0, 1, port)); });
  peer.join();
  auto msg = testing::error_message(
      [&] { init_process_group(testing::loopback(0, 2, port, std::chrono::milliseconds(1500))); });
  EXPECT_THAT(msg, HasSubstr("port may be in use"));
}

// See Note [Naming the rank that did not arrive]: rank 2 stays alive but never joins the
// all-reduce; both ranks that waited for it name it, and only it.
TEST(ProcessGroup, ACollectiveTimeoutNamesTheRankThatDidNotArrive) {
  std::promise<void> reported;
  std::shared_future<void> done = reported.get_future().share();
  std::atomic<int> waiting{2};
  std::vector<std::string> messages(3);
  run_ranks(
      3,
      [&](int64_t rank, ProcessGroup& pg) {
        if (rank == 2) {
          ASSERT_EQ(done.wait_for(std::chrono::seconds(30)), std::future_status::ready);
          return;
        }
        torch::Tensor t = torch::ones({4});
        messages[rank] = testing::error_message([&] { pg.all_reduce(t); });
        if (--waiting == 0) reported.set_value();
      },
      std::chrono::milliseconds(1000));
  for (int64_t rank : {0, 1}) {
    EXPECT_THAT(messages[rank], HasSubstr("all_reduce failed on rank " + std::to_string(rank) + " of 3 (timeout 1 s)"));
    EXPECT_THAT(messages[rank], HasSubstr("Rank 2 did not sign in within 1 s of the failure: it stalled"));
    EXPECT_THAT(messages[rank], HasSubstr("lockstep train --timeout"));
  }
}

// Sets an environment variable for one test and puts back what was there (suites share a process).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() { old_ ? ::setenv(name_, old_->c_str(), 1) : ::unsetenv(name_); }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// GLOO_SOCKET_IFNAME's job (iface): two ranks whose Gloo binds loopback by name reduce, and so
// does a subgroup of theirs, which binds the same interface; describe() says what was bound.
TEST(ProcessGroup, GlooBindsTheNamedInterfaceAndSaysSo) {
  const int port = testing::free_port();
  std::vector<std::string> described(2);
  std::vector<std::exception_ptr> errors(2);
  std::vector<std::thread> ranks;
  for (int64_t r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      try {
        auto group = init_process_group(testing::loopback(r, 2, port).iface("lo"));
        torch::Tensor t = torch::full({3}, static_cast<float>(r + 1));
        group->all_reduce(t);
        EXPECT_TRUE(torch::equal(t, torch::full({3}, 3.0f)));
        auto sub = group->new_group({0, 1});
        torch::Tensor u = torch::full({2}, static_cast<float>(r));
        sub->all_reduce(u);
        EXPECT_TRUE(torch::equal(u, torch::full({2}, 1.0f)));
        described[r] = group->describe();
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : ranks) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  EXPECT_THAT(described[0], HasSubstr("rank 0 of 2; store 127.0.0.1:" + std::to_string(port) + " (tcp"));
  EXPECT_THAT(described[0], HasSubstr("Gloo over "));
  EXPECT_THAT(described[0], HasSubstr("iface=lo"));
  EXPECT_THAT(described[0], HasSubstr("addr=[127.0.0.1]"));
  EXPECT_THAT(described[1], HasSubstr("rank 1 of 2;"));
}

// An interface this host lacks is refused at once, before the rendezvous would wait for the other
// rank, naming where the name came from and the interfaces there are. LOCKSTEP_SOCKET_IFNAME comes
// before PyTorch's GLOO_SOCKET_IFNAME, and the option before both.
TEST(ProcessGroup, AnInterfaceThisHostLacksIsRefusedAtOnceNamingWhereItCameFrom) {
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THAT(testing::error_message([] { init_process_group(testing::loopback(0, 2, 1).iface("nope0")); }),
              ::testing::AllOf(HasSubstr("rank 0 of 2: iface names network interface 'nope0', which this host does "
                                         "not have"),
                               HasSubstr("its interfaces are "), HasSubstr("lo")));
  {
    ScopedEnv gloo("GLOO_SOCKET_IFNAME", "nope1");
    EXPECT_THAT(testing::error_message([] { init_process_group(testing::loopback(1, 2, 1)); }),
                HasSubstr("rank 1 of 2: GLOO_SOCKET_IFNAME names network interface 'nope1'"));
    ScopedEnv ours("LOCKSTEP_SOCKET_IFNAME", "nope2,lo");
    EXPECT_THAT(testing::error_message([] { init_process_group(testing::loopback(1, 2, 1)); }),
                HasSubstr("rank 1 of 2: LOCKSTEP_SOCKET_IFNAME names network interface 'nope2'"));
    EXPECT_THAT(testing::error_message([] { init_process_group(testing::loopback(1, 2, 1).iface("lo,,lo")); }),
                HasSubstr("rank 1 of 2: iface 'lo,,lo' has an empty interface name"));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
}

}  // namespace
}  // namespace lockstep::dist
