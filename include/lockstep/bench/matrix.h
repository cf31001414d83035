#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::bench {

// One configuration of `lockstep bench`: how `lockstep train` is started for it. Every row trains
// the same model on the same data with the same global batch (BenchOptions::global_batch: per-rank
// batch = global batch / (world_size x accum_steps)), so rows differ only in how they train.
// In a configuration's args: the bench's image folder, Fashion-MNIST's splits (--limit of the
// training one) written as PNG files under --out, once, when a selected row names it.
constexpr const char* kImageFolder = "$IMAGE_FOLDER";

struct BenchConfig {
  std::string key;                 // what --only names: "ddp-bf16"
  std::string name;                // the table's name: "ddp + bf16 O1"
  int64_t world_size = 1;          // processes (lockstep run --nproc-per-node)
  int64_t threads = 1;             // intra-op threads per process
  int64_t accum_steps = 1;
  std::vector<std::string> args;   // added to `lockstep train`'s command line
  bool peer = false;               // --peer runs PyTorch's counterpart right after it
  std::vector<std::string> peer_args;  // the peer's extra flags (--amp)
  std::string note;                // shown under the table: why the row reads as it does
};

// The built-in matrix for a machine with `cores` cores: single process fp32 and bf16 O1/O2/O3
// with every core, dp with a replica per core, and ddp (fp32, bf16, accumulation, SyncBN) and
// the sharded strategies with a rank per core and one thread each, so every row uses all cores once.
std::vector<BenchConfig> default_matrix(int64_t cores);

// The matrix a YAML file describes, for `lockstep bench --matrix FILE`: a list of configurations
// (at the top level or under `configurations:`), each a mapping with the fields of BenchConfig:
//   - key: ddp-bf16            # required; what --only names
//     name: ddp + bf16 O1      # the table's name (default: key)
//     world_size: 2            # default 1
//     threads: 1               # default: cores / world_size, at least 1
//     accum_steps: 1
//     args: [--precision, bf16]
//     peer: true               # --peer runs PyTorch's DDP after it
//     peer_args: [--amp]
//     note: why the row reads as it does
// Throws c10::ValueError naming the file, the line and the field for anything else.
std::vector<BenchConfig> read_matrix(const std::string& path, int64_t cores);

// The configurations `only` names (comma-separated keys, in the matrix's order); all when empty.
// Throws c10::ValueError naming an unknown key and listing the known ones.
std::vector<BenchConfig> select(const std::vector<BenchConfig>& matrix, const std::string& only);

}  // namespace lockstep::bench
