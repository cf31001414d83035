// `lockstep bench --collectives` (Note [Collective bandwidths]): rows for every size, collective and
// algorithm, nccl-tests' bandwidth definitions, the same rows on every rank, and its files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

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
