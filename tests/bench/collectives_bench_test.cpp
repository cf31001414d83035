// `lockstep bench --collectives` (Note [Collective bandwidths]): rows for every size, collective and
// algorithm, nccl-tests' bandwidth definitions, the same rows on every rank, and its files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <limits>
#include <sstream>

#include "../dist/multi_rank.h"
#include "../test_util.h"
#include "lockstep/bench/collectives_bench.h"

namespace lockstep::bench {
namespace {

using ::testing::HasSubstr;

TEST(CollectivesBench, EverySizeAndCollectiveWithNcclTestsBandwidthsAndTheSameRowsOnEveryRank) {
  std::vector<std::vector<CollectiveTiming>> got(3);
  testing::run_ranks(3, [&](int64_t rank, dist::ProcessGroup& group) {
    got[rank] = run_collectives_bench(
        group, CollectivesBenchOptions().min_bytes(1024).max_bytes(65536).step_factor(8).iterations(3));
  });
  const std::vector<CollectiveTiming>& rows = got[0];
  ASSERT_EQ(rows.size(), 3u * 4u);  // 1 KiB, 8 KiB, 64 KiB x four collectives; one host: flat only
  const std::vector<std::string> order{"all_reduce", "reduce_scatter", "all_gather", "broadcast"};
  const std::vector<double> bus{2.0 * 2 / 3, 2.0 / 3, 2.0 / 3, 1.0};  // N = 3
  for (size_t i = 0; i < rows.size(); ++i) {
    const CollectiveTiming& r = rows[i];
    SCOPED_TRACE(r.collective + " " + std::to_string(r.bytes));
    EXPECT_EQ(r.collective, order[i % 4]);
    EXPECT_EQ(r.algorithm, "flat");
    EXPECT_EQ(r.bytes, int64_t{1024} << (3 * (i / 4)));
    EXPECT_EQ(r.ranks, 3);
    EXPECT_EQ(r.hosts, 1);
    EXPECT_GT(r.seconds, 0.0);
    EXPECT_DOUBLE_EQ(r.algbw_gbps, static_cast<double>(r.bytes) / r.seconds / 1e9);
    EXPECT_DOUBLE_EQ(r.busbw_gbps, r.algbw_gbps * bus[i % 4]);
    for (int64_t rank = 1; rank < 3; ++rank) EXPECT_EQ(got[rank][i].seconds, r.seconds) << "rank " << rank;
  }
  const std::string csv = collectives_csv(rows);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 13);
  EXPECT_THAT(csv, ::testing::StartsWith("collective,algorithm,bytes,ranks,hosts,time_us,algbw_gbps,busbw_gbps\n"
                                         "all_reduce,flat,1024,3,1,"));
  const std::string svg = collectives_chart_svg(rows);
  EXPECT_THAT(svg, HasSubstr("Bus bandwidth by message size, 3 ranks on 1 host"));
  EXPECT_THAT(svg, HasSubstr("data-series=\"all_reduce (flat)\""));
  EXPECT_THAT(svg, HasSubstr("data-x=\"16\""));  // log2(64 KiB)
  EXPECT_THROW(CollectivesBenchOptions().step_factor(1).validate(), c10::ValueError);
}

// Sizes grow only while the product stays at most max_bytes (before: 2^62 x 4 wrapped around);
// the buffers a rank makes for the largest size follow make_call's rotations.
TEST(CollectivesBench, SizesStopBeforeTheirProductOverflowsAndTheirBuffersAreCounted) {
  const int64_t most = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(collective_sizes(CollectivesBenchOptions().min_bytes(int64_t{1} << 62).max_bytes(most)),
            std::vector<int64_t>{int64_t{1} << 62});
  EXPECT_EQ(collective_sizes(CollectivesBenchOptions().min_bytes(1024).max_bytes(65536).step_factor(8)),
            (std::vector<int64_t>{1024, 8192, 65536}));
  // 64 KiB on 3 ranks, one buffer: reduce_scatter's input of 5461 x 3 floats and its output of 5461.
  EXPECT_EQ(collectives_bench_bytes(CollectivesBenchOptions().max_bytes(65536).warm_cache(true), 3), 5461 * 4 * 4);
  // 2^63 - 1 bytes: reduce_scatter's 1.5 x that on 2 ranks passes int64, counted as its largest value.
  EXPECT_EQ(collectives_bench_bytes(CollectivesBenchOptions().min_bytes(most).max_bytes(most), 2), most);
}

// Issue 54 item 15: a size beyond memory is refused on every rank before any buffer is made,
// naming the size, the memory a rank may use and the largest size that fits. Before: LibTorch's
// raw allocation failure (a c10::Error, not a ValueError) from the first buffer.
TEST(CollectivesBench, SizesBeyondMemoryAreRefusedOnEveryRankBeforeAnyBuffer) {
  std::vector<std::string> alone(2), fits(2);
  const auto start = std::chrono::steady_clock::now();
  testing::run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    try {
      run_collectives_bench(group, CollectivesBenchOptions().min_bytes(int64_t{1} << 50).max_bytes(int64_t{1} << 50));
    } catch (const c10::ValueError& e) {
      alone[rank] = e.what_without_backtrace();
    }
  });
  for (int64_t rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_THAT(alone[rank], HasSubstr("collectives bench: messages up to max_bytes 1125899906842624 (1073741824 MiB) "
                                       "need 1610612736.0 MiB of buffers on each of the 2 ranks, more than the "));
    EXPECT_THAT(alone[rank], HasSubstr("not even min_bytes 1125899906842624 fits"));
  }
  ASSERT_FALSE(alone[0].empty());  // before: the sizes below, allocated one by one up to the memory
  testing::run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    try {
      run_collectives_bench(group, CollectivesBenchOptions().max_bytes(int64_t{1} << 50));
    } catch (const c10::ValueError& e) {
      fits[rank] = e.what_without_backtrace();
    }
  });
  EXPECT_THAT(fits[0], HasSubstr("; lower max_bytes to "));
  EXPECT_EQ(fits[0].substr(fits[0].find("; lower")), fits[1].substr(fits[1].find("; lower")));
  // The rank whose share is the smallest names where it came from; the other points to it.
  EXPECT_NE(fits[0].find("(see its own error)") == std::string::npos,
            fits[1].find("(see its own error)") == std::string::npos);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
}

