#include "lockstep/bench/matrix.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <sstream>

namespace lockstep::bench {

std::vector<BenchConfig> default_matrix(int64_t cores) {
  const int64_t n = std::max<int64_t>(2, cores);  // dp and ddp need two replicas to mean anything
  const std::string replicas = std::to_string(n);
  auto local = [&](std::string key, std::string name, std::vector<std::string> args, std::string note = "") {
    BenchConfig c;
    c.key = std::move(key), c.name = std::move(name), c.threads = cores, c.args = std::move(args);
    c.note = std::move(note);
    return c;
  };
  auto ddp = [&](std::string key, std::string name, std::vector<std::string> args, std::string note = "") {
    BenchConfig c;
    c.key = std::move(key), c.name = std::move(name), c.world_size = n, c.threads = 1, c.args = std::move(args);
    c.comm_gradients = true, c.note = std::move(note);
    return c;
  };
  std::vector<BenchConfig> m;
  m.push_back(local("fp32", "local fp32", {}, "the baseline: one process, every core, fp32"));
  m.push_back(local("bf16-o1", "local bf16 O1", {"--precision", "bf16", "--opt-level", "O1"},
                    "autocast: bf16 matrix products, fp32 weights; no loss scaling (bf16 has fp32's range)"));
  m.push_back(local("bf16-o2", "local bf16 O2", {"--precision", "bf16", "--opt-level", "O2"},
                    "bf16 model, fp32 master weights (counted as optimizer state) and fp32 BatchNorm"));
  m.push_back(local("bf16-o3", "local pure bf16 O3", {"--precision", "bf16", "--opt-level", "O3"},
                    "pure half: bf16 weights without fp32 masters; updates smaller than bf16's 8-bit mantissa "
                    "resolves round away, so accuracy may trail fp32's (the write-up's pure fp16 lost 10 points)"));
  BenchConfig dp = local("dp", "dp (DataParallel)", {"--strategy", "dp", "--replicas", replicas},
                         "one process, " + replicas + " replicas on threads of " +
                             std::to_string(std::max<int64_t>(1, cores / n)) +
                             " intra-op thread(s) each; outputs gathered and gradients summed in-process");
  m.push_back(dp);
  BenchConfig plain = ddp("ddp", "ddp", {}, "one process per core, one thread each; gradients all-reduced over Gloo");
  plain.peer = true;
  m.push_back(plain);
  BenchConfig bf16 = ddp("ddp-bf16", "ddp + bf16 O1", {"--precision", "bf16"});
  bf16.peer = true, bf16.peer_args = {"--amp"};
  m.push_back(bf16);
  BenchConfig accum = ddp("ddp-accum", "ddp + accumulation x2", {}, "two micro-batches of half the batch per step: "
                          "the same step, half the activation memory");
  accum.accum_steps = 2;
  m.push_back(accum);
  m.push_back(ddp("ddp-syncbn", "ddp + SyncBN", {"--sync-bn"},
                  "BatchNorm statistics over the global batch: one more all-reduce per BatchNorm layer"));
  BenchConfig fsdp = ddp("fsdp", "fsdp", {"--strategy", "fsdp"},
                         "parameters, gradients and optimizer state sharded per block; each block all-gathered for "
                         "its forward and again for its backward, gradients reduce-scattered: 3/2 of ddp's bytes");
  fsdp.comm_gradients = false;  // not one all-reduce of the gradients: see the note
  m.push_back(fsdp);
  return m;
}

std::vector<BenchConfig> select(const std::vector<BenchConfig>& matrix, const std::string& only) {
  if (only.empty()) return matrix;
  std::vector<std::string> keys, known;
  for (const BenchConfig& c : matrix) known.push_back(c.key);
  std::stringstream in(only);
  for (std::string key; std::getline(in, key, ',');) {
    if (key.empty()) continue;
    TORCH_CHECK_VALUE(std::find(known.begin(), known.end(), key) != known.end(), "--only: unknown configuration '", key,
                      "'; choose from ", c10::Join(", ", known));
    keys.push_back(key);
  }
  std::vector<BenchConfig> out;
  for (const BenchConfig& c : matrix)
    if (std::find(keys.begin(), keys.end(), c.key) != keys.end()) out.push_back(c);
  TORCH_CHECK_VALUE(!out.empty(), "--only '", only, "' names no configuration; choose from ", c10::Join(", ", known));
  return out;
}

}  // namespace lockstep::bench
