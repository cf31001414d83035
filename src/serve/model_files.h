#pragma once
// A model's files in a Triton-style repository, read into what ModelRepository serves: config.pbtxt,
// the numbered version directories and each version's model.pt. Private to src/serve.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "lockstep/serve/model_repository.h"

namespace lockstep::serve {

// Version `version` of a model from its weights file: one module shared by the config's instances
// (Note [Intra-op threads of instances]), checked with a forward of zero inputs, behind a batcher.
// Throws c10::Error naming the file and what does not fit the config.
ServedVersion load_version(const ModelConfig& config, int64_t version, const std::string& weights,
                           int64_t threads_per_instance);
// The intra-op threads each of `instances` instances gets from `threads` (0: the cores), at least 1.
int64_t share_threads(int64_t threads, int64_t instances);
// Loads the versions `model.config` selects from `directory` into `model`; when none loads, the model
// is not ready and `reason` says why, version by version.
void load_versions(ServedModel& model, const std::filesystem::path& directory, int64_t threads_per_instance);
// config.pbtxt of model directory `dir`, parsed; throws c10::ValueError naming what is wrong.
ModelConfig read_config(const std::filesystem::path& dir);
// The model directories of `directory`, by name, sorted.
std::vector<std::string> model_directories(const std::string& directory);
// What a model directory's files look like (names, sizes, times to depth 2): a rescan reloads a model
// whose fingerprint changed.
std::string fingerprint(const std::filesystem::path& directory);

}  // namespace lockstep::serve
