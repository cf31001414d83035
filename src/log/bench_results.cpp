#include "lockstep/log/bench_results.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "lockstep/core/process.h"
#include "lockstep/log/svg_chart.h"
#include "json_number.h"

namespace lockstep::log {
namespace {


std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string mib(int64_t bytes) { return fixed(static_cast<double>(bytes) / kMiB, 2); }

std::string label(const BenchRow& r) { return r.implementation == "lockstep" ? r.name : r.implementation + " " + r.name; }

}  // namespace

nlohmann::ordered_json to_json(const BenchResults& b) {
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const BenchRow& r : b.rows)
    rows.push_back({{"name", r.name}, {"implementation", r.implementation}, {"setup", r.setup},
                    {"world_size", r.world_size}, {"threads", r.threads}, {"ok", r.ok}, {"error", r.error},
                    {"train_s", r.train_s}, {"samples_per_s", r.samples_per_s}, {"peak_rss_mib", r.peak_rss_mib},
                    {"param_bytes", r.param_bytes}, {"grad_bytes", r.grad_bytes}, {"optim_bytes", r.optim_bytes},
                    {"comm_bytes_per_step", r.comm_bytes_per_step}, {"final_loss", r.final_loss},
                    {"test_acc", r.test_acc}, {"note", r.note}, {"strategy", r.strategy},
                    {"precision", r.precision}, {"opt_level", r.opt_level}, {"sync_bn", r.sync_bn},
                    {"data", r.data}, {"accum_steps", r.accum_steps}});
  return {{"date", b.date}, {"cpu", b.cpu}, {"cores", b.cores}, {"command", b.command}, {"rows", std::move(rows)}};
}

namespace {

BenchResults results_from_json(const nlohmann::ordered_json& j, const std::string& source, std::string& where) {
  auto need = [&](const nlohmann::ordered_json& o, const char* key) -> const nlohmann::ordered_json& {
    TORCH_CHECK(o.is_object() && o.contains(key), source, " has no '", key,
                "': expected the results.json `lockstep bench --out DIR` writes");
    return o.at(key);
  };
  BenchResults b;
  b.date = need(j, "date").get<std::string>();
  b.cpu = need(j, "cpu").get<std::string>();
  b.cores = need(j, "cores").get<int64_t>();
  b.command = need(j, "command").get<std::string>();
  for (const auto& o : need(j, "rows")) {
    where = " in rows[" + std::to_string(b.rows.size()) + "]";
    BenchRow r;
    r.name = need(o, "name").get<std::string>();
    r.implementation = need(o, "implementation").get<std::string>();
    r.setup = o.value("setup", "");
    r.world_size = o.value("world_size", int64_t{1});
    r.threads = o.value("threads", int64_t{1});
    r.ok = need(o, "ok").get<bool>();
    r.error = o.value("error", "");
    r.train_s = o.value("train_s", 0.0);
    r.samples_per_s = o.value("samples_per_s", 0.0);
    r.peak_rss_mib = o.value("peak_rss_mib", 0.0);
    r.param_bytes = o.value("param_bytes", int64_t{0});
    r.grad_bytes = o.value("grad_bytes", int64_t{0});
    r.optim_bytes = o.value("optim_bytes", int64_t{0});
    r.comm_bytes_per_step = o.value("comm_bytes_per_step", int64_t{0});
    r.final_loss = json_number(o, "final_loss");
    r.test_acc = o.value("test_acc", 0.0);
    r.note = o.value("note", "");
    r.strategy = o.value("strategy", "");
    r.precision = o.value("precision", "");
    r.opt_level = o.value("opt_level", "");
    r.sync_bn = o.value("sync_bn", false);
    r.data = o.value("data", "");
    r.accum_steps = o.value("accum_steps", int64_t{1});
    b.rows.push_back(std::move(r));
  }
  return b;
}

}  // namespace

BenchResults bench_results_from_json(const nlohmann::ordered_json& j, const std::string& source) {
  std::string where;  // the row being read
  try {
    return results_from_json(j, source, where);
  } catch (const nlohmann::json::exception& e) {  // a field of another type: name the file and the row
    TORCH_CHECK(false, source, where, ": ", e.what(), "; expected the results.json `lockstep bench --out DIR` writes");
  }
}

BenchResults read_bench_results(const std::string& dir) {
  const std::string path = dir + "/results.json";
  std::ifstream in(path);
  TORCH_CHECK(in, "cannot read '", path, "': pass the --out directory of a `lockstep bench` run");
  const auto j = nlohmann::ordered_json::parse(in, nullptr, /*allow_exceptions=*/false);
  TORCH_CHECK(!j.is_discarded(), "'", path, "' is not valid JSON");
  return bench_results_from_json(j, "'" + path + "'");
}