TEST(CollectivesBench, TheCliRunsUnderALauncherAndRefusesToRunAlone) {
  testing::TempDir dir;
  const std::string cli = LOCKSTEP_CLI;
  const auto alone = testing::run_command("timeout 30 " + cli + " bench --collectives --out " + dir.path());
  EXPECT_EQ(alone.exit_code, 2) << alone.output;
  EXPECT_THAT(alone.output, HasSubstr("a collective needs at least 2 ranks; start it under a launcher"));
  const auto run = testing::run_command("timeout 60 " + cli + " run --nproc-per-node 2 --master-port " +
                                        std::to_string(testing::free_port_pair()) + " -- " + cli +
                                        " bench --collectives --max-bytes 4096 --iterations 2 --warm-cache --out " + dir.path());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("all_reduce flat 4 KiB: "));
  EXPECT_THAT(run.output, HasSubstr("wrote " + dir.path() + "/collectives.md"));
  std::istringstream csv(testing::read_text(dir / "collectives.csv"));
  std::string line;
  int lines = 0;
  while (std::getline(csv, line)) ++lines;
  EXPECT_EQ(lines, 1 + 2 * 4);  // 1 KiB and 4 KiB
  EXPECT_THAT(testing::read_text(dir / "collectives.svg"), HasSubstr("<svg"));
  EXPECT_THAT(testing::read_text(dir / "collectives.md"), HasSubstr("| broadcast | flat | 4 KiB |"));
}

}  // namespace
}  // namespace lockstep::bench
