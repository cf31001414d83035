#include "lockstep/serve/model_repository.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "model_files.h"

namespace lockstep::serve {
namespace fs = std::filesystem;
namespace {

std::shared_ptr<ServedModel> unloaded_model(const std::string& name) {
  auto m = std::make_shared<ServedModel>();
  m->name = name;
  m->loaded = false;
  m->reason = "unloaded";
  return m;
}

const char* mode_name(ModelControlMode mode) {
  return mode == ModelControlMode::kNone ? "none" : mode == ModelControlMode::kPoll ? "poll" : "explicit";
}

}  // namespace

const ServedVersion* ServedModel::find_version(const std::string& version) const {
  if (versions.empty()) return nullptr;
  if (version.empty()) return &versions.back();
  for (const ServedVersion& v : versions)
    if (std::to_string(v.version) == version) return &v;
  return nullptr;
}

void ServedModel::stop() const {
  for (const ServedVersion& v : versions) v.batcher->stop();
}

std::unique_ptr<ModelRepository> ModelRepository::load(const std::string& directory, RepositoryOptions options) {
  TORCH_CHECK_VALUE(fs::is_directory(directory), "model repository '", directory,
                    "' is not a directory; it holds one directory per model, each with config.pbtxt");
  const std::vector<std::string> names = model_directories(directory);
  std::vector<std::string> startup = names;
  if (options.model_control_mode() == ModelControlMode::kExplicit) {
    const auto& asked = options.startup_models();
    startup = std::find(asked.begin(), asked.end(), "*") != asked.end() ? names : asked;
    for (const std::string& name : startup)
      TORCH_CHECK_VALUE(std::binary_search(names.begin(), names.end(), name), "startup model '", name,
                        "' has no directory in model repository '", directory, "'");
  }
  TORCH_CHECK_VALUE(options.poll_interval_s() > 0, "RepositoryOptions::poll_interval_s ", options.poll_interval_s(),
                    " must be positive");
  std::unique_ptr<ModelRepository> repo(new ModelRepository(options));
  repo->directory_ = directory;
  int64_t instances = 0;  // of every model that loads at start, for the threads' share
  for (const std::string& name : startup) {
    try {
      instances += read_config(fs::path(directory) / name).instance_count;
    } catch (const c10::Error&) {  // reported when the model is read below
    }
  }
  repo->threads_per_instance_ = share_threads(options.threads(), instances);
  for (const std::string& name : names) {
    const bool loads = std::find(startup.begin(), startup.end(), name) != startup.end();
    repo->models_[name] = loads ? repo->read_model(name) : unloaded_model(name);
    if (loads) repo->fingerprints_[name] = fingerprint(fs::path(directory) / name);
  }
  if (options.model_control_mode() == ModelControlMode::kPoll)
    repo->poller_ = std::thread([r = repo.get()] { r->poll_loop(); });
  return repo;
}

std::unique_ptr<ModelRepository> ModelRepository::single(const ModelConfig& config, const std::string& weights,
                                                         RepositoryOptions options) {
  std::unique_ptr<ModelRepository> repo(new ModelRepository(options));
  repo->threads_per_instance_ = share_threads(options.threads(), config.instance_count);
  auto m = std::make_shared<ServedModel>();
  m->name = config.name;
  m->config = config;
  m->versions.push_back(load_version(config, 1, weights, repo->threads_per_instance_));
  m->ready = true;
  repo->models_[m->name] = std::move(m);
  return repo;
}

ModelRepository::~ModelRepository() { stop(); }

std::shared_ptr<ServedModel> ModelRepository::read_model(const std::string& name,
                                                         const std::optional<std::string>& config_json) const {
  auto m = std::make_shared<ServedModel>();
  m->name = name;
  const fs::path dir = fs::path(directory_) / name;
  try {
    m->config = config_json ? parse_model_config_json(*config_json, "the load's config override", name)
                            : read_config(dir);
  } catch (const c10::Error& e) {
    m->reason = e.what_without_backtrace();
    return m;
  }
  load_versions(*m, dir, threads_per_instance_);
  return m;
}

std::vector<std::shared_ptr<const ServedModel>> ModelRepository::models() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::shared_ptr<const ServedModel>> out;
  for (const auto& [name, m] : models_) out.push_back(m);
  return out;
}

std::shared_ptr<const ServedModel> ModelRepository::find(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = models_.find(name);
  return it == models_.end() ? nullptr : it->second;
}

