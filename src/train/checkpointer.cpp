#include "lockstep/train/checkpointer.h"

#include <torch/torch.h>

#include <cstdio>
#include <filesystem>

namespace lockstep::train {
namespace {

std::string error_text(const std::exception& e) {
  auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  return c10_error ? c10_error->what_without_backtrace() : e.what();
}

}  // namespace

Checkpointer::Checkpointer(CheckpointerOptions options, c10::impl::GenericDict run, dist::ProcessGroup* group)
    : options_(std::move(options)), run_(std::move(run)), group_(group), rank_(group ? group->rank() : 0) {
  TORCH_CHECK_VALUE(options_.save_every() >= 0, "save-every=", options_.save_every(),
                    " must be >= 0 (0: at epoch ends only)");
  TORCH_CHECK_VALUE(options_.keep_last() >= 0, "keep-last=", options_.keep_last(), " must be >= 0 (0 keeps all)");
  TORCH_CHECK_VALUE(options_.resume() != "latest" || enabled(),
                    "--resume latest needs --checkpoint-dir (where to look for the latest checkpoint)");
  if (enabled() && rank_ == 0) lock_ = DirectoryLock(options_.dir(), "--checkpoint-dir");
}

std::optional<Checkpoint> Checkpointer::load_resume(int64_t epochs) {
  if (options_.resume().empty()) {
    refuse_existing_checkpoints();
    return std::nullopt;
  }
  std::string path = options_.resume();
  std::optional<Checkpoint> c;
  if (path == "latest" || std::filesystem::is_directory(path)) {
    const std::string dir = path == "latest" ? options_.dir() : path;
    if (list_checkpoints(dir).empty()) {
      TORCH_CHECK_VALUE(path == "latest", "rank ", rank_, ": --resume '", path, "': no checkpoint (step-*.pt) in it");
      if (rank_ == 0) std::printf("no checkpoint in '%s' yet: starting from scratch\n", dir.c_str());
      return std::nullopt;
    }
    c = load_newest_readable(dir, path);
  } else {
    c = load_checkpoint(path);
  }
  check_same_run(*c, run_, path);
  const std::string notice = adapt_position(*c, run_, path);  // see Note [Resuming on another world size]
  if (!notice.empty() && rank_ == 0) std::fprintf(stderr, "lockstep: warning: %s\n", notice.c_str());
  TORCH_CHECK_VALUE(c->position.epoch <= epochs, "checkpoint '", path, "' has completed ", c->position.epoch,
                    " epochs and --epochs is ", epochs, "; --epochs counts from the start of training: pass ",
                    c->position.epoch, " or more");
  if (c->position.epoch == epochs && rank_ == 0)
    std::printf("checkpoint '%s' has completed all %lld epochs: nothing left to train; evaluating it and "
                "writing the outputs\n", path.c_str(), static_cast<long long>(epochs));
  resumed_from_ = path;
  return c;
}

// Note [Falling back to an older checkpoint]
// A run killed while writing leaves the previous checkpoint intact (the write is atomic), but a
// damaged disk or a bad copy can still leave the newest file unreadable. A restart loop resuming
// "latest" would then fail on every attempt; instead it takes the newest file that reads (CRCs
// verified, see core/zip_checksum.h) and says which it skipped and why. A checkpoint named
// explicitly never falls back.
Checkpoint Checkpointer::load_newest_readable(const std::string& dir, std::string& path) {
  const std::vector<std::string> all = list_checkpoints(dir);
  std::string skipped;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      Checkpoint c = load_checkpoint(*it);
      path = *it;
      return c;
    } catch (const c10::Error& e) {
      std::fprintf(stderr, "lockstep: warning: rank %lld: skipping checkpoint '%s': %s; trying the one before it\n",
                   static_cast<long long>(rank_), it->c_str(), e.what_without_backtrace());
      skipped += (skipped.empty() ? "'" : ", '") + *it + "'";
    }
  }
  TORCH_CHECK(false, "rank ", rank_, ": none of the ", all.size(), " checkpoints in '", dir, "' can be read (",
              skipped, "); the warnings above say why. Start afresh without --resume, in an empty --checkpoint-dir");
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
  TrainingPosition position;
  if (c) {
    const std::string source = "checkpoint '" + resumed_from_ + "'";
    c10::impl::GenericDict state = string_dict();
    state.insert("optimizer", c->optimizer);
    state.insert("scaler", c->scaler);
    strategy.load_training_state_dict(state, source);
    const auto world = c->run.find("world_size");
    const bool same_world = world != c->run.end() && world->value() == run_.at("world_size");
    TORCH_CHECK(!same_world || rank_ < static_cast<int64_t>(c->rng.size()), source, " holds RNG states for ",
                c->rng.size(), " ranks; rank ", rank_, " has none");
    if (rank_ < static_cast<int64_t>(c->rng.size())) {  // see Note [Resuming on another world size]
      at::Generator generator = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(c->rng[rank_]);
    }
    position = c->position;
    if (rank_ == 0)
      std::printf("resumed from '%s': epoch %lld, step %lld\n", resumed_from_.c_str(),
                  static_cast<long long>(position.epoch + 1), static_cast<long long>(position.step));
  }
  if (group_) check_same_position_on_all_ranks(position);
  return position;
}

// Every rank resumes from the same step, or none does: a rank that found another checkpoint (no
// shared filesystem, a file written in between) would train a different number of steps.
void Checkpointer::check_same_position_on_all_ranks(const TrainingPosition& position) {
  torch::Tensor steps = torch::tensor({position.step, -position.step}, torch::kInt64);
  group_->all_reduce(steps, dist::ReduceOp::kMax);
  TORCH_CHECK(steps[0].item<int64_t>() == -steps[1].item<int64_t>(), "rank ", rank_, " resumes at step ",
              position.step, (resumed_from_.empty() ? " (no checkpoint)" : " from '" + resumed_from_ + "'"),
              " but other ranks resume between steps ", -steps[1].item<int64_t>(), " and ", steps[0].item<int64_t>(),
              ": every rank must see the same checkpoint directory (a shared filesystem across nodes)");
}

void Checkpointer::save(const TrainingPosition& at, parallel::Strategy& strategy) {
  torch::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();  // (5056) uint8
  std::vector<torch::Tensor> rngs = group_ ? group_->all_gather(rng) : std::vector<torch::Tensor>{rng};
  // Collective: a strategy whose state is spread over ranks gathers it to rank 0 here.
  c10::Dict<std::string, torch::Tensor> model = strategy.model_state_dict();
  const c10::impl::GenericDict state = strategy.training_state_dict();
  if (rank_ == 0) {
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
      std::fprintf(stderr, "lockstep: error: checkpoint at step %lld not saved: %s; training goes on, the last "
                   "good checkpoint is %s\n", static_cast<long long>(at.step), error_text(e).c_str(),
                   last ? ("'" + *last + "'").c_str() : "(none)");
    }
  }
  if (group_) group_->barrier();
}

}  // namespace lockstep::train
