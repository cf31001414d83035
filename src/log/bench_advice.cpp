// bench_advice: what to pick, read off the rows of one `lockstep bench` run.
//
// Note [Advice from the table]
// The same advice cannot hold on every machine: bf16 ran 2.4x fp32's speed on one AMD EPYC and
// 0.87x on an Intel Xeon with AVX512-BF16, and fsdp's cost against ddp moved from 0.77x to 0.72x
// between them. So every sentence here compares two rows of this run that differ in one respect
// (the rest of how they trained equal: strategy, precision, opt level, SyncBN, accumulation, data
// source, ranks x threads, implementation), states the measured ratio, and draws the conclusion
// the ratio supports. Ratios within kSame of 1 count as a tie: a single run's noise on these
// machines is a few percent.

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/core/process.h"
#include "lockstep/log/bench_results.h"

namespace lockstep::log {
namespace {

constexpr double kSame = 0.05;           // |ratio - 1| below this: neither row is faster
constexpr double kAccuracyPoints = 1.0;  // test accuracy points below which a loss is not mentioned

std::string num(double v, int digits) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}
std::string times(double ratio) { return num(ratio, 2) + "x"; }
double state_mib(const BenchRow& r) { return static_cast<double>(r.param_bytes + r.grad_bytes + r.optim_bytes) / kMiB; }

// The rows bench_advice may compare: finished, and with their configuration known.
std::vector<const BenchRow*> usable(const BenchResults& b) {
  std::vector<const BenchRow*> rows;
  for (const BenchRow& r : b.rows)
    if (r.ok && !r.strategy.empty() && r.samples_per_s > 0) rows.push_back(&r);
  return rows;
}

bool same_setup(const BenchRow& a, const BenchRow& b) {
  return a.implementation == b.implementation && a.strategy == b.strategy && a.precision == b.precision &&
         a.opt_level == b.opt_level && a.sync_bn == b.sync_bn && a.data == b.data && a.accum_steps == b.accum_steps &&
         a.world_size == b.world_size && a.threads == b.threads;
}

// The row that trained as `r` does once `change` is applied to a copy of it; nullptr if none ran.
const BenchRow* twin(const std::vector<const BenchRow*>& rows, const BenchRow& r,
                     const std::function<void(BenchRow&)>& change) {
  BenchRow wanted = r;
  change(wanted);
  for (const BenchRow* o : rows)
    if (o != &r && same_setup(*o, wanted)) return o;
  return nullptr;
}

// The row that trained as `r` does but from another data source, held in memory.
const BenchRow* from_memory(const std::vector<const BenchRow*>& rows, const BenchRow& r) {
  for (const BenchRow* o : rows)
    if (o->data != "imagefolder" && o->data != "csv" && twin(rows, r, [&](BenchRow& w) { w.data = o->data; }) == o)
      return o;
  return nullptr;
}

std::string speed_pair(const BenchRow& a, const BenchRow& b) {
  return num(a.samples_per_s, 0) + " against " + num(b.samples_per_s, 0) + " samples/s";
}

void fastest_and_smallest(const std::vector<const BenchRow*>& rows, std::vector<std::string>& out) {
  const BenchRow* fastest = nullptr;
  const BenchRow* smallest = nullptr;
  for (const BenchRow* r : rows) {
    if (r->implementation != "lockstep") continue;
    if (!fastest || r->samples_per_s > fastest->samples_per_s) fastest = r;
    if (r->peak_rss_mib > 0 && (!smallest || r->peak_rss_mib < smallest->peak_rss_mib)) smallest = r;
  }
  if (!fastest) return;
  std::string s = "Fastest here: **" + fastest->name + "** (" + num(fastest->samples_per_s, 0) + " samples/s)";
  if (smallest) s += "; smallest rank 0: **" + smallest->name + "** (" + num(smallest->peak_rss_mib, 0) + " MiB peak RSS)";
  out.push_back(s + ".");
}

// bf16 rows against their fp32 twins: whether half precision paid for speed on this CPU, and what
// it did to accuracy and memory.
void precision(const std::vector<const BenchRow*>& rows, std::vector<std::string>& out) {
  std::vector<std::string> ratios, accuracy, memory;
  double lo = INFINITY, hi = 0;
  for (const BenchRow* r : rows) {
    if (r->implementation != "lockstep" || r->precision != "bf16") continue;
    const BenchRow* fp32 = twin(rows, *r, [](BenchRow& w) { w.precision = "fp32", w.opt_level = "O0"; });
    if (!fp32) continue;
    const double ratio = r->samples_per_s / fp32->samples_per_s;
    lo = std::min(lo, ratio), hi = std::max(hi, ratio);
    ratios.push_back(r->name + " ran at " + times(ratio) + " " + fp32->name + "'s speed");
    const double points = 100.0 * (fp32->test_acc - r->test_acc);
    if (points >= kAccuracyPoints)
      accuracy.push_back(r->name + "'s test accuracy trailed " + fp32->name + "'s by " + num(points, 1) + " points (" +
                         num(r->test_acc, 4) + " against " + num(fp32->test_acc, 4) + ")");
    if (r->peak_rss_mib > 0 && fp32->peak_rss_mib > 0 && r->peak_rss_mib < (1 - kSame) * fp32->peak_rss_mib)
      memory.push_back(r->name + " peaked at " + num(r->peak_rss_mib, 0) + " MiB against " + num(fp32->peak_rss_mib, 0));
  }
  if (ratios.empty()) return;
  std::string s = c10::Join("; ", ratios) + ". ";
  if (lo >= 1 + kSame) {
    s += "bf16 pays for speed on this CPU.";
  } else if (hi <= 1 - kSame) {
    s += "bf16 did not pay for speed on this CPU: train in fp32 here" +
         std::string(memory.empty() ? "." : ", or in bf16 for memory alone (" + c10::Join("; ", memory) + ").");
  } else if (hi < 1 + kSame && lo > 1 - kSame) {
    s += "bf16 and fp32 ran at the same speed on this CPU.";
  } else {
    s += "Whether bf16 pays on this CPU depends on the configuration: pick by the rows above.";
  }
  if (!accuracy.empty()) s += " " + c10::Join("; ", accuracy) + ".";
  out.push_back(s);
}

// One process per device (ddp) against replicas on threads of one process (dp).
void ddp_against_dp(const std::vector<const BenchRow*>& rows, std::vector<std::string>& out) {
  for (const BenchRow* dp : rows) {
    if (dp->implementation != "lockstep" || dp->strategy != "dp") continue;
    for (const BenchRow* ddp : rows) {
      if (ddp->implementation != "lockstep" || ddp->strategy != "ddp" || ddp->precision != dp->precision ||
          ddp->opt_level != dp->opt_level || ddp->sync_bn || ddp->accum_steps != dp->accum_steps || ddp->data != dp->data)
        continue;
      const double ratio = ddp->samples_per_s / dp->samples_per_s;
      out.push_back("**" + ddp->name + "** ran at " + times(ratio) + " **" + dp->name + "**'s speed (" +
                    speed_pair(*ddp, *dp) + ")" +
                    (ratio >= 1 + kSame ? ": start one process per device when you can."
                     : ratio <= 1 - kSame ? ": on this machine the single process was faster." : "."));
      return;
    }
  }
}

// lockstep's rows against PyTorch's for the same configuration.
void against_peer(const std::vector<const BenchRow*>& rows, std::vector<std::string>& out) {
  std::vector<std::string> pairs;
  for (const BenchRow* peer : rows) {
    if (peer->implementation == "lockstep") continue;
    const BenchRow* ours = twin(rows, *peer, [](BenchRow& w) { w.implementation = "lockstep"; });
    if (!ours) continue;
    std::string p = ours->name + " at " + times(ours->samples_per_s / peer->samples_per_s) + " " + peer->implementation +
                    "'s speed (" + speed_pair(*ours, *peer) + ")";
    if (ours->peak_rss_mib > 0 && peer->peak_rss_mib > 0)
      p += " and " + times(ours->peak_rss_mib / peer->peak_rss_mib) + " its peak RSS";
    pairs.push_back(p);
  }
  if (!pairs.empty()) out.push_back("lockstep against the peer: " + c10::Join("; ", pairs) + ".");
}

// Every other strategy or option against the plain ddp row it departs from.
void against_ddp(const std::vector<const BenchRow*>& rows, std::vector<std::string>& out) {
  for (const BenchRow* r : rows) {
    if (r->implementation != "lockstep") continue;
    const BenchRow* ddp = nullptr;
    std::string what;
    if (r->strategy == "zero1" || r->strategy == "zero2" || r->strategy == "fsdp") {
      ddp = twin(rows, *r, [](BenchRow& w) { w.strategy = "ddp"; });
      what = "sharded";
    } else if (r->strategy == "ddp" && r->sync_bn) {
      ddp = twin(rows, *r, [](BenchRow& w) { w.sync_bn = false; });
      what = "syncbn";
    } else if (r->strategy == "ddp" && r->accum_steps > 1) {
      ddp = twin(rows, *r, [](BenchRow& w) { w.accum_steps = 1; });
      what = "accumulation";
    } else if (r->strategy == "ddp" && (r->data == "imagefolder" || r->data == "csv")) {  // files, not memory
      ddp = from_memory(rows, *r);
      what = "data";
    }
    if (!ddp) continue;
    const double speed = r->samples_per_s / ddp->samples_per_s;
    std::string s = "**" + r->name + "** ran at " + times(speed) + " **" + ddp->name + "**'s speed";
    if (what == "sharded" && state_mib(*ddp) > 0) {
      s += " holding " + times(state_mib(*r) / state_mib(*ddp)) + " its parameters, gradients and optimizer state on " +
           "rank 0 (" + num(state_mib(*r), 2) + " against " + num(state_mib(*ddp), 2) + " MiB)";
      s += speed >= 1 - kSame ? ": the memory is saved at no cost in speed here."
                              : ": worth it when a replica's state does not fit, not otherwise.";
    } else if (what == "accumulation" && r->peak_rss_mib > 0 && ddp->peak_rss_mib > 0) {
      s += " at " + num(r->peak_rss_mib, 0) + " against " + num(ddp->peak_rss_mib, 0) + " MiB peak RSS.";
    } else if (what == "data") {
      s += " reading " + r->data + " rather than data held in memory.";
    } else {
      s += speed >= 1 - kSame ? "." : ": its cost here; use it when the per-rank batch is too small for BatchNorm's statistics.";
    }
    out.push_back(s);
  }
}

}  // namespace

std::vector<std::string> bench_advice(const BenchResults& b) {
  const std::vector<const BenchRow*> rows = usable(b);
  std::vector<std::string> out;
  fastest_and_smallest(rows, out);
  precision(rows, out);
  ddp_against_dp(rows, out);
  against_peer(rows, out);
  against_ddp(rows, out);
  return out;
}

}  // namespace lockstep::log
