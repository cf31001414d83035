#include "lockstep/bench/runner.h"

#include <c10/util/Exception.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>

#include "lockstep/bench/child_run.h"
#include "lockstep/core/atomic_file.h"
#include "lockstep/core/process.h"
#include "lockstep/data/image_folder.h"
#include "lockstep/launch/rendezvous.h"
#include "lockstep/log/run_record.h"

namespace lockstep::bench {
namespace {

// Reads a finished row's summary into `r`: ok, or the error; on success the fields every run
// reports (time, samples/s, peak RSS, accuracy). Returns the summary (null on failure).
nlohmann::json read_summary(log::BenchRow& r, const std::optional<int>& code, const std::string& log_path,
                            double timeout_s) {
  nlohmann::json s = last_json(log_path);
  r.ok = code == 0 && !s.is_null();
  if (!r.ok) {
    r.error = failure(log_path, code, timeout_s);
    return nullptr;
  }
  r.train_s = s.value("train_s", 0.0), r.samples_per_s = s.value("samples_per_s", 0.0);
  r.peak_rss_mib = s.value("peak_rss_mib", 0.0), r.test_acc = s.value("test_acc", 0.0);
  return s;
}

log::BenchRow lockstep_row(const BenchOptions& o, const BenchConfig& c, const std::string& log_path) {
  const int64_t batch = std::max<int64_t>(1, o.global_batch() / (c.world_size * c.accum_steps));
  std::vector<std::string> train{o.lockstep(), "train", "--quiet", "--model", o.model(), "--data", o.data(),
                                 "--limit", std::to_string(o.limit()), "--epochs", std::to_string(o.epochs()),
                                 "--batch-size", std::to_string(batch), "--accum-steps", std::to_string(c.accum_steps),
                                 "--lr", std::to_string(o.lr()), "--threads", std::to_string(c.threads),
                                 // The check's dry run holds a whole local replica for a moment,
                                 // which would set a sharded row's peak RSS (docs/memory-plan.md).
                                 "--ignore-memory-plan"};
  if (std::count(c.args.begin(), c.args.end(), "--data") > 0) train.erase(train.begin() + 5, train.begin() + 7);
  // The run's JSONL log: its settings as it resolved them (bench_advice pairs rows by them).
  const std::string jsonl = std::filesystem::path(log_path).replace_extension(".jsonl").string();
  std::filesystem::remove(jsonl);
  train.insert(train.end(), {"--log-jsonl", jsonl});
  for (const std::string& arg : c.args)  // See kImageFolder.
    train.push_back(arg.rfind(kImageFolder, 0) == 0 ? o.out() + "/imagefolder" + arg.substr(std::strlen(kImageFolder)) : arg);
  std::vector<std::string> argv;
  if (c.world_size > 1) argv = {o.lockstep(), "run", "--nproc-per-node", std::to_string(c.world_size), "--"};
  argv.insert(argv.end(), train.begin(), train.end());
  log::BenchRow r;
  r.name = c.name, r.world_size = c.world_size, r.threads = c.threads, r.note = c.note;
  r.setup = std::to_string(c.world_size) + " x " + std::to_string(c.threads) + ", batch " + std::to_string(batch) +
            (c.accum_steps > 1 ? " x " + std::to_string(c.accum_steps) + " micro-batches" : "");
  const auto code = run_child(argv, {"OMP_NUM_THREADS=" + std::to_string(c.threads)}, log_path, o.timeout());
  const nlohmann::json s = read_summary(r, code, log_path, o.timeout());
  if (!r.ok) return r;
  r.final_loss = s.value("final_loss", 0.0);
  r.param_bytes = s.value("param_bytes", int64_t{0}), r.grad_bytes = s.value("grad_bytes", int64_t{0});
  r.optim_bytes = s.value("optim_bytes", int64_t{0});
  r.comm_bytes_per_step = s.value("sent_bytes_per_step", int64_t{0});
  const nlohmann::ordered_json settings = log::read_run_log(jsonl).settings;
  if (settings.is_object()) {
    r.strategy = settings.value("strategy", ""), r.precision = settings.value("precision", "");
    r.opt_level = settings.value("opt_level", ""), r.sync_bn = settings.value("sync_bn", false);
    r.data = settings.value("data", ""), r.accum_steps = settings.value("accum_steps", int64_t{1});
  }
  return r;
}

log::BenchRow peer_row(const BenchOptions& o, const BenchConfig& c, const std::string& log_path) {
  const int64_t batch = std::max<int64_t>(1, o.global_batch() / c.world_size);
  std::vector<std::string> argv{"bash", o.peer_dir() + "/run_ddp.sh", "--model", o.model(), "--epochs",
                                std::to_string(o.epochs()), "--limit", std::to_string(o.limit()), "--batch",
                                std::to_string(batch), "--lr", std::to_string(o.lr())};
  argv.insert(argv.end(), c.peer_args.begin(), c.peer_args.end());
  log::BenchRow r;
  r.name = c.name, r.implementation = "pytorch", r.world_size = c.world_size, r.threads = c.threads;
  r.setup = std::to_string(c.world_size) + " x " + std::to_string(c.threads) + ", batch " + std::to_string(batch);
  r.note = "PyTorch DDP on Gloo (bench/fmnist_ddp.py); reports no loss or memory breakdown";
  const auto code = run_child(argv, {"N=" + std::to_string(c.world_size), "PORT=" + std::to_string(launch::free_tcp_port()),
                                     "OMP_NUM_THREADS=" + std::to_string(c.threads)},
                              log_path, o.timeout());
  read_summary(r, code, log_path, o.timeout());
  if (!r.ok) return r;
  r.final_loss = NAN;
  const bool amp = std::count(c.peer_args.begin(), c.peer_args.end(), "--amp") > 0;  // autocast to bf16
  r.strategy = "ddp", r.precision = amp ? "bf16" : "fp32", r.opt_level = amp ? "O1" : "O0", r.data = o.data();
  return r;
}

std::string row_line(const log::BenchRow& r) {
  char buf[256];
  if (!r.ok) return "failed: " + r.error;
  std::snprintf(buf, sizeof(buf), "%.1f s, %.0f samples/s, peak RSS %.0f MiB, test acc %.4f", r.train_s,
                r.samples_per_s, r.peak_rss_mib, r.test_acc);
  return buf;
}

}  // namespace

void BenchOptions::validate() const {
  TORCH_CHECK_VALUE(epochs() >= 1, "--epochs ", epochs(), " must be at least 1");
  TORCH_CHECK_VALUE(limit() >= 0, "--limit ", limit(), " must be >= 0 (0: all samples)");
  TORCH_CHECK_VALUE(global_batch() >= 2, "--batch-size ", global_batch(), " must be at least 2 (it is split over ranks)");
  TORCH_CHECK_VALUE(timeout() > 0, "--timeout ", timeout(), " must be > 0 seconds");
  TORCH_CHECK_VALUE(!peer() || data() == "fashion-mnist", "--peer runs PyTorch on Fashion-MNIST, but --data is '", data(),
                    "': drop --peer or use --data fashion-mnist");
  TORCH_CHECK_VALUE(!peer() || std::filesystem::exists(peer_dir() + "/run_ddp.sh"), "--peer: no run_ddp.sh in --peer-dir '",
                    peer_dir(), "': point --peer-dir at the Python peer (bench/ in lockstep's tree)");
}

log::BenchResults run_bench(const BenchOptions& o, const std::vector<BenchConfig>& matrix,
                            const std::function<void(const std::string&)>& progress) {
  o.validate();
  std::vector<BenchConfig> rows = select(matrix, o.only());
  std::filesystem::create_directories(o.out() + "/logs");
  const auto names_folder = [](const BenchConfig& c) {
    return std::any_of(c.args.begin(), c.args.end(), [](const std::string& a) { return a.rfind(kImageFolder, 0) == 0; });
  };
  if (std::any_of(rows.begin(), rows.end(), names_folder)) {
    if (o.data() != "fashion-mnist") {
      progress("skipping the rows that train from the image folder: it is written from --data fashion-mnist");
      rows.erase(std::remove_if(rows.begin(), rows.end(), names_folder), rows.end());
    } else {
      const std::string folder = o.out() + "/imagefolder";
      std::filesystem::remove_all(folder);
      progress("writing Fashion-MNIST as PNG files into " + folder + " ...");
      const auto dir = std::string(data::kDefaultFashionMnistDir);
      const int64_t n = data::write_image_folder(data::load_fashion_mnist(dir, data::Split::kTrain).take(o.limit()),
                                                 folder + "/train") +
                        data::write_image_folder(data::load_fashion_mnist(dir, data::Split::kTest), folder + "/test");
      progress("wrote " + std::to_string(n) + " PNG files");
    }
  }
  log::BenchResults results;
  results.date = utc_now(), results.cpu = cpu_model(), results.cores = available_cores(), results.command = o.command();
  size_t total = rows.size();
  for (const BenchConfig& c : rows) total += o.peer() && c.peer ? 1 : 0;
  size_t done = 0;
  auto run = [&](const std::string& label, const std::string& log, auto&& how) {
    progress("[" + std::to_string(done + 1) + "/" + std::to_string(total) + "] " + label + " ...");
    results.rows.push_back(how(o.out() + "/logs/" + log));
    progress("[" + std::to_string(++done) + "/" + std::to_string(total) + "] " + label + ": " +
             row_line(results.rows.back()));
  };
  for (const BenchConfig& c : rows) {
    const std::string shape = " (" + std::to_string(c.world_size) + " x " + std::to_string(c.threads) + ")";
    run(c.name + shape, c.key + ".log", [&](const std::string& log) { return lockstep_row(o, c, log); });
    if (o.peer() && c.peer)
      run("pytorch " + c.name + shape, c.key + ".pytorch.log", [&](const std::string& log) { return peer_row(o, c, log); });
  }
  write_bench_outputs(results, o.out());
  return results;
}

void write_bench_outputs(const log::BenchResults& results, const std::string& dir) {
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    write_file_atomic(dir + "/" + name, std::vector<char>(text.begin(), text.end()));
  };
  write("results.json", log::to_json(results).dump(2) + "\n");
  write("results.csv", log::to_csv(results));
  write("results.md", log::to_markdown(results));
  write("throughput.svg", log::throughput_chart_svg(results));
  write("memory.svg", log::memory_chart_svg(results));
}

}  // namespace lockstep::bench