bool ModelRepository::all_ready() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::all_of(models_.begin(), models_.end(), [](const auto& m) { return m.second->ready; });
}

void ModelRepository::report(const std::string& name, const ServedModel* m) const {
  if (!options_.on_change()) return;
  if (m == nullptr || !m->loaded) return options_.on_change()("model '" + name + "' unloaded");
  if (!m->ready) return options_.on_change()("model '" + name + "' failed to load: " + m->reason);
  std::vector<int64_t> versions;
  for (const ServedVersion& v : m->versions) versions.push_back(v.version);
  options_.on_change()("model '" + name + "' loaded: version(s) " + c10::Join(", ", versions));
}

// See Note [Loading and unloading while serving]: the old model's queued requests run before this
// returns; requests that hold it finish on their own threads.
void ModelRepository::replace(const std::string& name, std::shared_ptr<const ServedModel> model) {
  report(name, model.get());
  std::shared_ptr<const ServedModel> old;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& slot = models_[name];
    old = std::move(slot);
    if (model)
      slot = std::move(model);
    else
      models_.erase(name);
  }
  if (old) old->stop();
}

void ModelRepository::load_model(const std::string& name, const std::optional<std::string>& config_json) {
  if (mode() != ModelControlMode::kExplicit)
    throw ModelControlRefused(std::string("this server's model control mode is '") + mode_name(mode()) +
                              "': models load when it starts" +
                              (mode() == ModelControlMode::kPoll ? " and when the repository changes" : "") +
                              "; a server in 'explicit' mode loads and unloads them on request");
  TORCH_CHECK_VALUE(!directory_.empty() && !name.empty() && name.find('/') == std::string::npos && name != "." &&
                        name != ".." && fs::is_directory(fs::path(directory_) / name),
                    "the model repository has no model directory '", name, "'");
  std::lock_guard<std::mutex> control(control_);
  std::shared_ptr<ServedModel> fresh = read_model(name, config_json);
  const std::shared_ptr<const ServedModel> old = find(name);
  TORCH_CHECK(fresh->config || !old || !old->ready, "model '", name, "' was not reloaded, and its loaded version(s) ",
              "serve on: ", fresh->reason);
  const std::string reason = fresh->reason;
  const bool ready = fresh->ready;
  replace(name, std::move(fresh));
  TORCH_CHECK(ready, "model '", name, "' failed to load: ", reason);
}

void ModelRepository::unload_model(const std::string& name) {
  if (mode() != ModelControlMode::kExplicit)
    throw ModelControlRefused(std::string("this server's model control mode is '") + mode_name(mode()) +
                              "': a server in 'explicit' mode loads and unloads models on request");
  std::lock_guard<std::mutex> control(control_);
  const std::shared_ptr<const ServedModel> old = find(name);
  TORCH_CHECK_VALUE(old != nullptr && old->loaded, "model '", name, "' is not loaded");
  replace(name, unloaded_model(name));
}

std::vector<std::string> ModelRepository::poll() {
  std::lock_guard<std::mutex> control(control_);
  std::vector<std::string> changed;
  const std::vector<std::string> names = model_directories(directory_);
  for (const std::string& name : names) {
    const std::string now = fingerprint(fs::path(directory_) / name);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto it = fingerprints_.find(name);
      if (it != fingerprints_.end() && it->second == now) continue;
      fingerprints_[name] = now;
    }
    std::shared_ptr<ServedModel> fresh = read_model(name);
    const std::shared_ptr<const ServedModel> old = find(name);
    if (!fresh->config && old && old->ready) continue;  // a broken config.pbtxt: the old model serves on
    replace(name, std::move(fresh));
    changed.push_back(name);
  }
  for (const auto& m : models()) {
    if (std::binary_search(names.begin(), names.end(), m->name)) continue;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      fingerprints_.erase(m->name);
    }
    replace(m->name, nullptr);
    changed.push_back(m->name);
  }
  return changed;
}

void ModelRepository::poll_loop() {
  const auto interval = std::chrono::duration<double>(options_.poll_interval_s());
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_cv_.wait_for(lock, interval, [this] { return stopping_; })) {
    lock.unlock();
    try {
      poll();
    } catch (const std::exception&) {  // a directory that vanished mid-scan: the next rescan sees it
    }
    lock.lock();
  }
}

void ModelRepository::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (poller_.joinable()) poller_.join();
  for (const auto& m : models()) m->stop();
}

}  // namespace lockstep::serve
