#pragma once

#include <torch/arg.h>

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/serve/batcher.h"
#include "lockstep/serve/model_config.h"
#include "lockstep/serve/statistics.h"

namespace lockstep::serve {

// Triton's --model-control-mode: which models load, and whether a client may load and unload them.
enum class ModelControlMode {
  kNone,      // every model of the repository loads at start; load and unload are refused
  kExplicit,  // only startup_models load at start; clients load and unload (the repository API)
  kPoll,      // every model loads at start, and a rescan every poll_interval_s loads what was added or
              // changed and unloads what was removed; clients may not load or unload
};

struct RepositoryOptions {
  // Intra-op threads for the whole server, split among all model instances; 0: the cores this
  // process may use. See Note [Intra-op threads of instances].
  TORCH_ARG(int64_t, threads) = 0;
  TORCH_ARG(ModelControlMode, model_control_mode) = ModelControlMode::kNone;
  // kExplicit: the models loaded at start ("*": all), as Triton's --load-model.
  TORCH_ARG(std::vector<std::string>, startup_models);
  TORCH_ARG(double, poll_interval_s) = 15;  // kPoll: seconds between rescans (Triton's default)
  // Told one line for every model a client's load or unload, or a rescan, changes ("model 'b'
  // loaded: version(s) 1", "model 'a' unloaded", "model 'c' failed to load: ..."); from the thread
  // that made the change.
  TORCH_ARG(std::function<void(const std::string&)>, on_change);
};

// One loaded version of a model: its counters and the batcher that runs its instances.
struct ServedVersion {
  int64_t version = 0;
  std::unique_ptr<ModelStatistics> statistics;
  std::unique_ptr<Batcher> batcher;
};

// A version that failed to load, and why.
struct UnavailableVersion {
  int64_t version = 0;
  std::string reason;
};

// A model of the repository. A model whose config failed to load, or none of whose versions did,
// stays listed, not ready, with the reason; the others serve. A model that is not loaded (explicit
// mode before a load, or after an unload) is listed not ready with reason "unloaded". A version that
// fails to load is listed as unavailable while the model's other versions serve (as Triton does).
struct ServedModel {
  std::string name;
  bool loaded = true;                 // false: listed for the index only (explicit mode, unloaded)
  std::optional<ModelConfig> config;  // unset when config.pbtxt did not parse
  bool ready = false;
  std::string reason;                 // why not ready
  std::vector<ServedVersion> versions;  // ascending; empty unless ready
  std::vector<UnavailableVersion> unavailable;  // ascending; empty unless ready (then `reason` covers them)

