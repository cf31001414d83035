#include "lockstep/train/checkpointer.h"

#include <torch/torch.h>

#include <c10/util/StringUtil.h>

#include <filesystem>
#include <functional>
#include <random>

#include "lockstep/core/report.h"
#include "lockstep/train/sharded_checkpoint.h"

namespace lockstep::train {
namespace {

// A save's id (see Note [Sharded checkpoint files]): random, positive, never 0 (0 marks a checkpoint
// without ids). Not from torch's generator, whose state the checkpoint records and must not move.
int64_t random_save_id() {
  std::random_device device;
  const uint64_t bits = (static_cast<uint64_t>(device()) << 32) | device();
  return static_cast<int64_t>(bits >> 1) | 1;
}

}  // namespace

Checkpointer::Checkpointer(CheckpointerOptions options, c10::impl::GenericDict run, dist::ProcessGroup* group)
    : options_(std::move(options)), run_(std::move(run)), group_(group), rank_(group ? group->rank() : 0) {
  TORCH_CHECK_VALUE(options_.save_every() >= 0, "save-every=", options_.save_every(),
                    " must be >= 0 (0: at epoch ends only)");
  TORCH_CHECK_VALUE(options_.keep_last() >= 0, "keep-last=", options_.keep_last(), " must be >= 0 (0 keeps all)");
  TORCH_CHECK_VALUE(options_.resume() != "latest" || enabled(),
                    "--resume latest needs --checkpoint-dir (where to look for the latest checkpoint)");
  TORCH_CHECK_VALUE(options_.format() != CheckpointFormat::kSharded || enabled(),
                    "--checkpoint-format sharded needs --checkpoint-dir (where each rank writes its file)");
  if (enabled() && rank_ == 0) {
    lock_ = DirectoryLock(options_.dir(), "--checkpoint-dir");
    remove_interrupted_saves();
  }
  if (enabled() && group_ != nullptr) group_->barrier();  // nobody reads the directory while rank 0 cleans it
}

// See Note [Interrupted saves].
void Checkpointer::remove_interrupted_saves() {
  namespace fs = std::filesystem;
  const auto temporary = [](const fs::path& p) {  // atomic_file's NAME.tmp.PID
    const std::string name = p.filename().string();
    const auto at = name.rfind(".tmp.");
    return at != std::string::npos && at + 5 < name.size() &&
           name.find_first_not_of("0123456789", at + 5) == std::string::npos;
  };
  int64_t files = 0;
  std::vector<std::string> unfinished;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(options_.dir(), ec)) {
    if (e.is_regular_file(ec) && temporary(e.path())) {
      files += fs::remove(e.path(), ec) ? 1 : 0;
    } else if (is_sharded_checkpoint(e.path().string()) && !fs::exists(e.path() / kShardedMetadataFile, ec)) {
      if (fs::remove_all(e.path(), ec) > 0) unfinished.push_back(e.path().filename().string());
    } else if (e.is_directory(ec)) {
      for (const auto& f : fs::directory_iterator(e.path(), ec))
        if (f.is_regular_file(ec) && temporary(f.path())) files += fs::remove(f.path(), ec) ? 1 : 0;
    }
  }
  if (files > 0 || !unfinished.empty())
    say(ReportKind::kNotice, "removed what interrupted saves left in '", options_.dir(), "': ", files,
        " temporary file(s)", unfinished.empty() ? "" : " and the unfinished sharded checkpoint(s) " +
        c10::Join(", ", unfinished) + " (no metadata.pt: never loadable)");
}

std::optional<Checkpoint> Checkpointer::load_resume(int64_t epochs) {
  if (options_.resume().empty()) {
    refuse_existing_checkpoints();
    return std::nullopt;
  }
  std::string path = options_.resume();
  std::optional<Checkpoint> c;
  if (path == "latest" || (std::filesystem::is_directory(path) && !is_sharded_checkpoint(path))) {
    const std::string dir = path == "latest" ? options_.dir() : path;
    const std::vector<std::string> found = list_checkpoints(dir);
    if (group_) {  // the fallback below votes once per checkpoint: every rank needs the same list
      const auto [fewest, most] = range_over_ranks(static_cast<int64_t>(found.size()));
      TORCH_CHECK(fewest == most, "rank ", rank_, " finds ", found.size(), " checkpoint(s) in '", dir,
                  "' but other ranks find between ", fewest, " and ", most,
                  ": every rank must see the same checkpoint directory (a shared filesystem across nodes)");
    }
    if (found.empty()) {
      TORCH_CHECK_VALUE(path == "latest", "rank ", rank_, ": --resume '", path,
                        "': no checkpoint (step-*.pt, or a sharded step-*/) in it");
      if (rank_ == 0) say(ReportKind::kInfo, "no checkpoint in '", dir, "' yet: starting from scratch");
      return std::nullopt;
    }
    path = dir;
    c = load_newest_readable(found, path);  // sharded: its rank files read too
    check_same_run(*c, run_, path);
  } else {
    c = load_checkpoint(path);
    check_same_run(*c, run_, path);
    if (c->sharded) read_sharded(*c);
  }
  TORCH_CHECK_VALUE(c->position.epoch <= epochs, "checkpoint '", path, "' has completed ", c->position.epoch,
                    " epochs and --epochs is ", epochs, "; --epochs counts from the start of training: pass ",
                    c->position.epoch, " or more");
  if (c->position.epoch == epochs && rank_ == 0)
    say(ReportKind::kInfo, "checkpoint '", path, "' has completed all ", epochs,
        " epochs: nothing left to train; evaluating it and writing the outputs");
  resumed_from_ = path;
  return c;
}

