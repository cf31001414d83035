// See Note [Collective bandwidths].
#include "lockstep/bench/collectives_bench.h"

#include <c10/util/StringUtil.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>

#include "lockstep/core/atomic_file.h"
#include "lockstep/log/svg_chart.h"
#include "lockstep/train/memory_limit.h"

namespace lockstep::bench {
namespace {

using log::fixed;

using Clock = std::chrono::steady_clock;
constexpr double kSampleSeconds = 0.1;  // see Note [Collective bandwidths]
constexpr int64_t kMaxSlots = 1024;      // views a cold call rotates through at most

// Bytes of buffers each call rotates through (Note [Collective bandwidths]): twice the last-level
// cache, so no call finds its data still in cache from the one before it.
int64_t cold_pool_bytes() {
  const long llc = ::sysconf(_SC_LEVEL3_CACHE_SIZE);
  return 2 * (llc > 0 ? static_cast<int64_t>(llc) : int64_t{32} << 20);
}

// a x b for a, b >= 0, or INT64_MAX where that overflows: past any machine's memory either way.
int64_t saturating_mul(int64_t a, int64_t b) {
  int64_t out = 0;
  return __builtin_mul_overflow(a, b, &out) ? std::numeric_limits<int64_t>::max() : out;
}

// How many buffers of `bytes` a call rotates through (Note [Collective bandwidths]).
int64_t rotation_slots(int64_t bytes, bool warm) {
  if (warm) return 1;
  const int64_t pool = cold_pool_bytes(), size = std::max<int64_t>(bytes, 4);
  return std::clamp<int64_t>(pool / size + (pool % size != 0 ? 1 : 0), 1, kMaxSlots);  // ceil, no sum to overflow
}

// `slots` equal buffers of `numel` fp32 cut from one allocation; call c uses slot c % slots.
struct Rotation {
  std::vector<torch::Tensor> slots;
  int64_t next = 0;
  Rotation(int64_t numel, int64_t count) {
    const torch::Tensor all = torch::ones({numel * count});
    for (int64_t s = 0; s < count; ++s) slots.push_back(all.narrow(0, s * numel, numel));
  }
  torch::Tensor& take() { return slots[static_cast<size_t>(next++ % static_cast<int64_t>(slots.size()))]; }
};

// One call of `collective` on `group` with fp32 buffers of `bytes` (Note [Collective bandwidths]).
struct Call {
  std::function<void()> run;
  double bus_factor;
};

Call make_call(dist::ProcessGroup& group, const std::string& collective, int64_t bytes, bool warm) {
  const int64_t n = group.size(), numel = std::max<int64_t>(1, bytes / 4);
  const double ring = static_cast<double>(n - 1) / static_cast<double>(n);
  const int64_t slots = rotation_slots(bytes, warm);
  if (collective == "all_reduce" || collective == "broadcast") {
    auto t = std::make_shared<Rotation>(numel, slots);
    if (collective == "all_reduce") return {[&group, t] { group.all_reduce(t->take()); }, 2.0 * ring};
    return {[&group, t] { group.broadcast(t->take(), 0); }, 1.0};
  }
  const int64_t part = std::max<int64_t>(1, numel / n);  // S rounded down to N equal parts
  auto whole = std::make_shared<Rotation>(part * n, slots);
  auto mine = std::make_shared<Rotation>(part, slots);
  if (collective == "reduce_scatter")
    return {[&group, whole, mine] { group.reduce_scatter(mine->take(), whole->take()); }, ring};
  return {[&group, whole, mine] { group.all_gather_into(whole->take(), mine->take()); }, ring};
}

// The slowest rank's mean seconds per call over `calls` back to back, the same on every rank.
double timed(dist::ProcessGroup& group, const std::function<void()>& run, int64_t calls) {
  group.barrier();
  const auto start = Clock::now();
  for (int64_t c = 0; c < calls; ++c) run();
  const double took = std::chrono::duration<double>(Clock::now() - start).count() / static_cast<double>(calls);
  torch::Tensor slowest = torch::tensor({took}, torch::kDouble);
  group.all_reduce(slowest, dist::ReduceOp::kMax);
  return slowest.item<double>();
}

std::string size_name(int64_t bytes) {
  if (bytes >= (int64_t{1} << 20)) return c10::str(bytes >> 20, " MiB");
  if (bytes >= (int64_t{1} << 10)) return c10::str(bytes >> 10, " KiB");
  return c10::str(bytes, " B");
}

// See Note [Collective bandwidths]: the smallest share among the ranks decides for all of them.
void check_memory(dist::ProcessGroup& world, const CollectivesBenchOptions& options) {
  const std::vector<int64_t>& host_of_rank = world.host_of_rank();
  const auto local = static_cast<int64_t>(std::count(host_of_rank.begin(), host_of_rank.end(), host_of_rank[world.rank()]));
  const train::MemoryLimit limit = train::available_memory(train::MemoryLimitOptions().local_ranks(local));
  torch::Tensor least = torch::tensor({static_cast<double>(limit.bytes)}, torch::kDouble);
  world.all_reduce(least, dist::ReduceOp::kMin);
  const auto smallest = static_cast<int64_t>(least.item<double>());  // bytes: exact in a double below 2^53
  const int64_t needed = collectives_bench_bytes(options, world.size());
  if (needed <= smallest) return;
  torch::Tensor who = torch::tensor({static_cast<double>(limit.bytes <= smallest ? world.rank() : world.size())},
                                    torch::kDouble);
  world.all_reduce(who, dist::ReduceOp::kMin);
  const auto rank = static_cast<int64_t>(who.item<double>());
  int64_t fits = 0;  // the largest of the run's sizes whose buffers fit
  for (int64_t bytes : collective_sizes(options))
    if (collectives_bench_bytes(CollectivesBenchOptions(options).max_bytes(bytes), world.size()) <= smallest) fits = bytes;
  TORCH_CHECK_VALUE(false, "collectives bench: messages up to max_bytes ", options.max_bytes(), " (", size_name(options.max_bytes()),
                    ") need ", train::format_mib(needed), " MiB of buffers on each of the ", world.size(),
                    " ranks, more than the ", train::format_mib(smallest), " MiB rank ", rank, " may use",
                    rank == world.rank() ? " (" + limit.source + ")" : std::string(" (see its own error)"), "; ",
                    fits > 0 ? c10::str("lower max_bytes to ", fits, " (", size_name(fits), ") or less")
                             : c10::str("not even min_bytes ", options.min_bytes(), " fits: free memory, or run fewer ranks "
                                        "on each host"));
}

}  // namespace

std::vector<int64_t> collective_sizes(const CollectivesBenchOptions& options) {
  options.validate();
  std::vector<int64_t> sizes{options.min_bytes()};
  // The product only while it stays at most max_bytes: no overflow (see Note [Collective bandwidths]).
  while (sizes.back() <= options.max_bytes() / options.step_factor()) sizes.push_back(sizes.back() * options.step_factor());
  return sizes;
}

int64_t collectives_bench_bytes(const CollectivesBenchOptions& options, int64_t ranks) {
  TORCH_CHECK_VALUE(ranks >= 1, "collectives bench: ", ranks, " ranks; give at least 1");
  const int64_t bytes = collective_sizes(options).back();
  const int64_t numel = std::max<int64_t>(1, bytes / 4), part = std::max<int64_t>(1, numel / ranks);
  // all_reduce, broadcast: one rotation of numel; reduce_scatter, all_gather: one of part x N and
  // one of part (make_call).
  const int64_t elements = std::max(numel, saturating_mul(part, ranks + 1));
  return saturating_mul(saturating_mul(elements, rotation_slots(bytes, options.warm_cache())), 4);
}

void CollectivesBenchOptions::validate() const {
  TORCH_CHECK_VALUE(min_bytes() >= 4, "collectives bench: min_bytes ", min_bytes(), " is under one fp32 (4 bytes)");
  TORCH_CHECK_VALUE(max_bytes() >= min_bytes(), "collectives bench: max_bytes ", max_bytes(), " is under min_bytes ",
                    min_bytes());
  TORCH_CHECK_VALUE(step_factor() >= 2, "collectives bench: step_factor ", step_factor(), " must be at least 2");
  TORCH_CHECK_VALUE(iterations() >= 1, "collectives bench: iterations ", iterations(), " must be at least 1");
}

std::vector<CollectiveTiming> run_collectives_bench(dist::ProcessGroup& world, const CollectivesBenchOptions& options,
                                                    const std::function<void(const std::string&)>& progress) {
  options.validate();
  check_memory(world, options);
  std::vector<int64_t> everyone(static_cast<size_t>(world.size()));
  for (int64_t r = 0; r < world.size(); ++r) everyone[r] = r;
  // One group per all-reduce algorithm the topology allows; the flat one serves the others.
  std::vector<std::pair<std::string, std::unique_ptr<dist::ProcessGroup>>> groups;
  groups.emplace_back("flat", world.new_group(everyone, dist::AllReduceAlgorithm::kFlat));
  auto hierarchical = world.new_group(everyone, dist::AllReduceAlgorithm::kAuto);
  if (hierarchical->all_reduce_algorithm() == dist::AllReduceAlgorithm::kHierarchical)
    groups.emplace_back("hierarchical", std::move(hierarchical));

  std::vector<CollectiveTiming> rows;
  for (int64_t bytes : collective_sizes(options)) {
    for (const std::string collective : {"all_reduce", "reduce_scatter", "all_gather", "broadcast"}) {
      for (auto& [algorithm, group] : groups) {
        if (algorithm != "flat" && collective != "all_reduce") continue;
        Call call = make_call(*group, collective, bytes, options.warm_cache());
        // Warm-up (connections, pages, the shared-memory slots) and a first estimate; then enough
        // calls per sample that the ranks' skew leaving the barrier is under ~1% of it.
        const double once = timed(*group, call.run, 1);
        const int64_t calls = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(kSampleSeconds / once)), 1, 1000);
        std::vector<double> seconds;
        for (int64_t i = 0; i < options.iterations(); ++i) seconds.push_back(timed(*group, call.run, calls));
        std::sort(seconds.begin(), seconds.end());
        CollectiveTiming row;
        row.collective = collective;
        row.algorithm = algorithm;
        row.bytes = bytes;
        row.ranks = world.size();
        row.hosts = world.hosts();
        row.seconds = seconds[seconds.size() / 2];
        row.algbw_gbps = static_cast<double>(bytes) / row.seconds / 1e9;
        row.busbw_gbps = row.algbw_gbps * call.bus_factor;
        rows.push_back(row);
        if (progress && world.rank() == 0)
          progress(c10::str(collective, " ", algorithm, " ", size_name(bytes), ": ", fixed(row.seconds * 1e3, 3),
                            " ms, algbw ", fixed(row.algbw_gbps, 3), " GB/s, busbw ", fixed(row.busbw_gbps, 3), " GB/s"));
      }
    }
  }
  if (!options.out().empty() && world.rank() == 0) {
    const auto write = [&](const std::string& name, const std::string& text) {
      write_file_atomic(options.out() + "/" + name, std::vector<char>(text.begin(), text.end()));
    };
    write("collectives.csv", collectives_csv(rows));
    write("collectives.md", collectives_markdown(rows));
    write("collectives.svg", collectives_chart_svg(rows));
  }
  return rows;
}