  // The version asked for ("" or absent: the highest), or nullptr.
  const ServedVersion* find_version(const std::string& version) const;
  // Stops every version's batcher: queued requests run, then the instances' threads end.
  void stop() const;
};

// Note [Intra-op threads of instances]
// at::set_num_threads is process-global in intent: it records one default that every thread picks
// up before its first parallel operation. Under the OpenMP backend Debian's LibTorch uses, it also
// sets the calling thread's own OpenMP team size, and each thread gets its own team. So the server
// splits --threads evenly among all instances of all models (at least 1 each) and every instance's
// worker thread sets that share for itself before its first forward; since all instances set the
// same value, the global default they race to write is the same too. Two instances thus run two
// forwards side by side on threads/2 cores each rather than fighting over one pool.
// The instances of a version share one module, loaded once: each runs it from its own worker
// thread, side by side with the others. Triton's PyTorch backend loads a copy per instance, which
// on one device buys nothing but memory: four instances of a model with 1 GB of weights held 3.5 GB
// (issue 53's probe). What
// sharing relies on is that an inference forward writes nothing outside its own outputs: an
// eval-mode reference model under NoGradGuard (infer::Predictor; BatchNorm in eval reads its running
// stats), and a TorchScript module under InferenceMode, whose interpreter keeps each call's values
// on the calling thread's stack (its executor's plan is made once, under its own lock). A scripted
// module that assigns to its own attributes in forward would race; Python's would too, run from
// two threads.

// A load or unload the repository's mode does not allow; the server answers it 503 / UNAVAILABLE.
class ModelControlRefused : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Note [Loading and unloading while serving]
// A request finds its model as a shared_ptr and holds it until it is answered, so a model unloaded
// or replaced meanwhile lives on until the last such request is done. Unloading takes the model out
// of the list first (new requests get 404 or "unloaded"), then stops its batchers: every request
// already queued runs and is answered, and one that found the model but had not yet queued is
// refused with 503 ("shutting down"); nothing accepted is dropped. A (re)load builds the new model
// aside, from the files as they are, and swaps it in only when its config parsed: a reload whose
// config is broken leaves the old model serving (Triton's rule), while one whose versions fail to
// load replaces it with the not-ready model and its reason.

// A Triton-style model repository: DIR/<name>/config.pbtxt and DIR/<name>/<version>/model.pt.
class ModelRepository {
 public:
  // Loads the models of `directory` that the options' mode loads at start (one that fails is kept
  // as not ready). Throws c10::ValueError when `directory` is not a directory, or when a startup
  // model has no directory there.
  static std::unique_ptr<ModelRepository> load(const std::string& directory, RepositoryOptions options = {});
  // One model from one weights file, served as version 1 (`lockstep serve --model --weights`).
  // Throws when the weights do not load: with a single model there is nothing else to serve.
  static std::unique_ptr<ModelRepository> single(const ModelConfig& config, const std::string& weights,
                                                 RepositoryOptions options = {});
  ~ModelRepository();

  // Every model, by name, as it is now (see Note [Loading and unloading while serving]).
  std::vector<std::shared_ptr<const ServedModel>> models() const;
  // The directory load() read, as given; "" for single().
  const std::string& directory() const { return directory_; }
  std::shared_ptr<const ServedModel> find(const std::string& name) const;
  bool all_ready() const;
  int64_t threads_per_instance() const { return threads_per_instance_; }
  ModelControlMode mode() const { return options_.model_control_mode(); }

  // kExplicit only (otherwise throws ModelControlRefused): loads, or reloads, model `name` from its
  // directory; throws c10::ValueError when the repository has no such directory, c10::Error with the
  // reason when it fails to load (the model is then listed not ready with it, unless its config did
  // not parse and an older load still serves). A `config_json` override (Triton's load "config"
  // parameter, the configuration in JSON) is used in place of config.pbtxt for this load only; the
  // version directories are the repository's.
  void load_model(const std::string& name, const std::optional<std::string>& config_json = std::nullopt);
  // kExplicit only: unloads `name` (throws c10::ValueError when no such model is loaded).
  void unload_model(const std::string& name);
  // kPoll: one rescan now (the poll thread's own step; for tests). Returns the names it (re)loaded
  // or unloaded.
  std::vector<std::string> poll();

  // Stops the poll thread and every batcher: queued requests run, then the instances' threads end.
  void stop();

 private:
  explicit ModelRepository(RepositoryOptions options) : options_(std::move(options)) {}
  std::shared_ptr<ServedModel> read_model(const std::string& name,
                                         const std::optional<std::string>& config_json = std::nullopt) const;
  void replace(const std::string& name, std::shared_ptr<const ServedModel> model);
  void report(const std::string& name, const ServedModel* model) const;  // nullptr: gone
  void poll_loop();

  RepositoryOptions options_;
  std::string directory_;
  int64_t threads_per_instance_ = 1;
  mutable std::mutex mutex_;  // guards models_ and fingerprints_
  std::map<std::string, std::shared_ptr<const ServedModel>> models_;
  std::map<std::string, std::string> fingerprints_;  // kPoll: what the files looked like when loaded
  std::mutex control_;  // one load, unload or rescan at a time
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::thread poller_;
};

}  // namespace lockstep::serve
