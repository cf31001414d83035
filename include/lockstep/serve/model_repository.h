#pragma once

#include <torch/arg.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/serve/batcher.h"
#include "lockstep/serve/model_config.h"
#include "lockstep/serve/statistics.h"

namespace lockstep::serve {

struct RepositoryOptions {
  // Intra-op threads for the whole server, split among all model instances; 0: the cores this
  // process may use. See Note [Intra-op threads of instances].
  TORCH_ARG(int64_t, threads) = 0;
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
// stays listed, not ready, with the reason; the others serve. A version that fails to load is
// listed as unavailable while the model's other versions serve (as Triton does).
struct ServedModel {
  std::string name;
  std::optional<ModelConfig> config;  // unset when config.pbtxt did not parse
  bool ready = false;
  std::string reason;                 // why not ready
  std::vector<ServedVersion> versions;  // ascending; empty unless ready
  std::vector<UnavailableVersion> unavailable;  // ascending; empty unless ready (then `reason` covers them)

  // The version asked for ("" or absent: the highest), or nullptr.
  const ServedVersion* find_version(const std::string& version) const;
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

// A Triton-style model repository: DIR/<name>/config.pbtxt and DIR/<name>/<version>/model.pt.
class ModelRepository {
 public:
  // Loads every model directory of `directory` (one that fails is kept as not ready). Throws
  // c10::ValueError when `directory` is not a directory.
  static std::unique_ptr<ModelRepository> load(const std::string& directory, RepositoryOptions options = {});
  // One model from one weights file, served as version 1 (`lockstep serve --model --weights`).
  // Throws when the weights do not load: with a single model there is nothing else to serve.
  static std::unique_ptr<ModelRepository> single(const ModelConfig& config, const std::string& weights,
                                                 RepositoryOptions options = {});
  ~ModelRepository();

  const std::vector<ServedModel>& models() const { return models_; }
  // The directory load() read, as given; "" for single().
  const std::string& directory() const { return directory_; }
  const ServedModel* find(const std::string& name) const;
  bool all_ready() const;
  int64_t threads_per_instance() const { return threads_per_instance_; }
  // Stops every batcher: queued requests run, then the instances' threads end.
  void stop();

 private:
  ModelRepository() = default;
  std::vector<ServedModel> models_;
  std::string directory_;
  int64_t threads_per_instance_ = 1;
};

}  // namespace lockstep::serve
