// `lockstep bench`: one model and data set under every strategy x precision configuration, or
// (--pipeline-sweep) one process, model parallel and pipelined micro-batch counts.
#include <unistd.h>

#include <climits>
#include <filesystem>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "checks.h"
#include "commands.h"
#include "lockstep/bench/collectives_bench.h"
#include "lockstep/bench/loader_bench.h"
#include "lockstep/bench/pipeline_sweep.h"
#include "lockstep/bench/runner.h"
#include "lockstep/core/process.h"
#include "lockstep/core/world.h"

namespace lockstep::cli {
namespace {

// This executable's path, so every row runs the same lockstep.
std::string self_path(const std::string& fallback) {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : fallback;
}

// --collectives: every rank of the launcher's group measures; rank 0 prints and writes the results.
int run_collectives(bench::CollectivesBenchOptions options, const std::string& out) {
  const WorldInfo world = world_from_env();
  if (world.world_size < 2) {
    std::cerr << "lockstep bench --collectives: a collective needs at least 2 ranks; start it under a launcher, "
                 "e.g. lockstep run --nproc-per-node 2 -- lockstep bench --collectives\n";
    return 2;
  }
  auto group = dist::init_process_group();
  if (group->rank() == 0) {
    std::filesystem::create_directories(out);
    std::cout << "process group: " << group->describe() << std::endl;
  }
  options.out(out);
  bench::run_collectives_bench(*group, options, [](const std::string& line) { std::cout << line << std::endl; });
  if (group->rank() == 0)
    std::cout << "lockstep bench: wrote " << out << "/collectives.md (and .csv, collectives.svg)" << std::endl;
  return 0;
}

}  // namespace

Command add_bench_command(CLI::App& app, const std::string& argv0, const std::string& command_line) {
  CLI::App* cmd = app.add_subcommand(
      "bench", "Train one model under every strategy x precision configuration; table, CSV, JSON and SVG charts");
  cmd->option_defaults()->always_capture_default();
  auto o = std::make_shared<bench::BenchOptions>();
  cmd->add_option("--model", o->model(), "Reference model every row trains");
  cmd->add_option("--data", o->data(), "fashion-mnist or synthetic");
  cmd->add_option("--limit", o->limit(), "Training samples (0: all)")->check(cli::non_negative_count());
  cmd->add_option("--epochs", o->epochs(), "Epochs per row")->check(cli::positive_count());
  cmd->add_option("--batch-size", o->global_batch(), "Global batch: samples per optimizer step over all ranks")
      ->check(cli::positive_count());
  cmd->add_option("--lr", o->lr(), "SGD learning rate (momentum 0.9), for lockstep and the peer alike");
  cmd->add_option("--only", o->only(), "Comma-separated configurations to run (default: all; see results.md)");
  auto matrix_file = std::make_shared<std::string>();
  cmd->add_option("--matrix", *matrix_file, "YAML file of configurations to run instead of the built-in matrix");
  cmd->add_flag("--peer", o->peer(), "Also run PyTorch's DDP (the Python peer), alternating with lockstep's rows");
  cmd->add_option("--peer-dir", o->peer_dir(), "Directory of the Python peer (run_ddp.sh, fmnist_ddp.py)");
  cmd->add_option("--out", o->out(), "Directory for results.csv/.json/.md, throughput.svg, memory.svg and logs/");
  cmd->add_option("--timeout", o->timeout(), "Seconds one row may take before it is killed")
      ->check(cli::positive_number());
  auto sweep = std::make_shared<bench::PipelineSweepOptions>();
  auto sweep_flag = std::make_shared<bool>(false);
  const std::string pipe = "Pipeline sweep";
  cmd->add_flag("--pipeline-sweep", *sweep_flag,
                "Instead of the matrix: one process, plain model parallel and pipelined runs over --micro-batch-counts "
                "(both schedules); pipeline_sweep.md/.csv/.json, time_per_step.svg, idle.svg")->group(pipe);
  cmd->add_option("--stages", sweep->stages(), "Pipeline stages (ranks) of the sweep's model-parallel and pipelined runs")
      ->check(cli::positive_count())->group(pipe);
  cmd->add_option("--micro-batch-counts", sweep->micro_batches(), "The sweep's micro-batch counts M, e.g. 2,4,8,16,32")
      ->delimiter(',')->check(cli::positive_count())->group(pipe);
  cmd->add_option("--balance", sweep->balance(),
                  "How the sweep's pipelines cut their stages: time (equal measured time) or params")
      ->capture_default_str()->group(pipe);
  auto loader = std::make_shared<bench::LoaderBenchOptions>();
  auto loader_flag = std::make_shared<bool>(false);
  const std::string load = "Loader (--loader)";
  cmd->add_flag("--loader", *loader_flag,
                "Instead of the matrix: the data loader alone over an image folder (--batch-size, --epochs); one JSON "
                "line with images/s")->group(load);
  cmd->add_option("--data-dir", loader->data_dir(), "The image folder (torchvision's ImageFolder layout)")->group(load);
  cmd->add_option("--transform", loader->transform(), "torchvision transforms, as lockstep train takes them")
      ->group(load);
  cmd->add_option("--workers", loader->loader().workers(), "Loader threads (0: on the calling thread)")
      ->check(cli::non_negative_count())->group(load);
  cmd->add_option("--prefetch", loader->loader().prefetch(), "Batches each worker builds ahead")
      ->check(cli::positive_count())->group(load);
  auto collectives = std::make_shared<bench::CollectivesBenchOptions>();
  auto collectives_flag = std::make_shared<bool>(false);
  const std::string coll = "Collectives (--collectives, under a launcher)";
  cmd->add_flag("--collectives", *collectives_flag,
                "Instead of the matrix: time all-reduce (each algorithm the hosts allow), reduce-scatter, all-gather "
                "and broadcast over the launcher's ranks, nccl-tests style; collectives.md/.csv/.svg")
      ->group(coll);
  cmd->add_option("--min-bytes", collectives->min_bytes(), "Smallest message (nccl-tests' -b)")
      ->check(cli::positive_count())->group(coll);
  cmd->add_option("--max-bytes", collectives->max_bytes(), "Largest message (nccl-tests' -e)")
      ->check(cli::positive_count())->group(coll);
  cmd->add_option("--step-factor", collectives->step_factor(), "Each size is the previous one times this (-f)")
      ->check(cli::positive_count())->group(coll);
  cmd->add_option("--iterations", collectives->iterations(), "Timed samples per size; the median is reported (-n)")
      ->check(cli::positive_count())->group(coll);
  cmd->add_flag("--warm-cache", collectives->warm_cache(),
                "Every call reuses one buffer, which stays in cache between calls (Intel MPI Benchmarks' default); "
                "by default calls rotate through buffers spanning twice the last-level cache")
      ->group(coll);
  return {cmd, [cmd, o, matrix_file, sweep, sweep_flag, loader, loader_flag, collectives, collectives_flag, argv0,
                command_line] {
            if (*collectives_flag) return run_collectives(*collectives, o->out());
            if (*loader_flag) {
              // --batch-size's default is the matrix's global batch; the loader's own is DataLoader
              // benchmarks' 64.
              if (cmd->get_option("--batch-size")->count() > 0) loader->batch_size(o->global_batch());
              loader->epochs(o->epochs());
              const bench::LoaderBenchResult r = bench::run_loader_bench(*loader);
              std::cout << nlohmann::json{{"images", r.images}, {"seconds", r.seconds}, {"images_per_s", r.images_per_s},
                                          {"workers", loader->loader().workers()}, {"checksum", r.checksum}}
                               .dump()
                        << std::endl;
              return 0;
            }
            o->lockstep(self_path(argv0)).command(command_line);
            const auto print = [](const std::string& line) { std::cout << line << std::endl; };
            if (*sweep_flag) {
              const auto results = bench::run_pipeline_sweep(*o, *sweep, print);
              std::cout << "lockstep bench: wrote " << o->out() << "/pipeline_sweep.md (and .csv, .json, "
                        << "time_per_step.svg, idle.svg)\n";
              for (const auto& r : results.rows)
                if (!r.ok) return 1;
              return 0;
            }
            const int64_t cores = available_cores();
            const auto matrix =
                matrix_file->empty() ? bench::default_matrix(cores) : bench::read_matrix(*matrix_file, cores);
            const auto results = bench::run_bench(*o, matrix, print);
            std::cout << "lockstep bench: wrote " << o->out() << "/results.md (and .csv, .json, throughput.svg, "
                      << "memory.svg)\n";
            for (const auto& r : results.rows)
              if (!r.ok) return 1;
            return 0;
          }};
}

}  // namespace lockstep::cli
