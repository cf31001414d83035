#include "lockstep/bench/runner.h"
#include "lockstep/log/bench_results.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "../test_util.h"

namespace lockstep::bench {
namespace {

using ::testing::HasSubstr;

TEST(BenchMatrix, UsesEveryCoreOnceAndOnlySelectsNamedRows) {
  const auto m = default_matrix(2);
  std::vector<std::string> keys;
  for (const BenchConfig& c : m) {
    keys.push_back(c.key);
    EXPECT_EQ(c.world_size * c.threads, 2) << c.key << ": every row uses the two cores once";
  }
  EXPECT_EQ(keys, (std::vector<std::string>{"fp32", "bf16-o1", "bf16-o2", "bf16-o3", "dp", "ddp", "ddp-bf16",
                                            "ddp-accum", "ddp-syncbn", "zero1", "zero2", "fsdp", "ddp-imagefolder"}));
  const auto picked = select(m, "ddp,fp32");
  ASSERT_EQ(picked.size(), 2u);
  EXPECT_EQ(picked[0].key, "fp32");  // the matrix's order
  EXPECT_EQ(picked[1].key, "ddp");
  EXPECT_THAT(testing::error_message([&] { select(m, "ddp,zero9"); }),
              HasSubstr("--only: unknown configuration 'zero9'; choose from fp32, bf16-o1"));
  EXPECT_THAT(testing::error_message([] { BenchOptions().data("synthetic").peer(true).validate(); }),
              HasSubstr("--peer runs PyTorch on Fashion-MNIST, but --data is 'synthetic'"));
}

TEST(BenchMatrix, ReadsAYamlFileAndNamesTheLineOfAnyMistake) {
  testing::TempDir dir;
  const std::string path = dir / "matrix.yaml";
  auto write = [&](const std::string& text) { std::ofstream(path) << text; };
  write("configurations:\n"
        "  - key: one\n"
        "  - key: two-ranks\n"
        "    name: ddp + bf16\n"
        "    world_size: 2\n"
        "    accum_steps: 2\n"
        "    args: [--precision, bf16]\n"
        "    peer: true\n"
        "    peer_args: [--amp]\n"
        "    note: a note\n");
  const auto m = read_matrix(path, 4);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].key, "one");
  EXPECT_EQ(m[0].name, "one");
  EXPECT_EQ(m[0].world_size, 1);
  EXPECT_EQ(m[0].threads, 4);  // every core, as the built-in single-process rows
  EXPECT_EQ(m[1].name, "ddp + bf16");
  EXPECT_EQ(m[1].world_size * m[1].threads, 4);
  EXPECT_EQ(m[1].accum_steps, 2);
  EXPECT_EQ(m[1].args, (std::vector<std::string>{"--precision", "bf16"}));
  EXPECT_TRUE(m[1].peer);
  EXPECT_EQ(m[1].peer_args, (std::vector<std::string>{"--amp"}));
  EXPECT_EQ(m[1].note, "a note");

  auto error = [&](const std::string& text) {
    write(text);
    return testing::error_message([&] { read_matrix(path, 2); });
  };
  EXPECT_THAT(error("- key: a\n  wold_size: 2\n"), HasSubstr("matrix.yaml:2: unknown field 'wold_size' in "
                                                             "configuration 'a'; fields are key, name, world_size"));
  EXPECT_THAT(error("- key: a\n- key: a\n"), HasSubstr("matrix.yaml:2: key 'a' appears twice"));
  // A key names files in --out: a path is refused before anything runs or is written.
  EXPECT_THAT(error("- key: ../../x\n"), HasSubstr("matrix.yaml:1: key '../../x' must be a plain name"));
  EXPECT_THAT(error("- key: a/b\n"), HasSubstr("key 'a/b' must be a plain name"));
  EXPECT_THAT(error("- key: ..\n"), HasSubstr("key '..' must be a plain name"));
  EXPECT_THAT(error("- key: a,b\n"), HasSubstr("--only separates keys with commas"));
  EXPECT_THAT(error("- key: a\n  world_size: two\n"), HasSubstr("matrix.yaml:2: 'world_size' must be an integer, got 'two'"));
  EXPECT_THAT(error("- key: a\n  world_size: 0\n"), HasSubstr("world_size 0 must be >= 1"));
  EXPECT_THAT(error("- name: a\n"), HasSubstr("matrix.yaml:1: a configuration without 'key'"));
  EXPECT_THAT(error("- key: a\n  args: --sync-bn\n"), HasSubstr("'args' must be a list"));
  EXPECT_THAT(error("runs:\n  - key: a\n"), HasSubstr("must hold a non-empty list of configurations"));
  EXPECT_THAT(error("- key: [a\n"), HasSubstr("matrix.yaml:"));
  // A field whose name is a list: yaml-cpp's "bad conversion" named no file (found writing the
  // bench_matrix fuzz target; fuzz/crashes/bench_matrix/).
  EXPECT_THAT(error("- key: a\n  [x]: 1\n"), HasSubstr("matrix.yaml:2: a field's name must be a word, got '[x]'"));
  EXPECT_THAT(testing::error_message([&] { read_matrix(dir / "none.yaml", 2); }),
              HasSubstr("--matrix: no such file"));
}