std::string collectives_csv(const std::vector<CollectiveTiming>& rows) {
  std::string out = "collective,algorithm,bytes,ranks,hosts,time_us,algbw_gbps,busbw_gbps\n";
  for (const auto& r : rows)
    out += c10::str(r.collective, ",", r.algorithm, ",", r.bytes, ",", r.ranks, ",", r.hosts, ",",
                    fixed(r.seconds * 1e6, 1), ",", fixed(r.algbw_gbps, 4), ",", fixed(r.busbw_gbps, 4), "\n");
  return out;
}

std::string collectives_markdown(const std::vector<CollectiveTiming>& rows) {
  std::string out = "| collective | algorithm | size | time (us) | algbw (GB/s) | busbw (GB/s) |\n"
                    "|------------|-----------|-----:|----------:|-------------:|-------------:|\n";
  for (const auto& r : rows)
    out += c10::str("| ", r.collective, " | ", r.algorithm, " | ", size_name(r.bytes), " | ", fixed(r.seconds * 1e6, 1),
                    " | ", fixed(r.algbw_gbps, 3), " | ", fixed(r.busbw_gbps, 3), " |\n");
  return out;
}

std::string collectives_chart_svg(const std::vector<CollectiveTiming>& rows) {
  std::map<std::string, log::LineSeries> lines;  // by "collective (algorithm)"
  std::string where;
  for (const auto& r : rows) {
    const std::string name = r.collective + (r.collective == "all_reduce" ? " (" + r.algorithm + ")" : "");
    log::LineSeries& s = lines[name];
    s.name = name;
    s.x.push_back(std::log2(static_cast<double>(r.bytes)));
    s.y.push_back(r.busbw_gbps);
    where = c10::str(r.ranks, " ranks on ", r.hosts, r.hosts == 1 ? " host" : " hosts");
  }
  std::vector<log::LineSeries> series;
  for (auto& [name, s] : lines) series.push_back(std::move(s));
  return log::line_chart_svg(log::LineChartOptions()
                                 .title("Bus bandwidth by message size, " + where)
                                 .x_label("size, log2 bytes (10: 1 KiB, 20: 1 MiB, 28: 256 MiB)")
                                 .y_label("busbw (GB/s)")
                                 .y_from_zero(true)
                                 .integer_x(true)
                                 .width(720)
                                 .height(360),
                             series);
}

}  // namespace lockstep::bench