// See Note [Sharded checkpoint files]: only a run of the same strategy on as many ranks holds the
// same shards; any other reassembles the full form and resumes as from a full checkpoint.
void Checkpointer::read_sharded(Checkpoint& c) {
  ShardedCheckpointInfo& info = *c.sharded;
  const int64_t world = group_ ? group_->size() : 1;
  if (info.strategy == options_.strategy() && info.world_size == world) {
    torch::Tensor rng;
    info.own = load_rank_file(info, rank_, rng);
    info.own_rng = rng;
    return;
  }
  if (rank_ == 0)
    say(ReportKind::kInfo, "sharded checkpoint '", info.dir, "' was written by ", info.strategy, " on ", info.world_size,
        " rank(s); this run is ", options_.strategy().empty() ? "another strategy" : options_.strategy(), " on ", world,
        ": reading the full model and optimizer state from its ", info.world_size, " rank files");
  reassemble_sharded_checkpoint(c);
}

// Note [Falling back to an older checkpoint]
// A run killed while writing leaves the previous checkpoint intact (the write is atomic), but a
// damaged disk or a bad copy can still leave the newest file unreadable. A restart loop resuming
// "latest" would then fail on every attempt; instead it takes the newest file that reads (CRCs
// verified, see core/zip_checksum.h) and says which it skipped and why; for a sharded checkpoint
// that includes the rank files (one missing, or left from another save). Every rank resumes the
// same checkpoint: one that any rank cannot read is skipped by all. A checkpoint named explicitly
// never falls back.
Checkpoint Checkpointer::load_newest_readable(const std::vector<std::string>& all, std::string& path) {
  std::string skipped;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    std::optional<Checkpoint> c;
    std::string error;
    try {
      c = load_checkpoint(*it);
      if (c->sharded) read_sharded(*c);
    } catch (const c10::Error& e) {
      error = e.what_without_backtrace();
    }
    const std::vector<std::string> failed = ranks_that_failed(!error.empty());
    if (failed.empty()) {
      path = *it;
      return std::move(*c);
    }
    if (!error.empty())
      say(ReportKind::kWarning, "rank ", rank_, ": skipping checkpoint '", *it, "': ", error, "; trying the one before it");
    else if (rank_ == 0)
      say(ReportKind::kWarning, "skipping checkpoint '", *it, "': rank(s) ", c10::Join(", ", failed),
          " cannot read it (their warnings say why); trying the one before it");
    skipped += (skipped.empty() ? "'" : ", '") + *it + "'";
  }
  TORCH_CHECK(false, "rank ", rank_, ": none of the ", all.size(), " checkpoints in '", path, "' can be read (",
              skipped, "); the warnings above say why. Start afresh without --resume, in an empty --checkpoint-dir");
}

std::vector<std::string> Checkpointer::ranks_that_failed(bool failed) const {
  const torch::Tensor mine = torch::tensor({static_cast<int64_t>(failed)}, torch::kInt64);
  const std::vector<torch::Tensor> votes = group_ ? group_->all_gather(mine) : std::vector<torch::Tensor>{mine};
  std::vector<std::string> ranks;
  for (size_t r = 0; r < votes.size(); ++r)
    if (votes[r].item<int64_t>() != 0) ranks.push_back(std::to_string(r));
  return ranks;
}

