#include "service_lookup.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <regex>

namespace lockstep::serve {
namespace {

// Compares in time that depends on the lengths only, not on where the first difference is.
bool same_secret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char difference = 0;
  for (size_t i = 0; i < a.size(); ++i) difference |= static_cast<unsigned char>(a[i] ^ b[i]);
  return difference == 0;
}

}  // namespace

// curl, Go and Python clients send "Bearer", some proxies "bearer"; one or more spaces may follow.
// A token sent with the wrong scheme is still a secret: never quoted back.
void check_bearer(const std::string& token, const std::string* given) {
  if (token.empty()) return;
  if (given == nullptr) throw HttpError(401, "this server needs \"Authorization: Bearer <token>\"");
  const size_t space = std::min(given->find(' '), given->size());
  const bool bearer = space == 6 && std::equal(given->begin(), given->begin() + 6, "bearer", [](char a, char b) {
    return std::tolower(static_cast<unsigned char>(a)) == b;
  });
  if (!bearer)
    throw HttpError(401, "the Authorization header's scheme is not Bearer; this server needs \"Authorization: "
                         "Bearer <token>\"");
  const size_t start = std::min(given->find_first_not_of(' ', space), given->size());
  if (!same_secret(given->substr(start), token)) throw HttpError(401, "the bearer token is not this server's");
}

std::string public_reason(const ServiceState& state, const std::string& reason) {
  if (state.verbose_errors) return reason;
  namespace fs = std::filesystem;
  std::string out = reason;
  const std::string& dir = state.repository.directory();
  std::error_code ec;
  for (const std::string& prefix : {dir, fs::absolute(dir, ec).string(), fs::weakly_canonical(dir, ec).string()}) {
    if (prefix.empty()) continue;
    const std::string with_slash = prefix.back() == '/' ? prefix : prefix + "/";
    for (size_t at = out.find(with_slash); at != std::string::npos; at = out.find(with_slash, at))
      out.erase(at, with_slash.size());
  }
  static const std::regex elsewhere(R"((^|[\s'"(=])/(?:[^\s'"():/]+/)+([^\s'"():/]+))");
  return std::regex_replace(out, elsewhere, "$1$2");
}

Target find_target(const ServiceState& state, const std::string& name, const std::string& version) {
  std::shared_ptr<const ServedModel> model = state.repository.find(name);
  if (model == nullptr) {
    std::vector<std::string> names;
    for (const auto& m : state.repository.models()) names.push_back("'" + m->name + "'");
    throw HttpError(404, "unknown model '" + name + "'; this server has " +
                             (names.empty() ? std::string("none") : c10::Join(", ", names)));
  }
  if (!model->ready) throw HttpError(503, "model '" + name + "' is not ready: " + public_reason(state, model->reason));
  const ServedVersion* v = model->find_version(version);
  for (const UnavailableVersion& u : model->unavailable)
    if (v == nullptr && std::to_string(u.version) == version)
      throw HttpError(503, "model '" + name + "' version " + version + " is not ready: " +
                               public_reason(state, u.reason));
  if (v == nullptr) {
    std::vector<int64_t> versions;
    for (const ServedVersion& s : model->versions) versions.push_back(s.version);
    throw HttpError(404, "model '" + name + "' has no version '" + version + "'; it serves version(s) " +
                             c10::Join(", ", versions));
  }
  return {std::move(model), v};
}

Refusal refusal(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const HttpError& e) {
    return {e.status(), e.what()};
  } catch (const Unavailable& e) {
    return {503, e.what()};
  } catch (const c10::Error& e) {
    return {500, std::string("inference failed: ") + e.what_without_backtrace()};
  } catch (const std::exception& e) {
    return {500, std::string("inference failed: ") + e.what()};
  }
}

void check_ready(const ServiceState& state) {
  if (state.shutting_down) throw HttpError(503, "the server is shutting down");
  for (const auto& m : state.repository.models())  // a model not loaded on purpose does not count
    if (m->loaded && !m->ready && state.strict_readiness)
      throw HttpError(503, "model '" + m->name + "' is not ready: " + public_reason(state, m->reason));
}

std::vector<IndexEntry> repository_index(const ServiceState& state) {
  std::vector<IndexEntry> index;
  for (const auto& m : state.repository.models()) {
    if (!m->ready) index.push_back({m->name, "", "UNAVAILABLE", public_reason(state, m->reason)});
    for (const ServedVersion& v : m->versions) index.push_back({m->name, std::to_string(v.version), "READY", ""});
    for (const UnavailableVersion& u : m->unavailable)
      index.push_back({m->name, std::to_string(u.version), "UNAVAILABLE", public_reason(state, u.reason)});
  }
  return index;
}

void control_model(ServiceState& state, const std::string& name, bool load,
                   const std::optional<std::string>& config_json) {
  try {
    load ? state.repository.load_model(name, config_json) : state.repository.unload_model(name);
  } catch (const ModelControlRefused& e) {
    throw HttpError(503, e.what());
  } catch (const c10::Error& e) {
    throw HttpError(400, public_reason(state, e.what_without_backtrace()));
  }
}

void refuse_control_parameter(const std::string& key) {
  throw HttpError(400, "parameter '" + key + "' is not supported by this server" +
                           (key.rfind("file:", 0) == 0 ? "; a load reads the model's files from the repository" : ""));
}

}  // namespace lockstep::serve