// `lockstep bench` on a tiny synthetic configuration: each row runs as its own process (ddp under
// `lockstep run` with two ranks), and the outputs agree with each other and with what the rows
// measured: dp holds two replicas' parameters, ddp all-reduces one copy of the gradients per step,
// the table and the charts carry each row's figures.
TEST(Bench, RunsEachRowAsAChildAndWritesTheTableCsvJsonAndCharts) {
  testing::TempDir dir;
  const std::string matrix = dir / "matrix.yaml";
  std::ofstream(matrix) << ("- {key: fp32, name: local fp32}\n"
                              "- {key: dp, name: dp (DataParallel), args: [--strategy, dp, --replicas, '2']}\n"
                              "- {key: ddp-accum, world_size: 2, accum_steps: 2}\n"
                              "- {key: ddp, world_size: 2, threads: 1}\n");
  const auto r = testing::run_command(std::string(LOCKSTEP_CLI) + " bench --model mlp --data synthetic --limit 200 "
                                      "--batch-size 40 --matrix " + matrix + " --only fp32,dp,ddp --timeout 300 "
                                      "--out " + (dir / "out"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("[1/3] local fp32 (1 x "));
  EXPECT_THAT(r.output, HasSubstr("[3/3] ddp (2 x 1): "));

  const std::filesystem::path out = dir / "out";
  const log::BenchResults b = log::read_bench_results(out.string());
  ASSERT_EQ(b.rows.size(), 3u);
  for (const auto& row : b.rows) {
    EXPECT_TRUE(row.ok) << row.name << ": " << row.error;
    EXPECT_GT(row.samples_per_s, 0) << row.name;
    EXPECT_GT(row.peak_rss_mib, 0) << row.name;
  }
  const auto &local = b.rows[0], &dp = b.rows[1], &ddp = b.rows[2];
  EXPECT_EQ(dp.param_bytes, 2 * local.param_bytes);
  EXPECT_EQ(ddp.param_bytes, local.param_bytes);
  // Measured by the process group (Note [Counting bytes on the wire]): a ring all-reduce of the
  // gradients sends 2(N-1)/N of them, all of them at N = 2, plus the step guard's few-byte vote.
  EXPECT_NEAR(ddp.comm_bytes_per_step, ddp.param_bytes, 64);
  EXPECT_EQ(local.comm_bytes_per_step, 0);
  EXPECT_EQ(ddp.world_size, 2);
  EXPECT_THAT(b.command, HasSubstr("bench --model mlp"));
  // How each row trained, from its run's own log (what bench_advice pairs rows by).
  EXPECT_EQ(local.strategy, "local");
  EXPECT_EQ(dp.strategy, "dp");
  EXPECT_EQ(ddp.strategy, "ddp");
  for (const auto& row : b.rows) {
    EXPECT_EQ(row.precision, "fp32") << row.name;
    EXPECT_EQ(row.opt_level, "O0") << row.name;
    EXPECT_EQ(row.data, "synthetic") << row.name;
    EXPECT_EQ(row.accum_steps, 1) << row.name;
    EXPECT_FALSE(row.sync_bn) << row.name;
  }

  const std::string md = testing::read_text(out / "results.md"), csv = testing::read_text(out / "results.csv");
  for (const auto& row : b.rows) {
    EXPECT_THAT(md, HasSubstr("| " + row.name + " | lockstep |"));
    EXPECT_THAT(csv, HasSubstr(row.name + ",lockstep,"));
  }
  EXPECT_THAT(md, HasSubstr("## What to pick"));
  EXPECT_THAT(md, HasSubstr("**ddp** ran at "));  // against dp, with this run's figures
  EXPECT_THAT(md, HasSubstr("**dp (DataParallel)**'s speed"));
  const std::string speed = testing::read_text(out / "throughput.svg");
  const std::regex bar("data-value=\"([^\"]*)\"");
  std::vector<double> values;
  for (auto it = std::sregex_iterator(speed.begin(), speed.end(), bar); it != std::sregex_iterator(); ++it)
    values.push_back(std::stod((*it)[1]));
  ASSERT_EQ(values.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(values[i], b.rows[i].samples_per_s, 1e-6 * b.rows[i].samples_per_s);
  EXPECT_THAT(testing::read_text(out / "memory.svg"), HasSubstr("data-series=\"optimizer state\""));
  EXPECT_TRUE(std::filesystem::exists(out / "logs/ddp.log"));
}

// A results.json whose field has another type is named with the file and the row, not with
// nlohmann's bare "type must be number, but is string".
TEST(BenchResultsFile, AFieldOfAnotherTypeIsNamedWithTheFileAndTheRow) {
  testing::TempDir dir;
  std::ofstream(dir / "results.json")
      << R"({"date":"d","cpu":"c","cores":2,"command":"x","rows":[)"
      << R"({"name":"ddp","implementation":"lockstep","ok":true},)"
      << R"({"name":"fsdp","implementation":"lockstep","ok":true,"world_size":"two"}]})";
  EXPECT_THAT(testing::error_message([&] { log::read_bench_results(dir.path()); }),
              ::testing::AllOf(HasSubstr("'" + (dir / "results.json") + "' in rows[1]: "),
                               HasSubstr("type must be number, but is string")));
}

}  // namespace
}  // namespace lockstep::bench