// Not resuming: a fresh run's step-N files would interleave with the ones already there, and its
// --keep-last pruning (by step) would delete its own newer files and keep stale ones.
void Checkpointer::refuse_existing_checkpoints() {
  if (!enabled()) return;
  const auto latest = latest_checkpoint(options_.dir());
  if (!latest) return;
  std::string whose = "checkpoints";
  try {
    check_same_run(load_checkpoint(*latest), run_, *latest);
    whose = "checkpoints of a run with these same settings";
  } catch (const c10::ValueError&) {
    whose = "checkpoints of another run (different settings)";
  } catch (const c10::Error&) {
    whose = "checkpoints (the newest unreadable)";
  }
  TORCH_CHECK_VALUE(false, "rank ", rank_, ": --checkpoint-dir '", options_.dir(), "' already holds ", whose,
                    ", up to '", *latest, "'. Pass --resume latest to continue that run, or give this run an empty ",
                    "--checkpoint-dir");
}

TrainingPosition Checkpointer::restore(const std::optional<Checkpoint>& c, parallel::Strategy& strategy) {
  // What the data position counts in, saved with every checkpoint from here on.
  run_.insert_or_assign("replicas", (group_ ? group_->size() : 1) / strategy.ranks_per_replica());
  TrainingPosition position;
  if (c) {
    const std::string source = "checkpoint '" + resumed_from_ + "'";
    torch::Tensor rng;  // this rank's generator state, when the checkpoint has one for it
    if (c->sharded && c->sharded->own) {  // see Note [Sharded checkpoint files]
      strategy.load_sharded_state_dict(*c->sharded->own, source);
      rng = c->sharded->own_rng;
    } else {
      c10::impl::GenericDict state = string_dict();
      state.insert("optimizer", c->optimizer);
      state.insert("scaler", c->scaler);
      strategy.load_training_state_dict(state, source);
      const auto world = c->run.find("world_size");
      const auto this_world = run_.find("world_size");
      const bool same_world = world != c->run.end() && this_world != run_.end() && world->value() == this_world->value();
      TORCH_CHECK(!same_world || rank_ < static_cast<int64_t>(c->rng.size()), source, " holds RNG states for ",
                  c->rng.size(), " ranks; rank ", rank_, " has none");
      if (rank_ < static_cast<int64_t>(c->rng.size())) rng = c->rng[rank_];  // see Note [Resuming on another world size]
    }
    if (rng.defined()) {
      at::Generator generator = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(rng);
    }
    position = c->position;
    const std::string notice = adapt_position(position, c->run, run_, resumed_from_);  // Note [Resuming on another world size]
    if (!notice.empty() && rank_ == 0) say(ReportKind::kWarning, notice);
    if (rank_ == 0)
      say(ReportKind::kInfo, "resumed from '", resumed_from_, "': epoch ", position.epoch + 1, ", step ", position.step);
  }
  if (group_) check_same_position_on_all_ranks(position);
  return position;
}

// Every rank resumes from the same step, or none does: a rank that found another checkpoint (no
// shared filesystem, a file written in between) would train a different number of steps.
void Checkpointer::check_same_position_on_all_ranks(const TrainingPosition& position) {
  const auto [lowest, highest] = range_over_ranks(position.step);
  TORCH_CHECK(lowest == highest, "rank ", rank_, " resumes at step ", position.step,
              (resumed_from_.empty() ? " (no checkpoint)" : " from '" + resumed_from_ + "'"),
              " but other ranks resume between steps ", lowest, " and ", highest,
              ": every rank must see the same checkpoint directory (a shared filesystem across nodes)");
}

// See Note [A lock that survives its directory].
bool Checkpointer::directory_still_ours(int64_t step) {
  if (!lock_lost_.empty()) return false;
  if (lock_.intact()) return true;
  try {
    lock_.retake();
    say(ReportKind::kWarning, "--checkpoint-dir '", options_.dir(), "' was removed or replaced while this run held it; ",
        "it is made again and locked again, and checkpoints go on there from step ", step);
    return true;
  } catch (const std::exception& e) {
    lock_lost_ = error_text(e);
    say(ReportKind::kError, "checkpoint at step ", step, " not saved, and no more will be: --checkpoint-dir '",
        options_.dir(), "' was removed while this run held it, and ", lock_lost_);
    return false;
  }
}

std::pair<int64_t, int64_t> Checkpointer::range_over_ranks(int64_t value) const {
  torch::Tensor both = torch::tensor({value, -value}, torch::kInt64);
  group_->all_reduce(both, dist::ReduceOp::kMax);
  return {-both[1].item<int64_t>(), both[0].item<int64_t>()};
}

