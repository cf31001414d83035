#include "lockstep/train/sharded_checkpoint.h"

#include <torch/serialize.h>

#include <cstdio>
#include <filesystem>

#include "lockstep/core/atomic_file.h"
#include "lockstep/core/ivalue_dict.h"
#include "lockstep/core/torch_load.h"
#include "lockstep/core/torch_save.h"

namespace lockstep::train {
namespace {

namespace fs = std::filesystem;
using c10::IValue;
using GenericDict = c10::impl::GenericDict;

constexpr const char* kFormat = "lockstep-sharded-checkpoint-1";

IValue entry(const GenericDict& dict, const std::string& key, const std::string& source) {
  return dict_entry(dict, key, source, ": it is not a complete lockstep sharded checkpoint");
}

// The dict in a torch.save file, with its format checked; errors name `source`.
GenericDict read_dict(const std::string& path, const std::string& source) {
  const std::vector<char> bytes = read_file(path);  // names the path itself
  IValue top;
  try {
    top = torch_load(bytes);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "cannot read ", source, " (corrupt or not a checkpoint): ", e.what_without_backtrace());
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "cannot read ", source, " (corrupt or not a checkpoint): ", e.what());
  }
  TORCH_CHECK(top.isGenericDict(), source, " is not a dict but a ", top.tagKind());
  const GenericDict dict = top.toGenericDict();
  const IValue format = entry(dict, "format", source);
  TORCH_CHECK(format.isString() && format.toStringRef() == kFormat, source, " has format ",
              format.isString() ? "'" + format.toStringRef() + "'" : format.tagKind(), "; this lockstep reads '",
              kFormat, "'");
  return dict;
}

std::string rank_file_path(const ShardedCheckpointInfo& info, int64_t rank) {
  return (fs::path(info.dir) / rank_file_name(rank, info.world_size)).string();
}

}  // namespace

std::string rank_file_name(int64_t rank, int64_t world_size) {
  char name[64];
  std::snprintf(name, sizeof(name), "rank-%05lld-of-%05lld.pt", static_cast<long long>(rank),
                static_cast<long long>(world_size));
  return name;
}

void save_rank_file(const parallel::ShardedState& state, const torch::Tensor& rng, const std::string& checkpoint_dir,
                    int64_t save_id) {
  GenericDict top = string_dict();
  top.insert("format", std::string(kFormat));
  for (const auto& item : parallel::sharded_state_to_dict(state)) top.insert(item.key(), item.value());
  top.insert("rng", rng);
  top.insert("save_id", save_id);
  write_file_atomic((fs::path(checkpoint_dir) / rank_file_name(state.rank, state.world_size)).string(),
                    torch_save(top));
}

void save_sharded_metadata(const Checkpoint& c) {
  TORCH_CHECK(c.sharded, "save_sharded_metadata: the checkpoint has no sharded layout");
  const ShardedCheckpointInfo& info = *c.sharded;
  c10::List<std::string> files;
  for (int64_t r = 0; r < info.world_size; ++r) files.push_back(rank_file_name(r, info.world_size));
  GenericDict top = string_dict();
  top.insert("format", std::string(kFormat));
  for (const auto& item : position_and_run(c)) top.insert(item.key(), item.value());
  top.insert("strategy", info.strategy);
  top.insert("world_size", info.world_size);
  top.insert("files", files);
  top.insert("units", parallel::layouts_to_ivalue(info.layouts));
  top.insert("save_id", info.save_id);
  write_file_atomic((fs::path(info.dir) / kShardedMetadataFile).string(), torch_save(top));
}