std::string to_csv(const BenchResults& b) {
  std::string out = "name,implementation,setup,world_size,threads,ok,train_s,samples_per_s,peak_rss_mib,param_bytes,"
                    "grad_bytes,optim_bytes,comm_bytes_per_step,final_loss,test_acc,note,error\n";
  for (const BenchRow& r : b.rows)
    out += csv_field(r.name) + "," + r.implementation + "," + csv_field(r.setup) + "," + std::to_string(r.world_size) +
           "," + std::to_string(r.threads) + "," + (r.ok ? "true" : "false") + "," + fixed(r.train_s, 3) + "," +
           fixed(r.samples_per_s, 1) + "," + fixed(r.peak_rss_mib, 1) + "," + std::to_string(r.param_bytes) + "," +
           std::to_string(r.grad_bytes) + "," + std::to_string(r.optim_bytes) + "," +
           std::to_string(r.comm_bytes_per_step) + "," + fixed(r.final_loss, 6) + "," + fixed(r.test_acc, 4) + "," +
           csv_field(r.note) + "," + csv_field(r.error) + "\n";
  return out;
}

std::string to_markdown(const BenchResults& b) {
  std::ostringstream md;
  md << "# lockstep bench\n\n- Date: " << b.date << "\n- CPU: " << b.cpu << " (" << b.cores << " cores)\n"
     << "- Command: `" << b.command << "`\n\n"
     << "| configuration | impl | ranks x threads | train s | samples/s | peak RSS MiB (rank 0) | params MiB | grads MiB "
        "| optimizer MiB | comm MiB/step | final loss | test acc |\n"
     << "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const BenchRow& r : b.rows) {
    md << "| " << r.name << " | " << r.implementation << " | " << r.world_size << " x " << r.threads << " | ";
    if (!r.ok) {
      md << "failed: " << r.error << " | | | | | | | | |\n";
      continue;
    }
    md << fixed(r.train_s, 2) << " | " << fixed(r.samples_per_s, 0) << " | " << fixed(r.peak_rss_mib, 0) << " | ";
    if (r.implementation == "lockstep") {
      md << mib(r.param_bytes) << " | " << mib(r.grad_bytes) << " | " << mib(r.optim_bytes) << " | ";
    } else {
      md << "n/a | n/a | n/a | ";
    }
    md
       << (r.implementation == "lockstep" ? mib(r.comm_bytes_per_step) : "n/a") << " | " << (std::isfinite(r.final_loss) ? fixed(r.final_loss, 4) : "n/a") << " | " << fixed(r.test_acc, 4) << " |\n";
  }
  md << "\n";
  for (const BenchRow& r : b.rows)
    if (!r.note.empty()) md << "- **" << label(r) << "**: " << r.note << "\n";
  md << "\n## What to pick\n\n";
  for (const std::string& sentence : bench_advice(b)) md << "- " << sentence << "\n";
  return md.str();
}

std::string throughput_chart_svg(const BenchResults& b) {
  std::vector<std::string> categories;
  BarSeries speed{"samples/s", {}};
  for (const BenchRow& r : b.rows) {
    if (!r.ok) continue;
    categories.push_back(label(r) + " (" + std::to_string(r.world_size) + "x" + std::to_string(r.threads) + ")");
    speed.values.push_back(r.samples_per_s);
  }
  return bar_chart_svg(BarChartOptions().title("Training throughput per configuration (higher is better)")
                           .value_label("samples per second, all ranks").width(720),
                       categories, {speed});
}

std::string memory_chart_svg(const BenchResults& b) {
  std::vector<std::string> categories;
  BarSeries params{"parameters", {}}, grads{"gradients", {}}, optim{"optimizer state", {}}, other{"other (peak RSS)", {}};
  for (const BenchRow& r : b.rows) {
    if (!r.ok) continue;
    categories.push_back(label(r));
    const double p = r.param_bytes / kMiB, g = r.grad_bytes / kMiB, o = r.optim_bytes / kMiB;
    params.values.push_back(p);
    grads.values.push_back(g);
    optim.values.push_back(o);
    other.values.push_back(std::max(0.0, r.peak_rss_mib - p - g - o));
  }
  return bar_chart_svg(BarChartOptions().title("Memory of rank 0 per configuration (lower is better)")
                           .value_label("MiB (the bar's length is the peak resident set size)").width(720),
                       categories, {params, grads, optim, other});
}

}  // namespace lockstep::log