void Checkpointer::save(const TrainingPosition& at, parallel::Strategy& strategy) {
  if (options_.format() == CheckpointFormat::kSharded) return save_sharded(at, strategy);
  torch::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();  // (5056) uint8
  std::vector<torch::Tensor> rngs = group_ ? group_->all_gather(rng) : std::vector<torch::Tensor>{rng};
  // Collective: a strategy whose state is spread over ranks gathers it to rank 0 here.
  c10::Dict<std::string, torch::Tensor> model = strategy.model_state_dict();
  const c10::impl::GenericDict state = strategy.training_state_dict();
  if (rank_ == 0 && directory_still_ours(at.step)) {
    Checkpoint c;
    c.position = at;
    c.run = run_;
    c.model = model;
    c.optimizer = state.at("optimizer");
    c.scaler = state.at("scaler");
    c.rng = rngs;
    const std::string path = checkpoint_path(options_.dir(), at.step);
    try {
      std::filesystem::create_directories(options_.dir());
      save_checkpoint(c, path);
      remove_old_checkpoints(options_.dir(), options_.keep_last());
    } catch (const std::exception& e) {
      const auto last = latest_checkpoint(options_.dir());
      say(ReportKind::kError, "checkpoint at step ", at.step, " not saved: ", error_text(e),
          "; training goes on, the last good checkpoint is ", last ? "'" + *last + "'" : "(none)");
    }
  }
  if (group_) group_->barrier();
}

}  // namespace lockstep::train

namespace lockstep::train {

// See Note [Sharded checkpoint files]. Collective, but nothing of the model travels: the save id's
// broadcast, a vote of one int per rank and a barrier.
void Checkpointer::save_sharded(const TrainingPosition& at, parallel::Strategy& strategy) {
  namespace fs = std::filesystem;
  const std::optional<parallel::ShardedState> state = strategy.sharded_state_dict();
  TORCH_CHECK_VALUE(state.has_value(), "rank ", rank_, ": --checkpoint-format sharded, but the ", strategy.name(),
                    " strategy holds a full replica, not shards; use --strategy fsdp, zero1 or zero2, or ",
                    "--checkpoint-format full");
  Checkpoint c;
  c.position = at;
  c.run = run_;
  c.sharded = ShardedCheckpointInfo{sharded_checkpoint_path(options_.dir(), at.step), strategy.name(),
                                    state->world_size, state->layouts, /*save_id=*/0, std::nullopt, torch::Tensor()};
  const std::string dir = c.sharded->dir;
  std::string error;
  auto attempt = [&error](const std::function<void()>& f) {
    try {
      f();
    } catch (const std::exception& e) {
      error = error_text(e);
    }
  };
  const bool ours = rank_ != 0 || directory_still_ours(at.step);
  if (rank_ == 0 && ours) attempt([&] {
    fs::create_directories(dir);
    fs::remove(fs::path(dir) / kShardedMetadataFile);  // a stale commit must not complete the new files
  });
  // Rank 0 draws the save's id; receiving it, every rank knows the directory is there, without
  // metadata. Id 0: the directory is no longer this run's, and nobody writes.
  torch::Tensor id = torch::tensor({rank_ == 0 && ours ? random_save_id() : int64_t{0}}, torch::kInt64);
  if (group_) group_->broadcast(id, 0);
  c.sharded->save_id = id.item<int64_t>();
  if (c.sharded->save_id == 0) {
    if (group_) group_->barrier();
    return;
  }
  if (error.empty()) attempt([&] {
    fs::create_directories(dir);  // another node's view of the shared directory
    save_rank_file(*state, at::detail::getDefaultCPUGenerator().get_state(), dir, c.sharded->save_id);
  });
  if (!error.empty())
    say(ReportKind::kError, "rank ", rank_, ": its file of the sharded checkpoint at step ", at.step,
        " was not written: ", error);
  // The vote: metadata.pt is written only when every rank's file is.
  const std::vector<std::string> failed = ranks_that_failed(!error.empty());
  if (rank_ == 0) {
    if (failed.empty()) attempt([&] {
      save_sharded_metadata(c);
      remove_old_checkpoints(options_.dir(), options_.keep_last());
    });
    if (!failed.empty() || !error.empty()) {
      std::error_code ec;
      fs::remove_all(dir, ec);  // incomplete: nothing could resume it
      const auto last = latest_checkpoint(options_.dir());
      const std::string why = failed.empty() ? "its metadata was not written: " + error
                                             : "rank(s) " + c10::Join(", ", failed) + " could not write their files";
      say(ReportKind::kError, "sharded checkpoint at step ", at.step, " not saved: ", why,
          "; training goes on, the last good checkpoint is ", last ? "'" + *last + "'" : "(none)");
    }
  }
  if (group_) group_->barrier();  // nobody resumes or exits before the metadata is there
}

}  // namespace lockstep::train