// See Note [Sharded checkpoint files]: the metadata is the commit, and every rank file must be there.
Checkpoint load_sharded_checkpoint(const std::string& dir) {
  const std::string source = "sharded checkpoint '" + dir + "'";
  const std::string metadata = (fs::path(dir) / kShardedMetadataFile).string();
  std::error_code ec;
  if (!fs::exists(metadata, ec)) {
    int64_t rank_files = 0;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().filename().string().rfind("rank-", 0) == 0) ++rank_files;
    TORCH_CHECK(false, source, " is incomplete: it has no ", kShardedMetadataFile, " (rank 0 writes it last, once ",
                "every rank has written its file; ", rank_files, " rank file(s) are there), so its save was ",
                "interrupted or failed. Resume from an earlier checkpoint (--resume latest skips this one), or ",
                "delete the directory");
  }
  const GenericDict top = read_dict(metadata, "the metadata of " + source);
  Checkpoint c;
  read_position_and_run(top, "the metadata of " + source, c);
  ShardedCheckpointInfo info;
  info.dir = dir;
  const IValue strategy = entry(top, "strategy", source), world = entry(top, "world_size", source);
  TORCH_CHECK(strategy.isString() && world.isInt() && world.toInt() >= 1, source,
              ": 'strategy' must be a name and 'world_size' a positive int");
  info.strategy = strategy.toStringRef();
  info.world_size = world.toInt();
  info.layouts = parallel::layouts_from_ivalue(entry(top, "units", source), "the metadata of " + source);
  const auto id = top.find("save_id");  // absent from checkpoints written before save ids
  if (id != top.end()) {
    TORCH_CHECK(id->value().isInt(), source, ": 'save_id' must be an int, got ", id->value().tagKind());
    info.save_id = id->value().toInt();
  }
  for (int64_t r = 0; r < info.world_size; ++r) {
    const std::string path = rank_file_path(info, r);
    TORCH_CHECK(fs::is_regular_file(path, ec), source, " is incomplete: the file of rank ", r, " of ",
                info.world_size, ", '", path, "', is missing. Every rank's file is needed to resume it: restore ",
                "that file, or resume from an earlier checkpoint (--resume latest skips this one)");
  }
  c.sharded = std::move(info);
  return c;
}

parallel::ShardedState load_rank_file(const ShardedCheckpointInfo& info, int64_t rank, torch::Tensor& rng) {
  const std::string path = rank_file_path(info, rank);
  const std::string source = "the file of rank " + std::to_string(rank) + " of sharded checkpoint '" + info.dir + "'";
  try {
    const GenericDict top = read_dict(path, source + ", '" + path + "'");
    parallel::ShardedState state = parallel::sharded_state_from_dict(top, source);
    TORCH_CHECK(state.rank == rank && state.world_size == info.world_size && state.layouts == info.layouts, source,
                " holds rank ", state.rank, " of ", state.world_size, " and ", state.layouts.size(),
                " units, which differ from the metadata's: it is not from the same save");
    const auto id = top.find("save_id");
    const int64_t file_id = id != top.end() && id->value().isInt() ? id->value().toInt() : 0;
    TORCH_CHECK(info.save_id == 0 || file_id == info.save_id, source, " is from another save (save id ", file_id,
                ", the metadata's ", info.save_id, "): a file left from an earlier save or copied in, whose shards ",
                "are not this checkpoint's");
    const IValue r = entry(top, "rng", source);
    TORCH_CHECK(r.isTensor(), source, ": 'rng' must be a tensor, got ", r.tagKind());
    rng = r.toTensor();
    return state;
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, e.what_without_backtrace(), ". The checkpoint cannot be resumed without rank ", rank,
                "'s file '", path, "': restore it, or resume from an earlier checkpoint (--resume DIR/step-N)");
  }
}

void reassemble_sharded_checkpoint(Checkpoint& c) {
  TORCH_CHECK(c.sharded, "reassemble_sharded_checkpoint: the checkpoint is not sharded");
  const ShardedCheckpointInfo& info = *c.sharded;
  std::vector<parallel::ShardedState> states;
  c.rng.clear();
  for (int64_t r = 0; r < info.world_size; ++r) {
    torch::Tensor rng;
    states.push_back(load_rank_file(info, r, rng));
    c.rng.push_back(rng);
  }
  parallel::ConsolidatedState full =
      parallel::consolidate_sharded_states(states, "sharded checkpoint '" + info.dir + "'");
  c.model = full.model;
  c.optimizer = full.optimizer;
  c.scaler = full.scaler;
}

}  // namespace lockstep::train
