#include "lockstep/launch/job_identity.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <map>

#include "lockstep/core/fnv1a.h"

namespace lockstep::launch {
namespace {

constexpr const char* kMagic = "lockstep-job/1\n";
constexpr size_t kMaxIdLength = 128;
constexpr size_t kShown = 60;  // characters of a value a message shows

void put(std::string& out, const std::string& field) { out += std::to_string(field.size()) + ":" + field; }

// Reads one field put() wrote at `at`, moving past it.
std::string take(const std::string& in, size_t& at) {
  const size_t colon = in.find(':', at);
  TORCH_CHECK(colon != std::string::npos && colon > at && colon - at <= 20, "not a job record");
  size_t length = 0;
  for (size_t i = at; i < colon; ++i) {
    TORCH_CHECK(in[i] >= '0' && in[i] <= '9', "not a job record");
    length = length * 10 + static_cast<size_t>(in[i] - '0');
  }
  TORCH_CHECK(length <= in.size() - colon - 1, "not a job record (a field runs past its end)");
  at = colon + 1 + length;
  return in.substr(colon + 1, length);
}

size_t take_count(const std::string& in, size_t& at) {
  const std::string text = take(in, at);
  TORCH_CHECK(!text.empty() && text.size() <= 9 && std::all_of(text.begin(), text.end(), ::isdigit), "not a job record");
  return std::stoul(text);
}

std::string command_bytes(const std::vector<std::string>& program, const EnvVars& env) {
  std::string out;
  put(out, std::to_string(program.size()));
  for (const std::string& word : program) put(out, word);
  put(out, std::to_string(env.size()));
  for (const auto& [name, value] : env) {
    put(out, name);
    put(out, value);
  }
  return out;
}

std::string derived_id(const std::string& command) { return fnv1a64_hex(command).substr(0, 12); }

std::string shown(const std::string& value) {
  if (value.size() <= kShown) return "'" + value + "'";
  return "'" + value.substr(0, kShown) + "...' (" + std::to_string(value.size()) + " bytes)";
}

}  // namespace

JobIdentity::JobIdentity(std::vector<std::string> program, EnvVars env, std::string id)
    : id_(std::move(id)), id_given_(!id_.empty()), program_(std::move(program)), env_(std::move(env)) {
  TORCH_CHECK_VALUE(id_.size() <= kMaxIdLength, "--rdzv-id of ", id_.size(), " characters is too long: at most ",
                    kMaxIdLength);
  TORCH_CHECK_VALUE(std::all_of(id_.begin(), id_.end(),
                                [](unsigned char c) { return std::isalnum(c) || c == '.' || c == '_' || c == ':' || c == '-'; }),
                    "--rdzv-id ", shown(id_), " may only hold letters, digits and . _ : -");
  if (!id_given_) id_ = derived_id(command_bytes(program_, env_));
}

std::string JobIdentity::encode() const {
  std::string out = kMagic;
  put(out, id_);
  put(out, id_given_ ? "1" : "0");
  out += command_bytes(program_, env_);
  return out;
}

JobIdentity JobIdentity::decode(const std::string& bytes) {
  const std::string magic = kMagic;
  TORCH_CHECK(bytes.compare(0, magic.size(), magic) == 0, "not a job record of this lockstep version");
  size_t at = magic.size();
  JobIdentity job;
  job.id_ = take(bytes, at);
  job.id_given_ = take(bytes, at) == "1";
  const size_t words = take_count(bytes, at);
  for (size_t i = 0; i < words; ++i) job.program_.push_back(take(bytes, at));
  const size_t vars = take_count(bytes, at);
  for (size_t i = 0; i < vars; ++i) {
    std::string name = take(bytes, at);
    job.env_.emplace_back(std::move(name), take(bytes, at));
  }
  TORCH_CHECK(at == bytes.size(), "not a job record (bytes after its end)");
  return job;
}

bool JobIdentity::other_job(const JobIdentity& other) const {
  return id_ != other.id_ && (id_given_ || other.id_given_);
}

std::string JobIdentity::difference(const JobIdentity& theirs, const std::string& me, const std::string& them) const {
  if (program_.size() != theirs.program_.size())
    return me + " runs a program of " + std::to_string(program_.size()) + " words (PROGRAM and its arguments) but " +
           them + " one of " + std::to_string(theirs.program_.size()) +
           "; give every node the same PROGRAM [ARGS...] after --, and check the quoting";
  for (size_t i = 0; i < program_.size(); ++i) {
    if (program_[i] == theirs.program_[i]) continue;
    const std::string what = i == 0 ? "the program" : "argument " + std::to_string(i) + " of the program";
    return what + " is " + shown(program_[i]) + " on " + me + " but " + shown(theirs.program_[i]) + " on " + them +
           "; give every node the same PROGRAM [ARGS...] after --";
  }
  std::map<std::string, std::string> mine(env_.begin(), env_.end()), other(theirs.env_.begin(), theirs.env_.end());
  for (const auto* names : {&mine, &other})
    for (const auto& [name, value] : *names) {
      const auto a = mine.find(name), b = other.find(name);
      if (a != mine.end() && b != other.end() && a->second == b->second) continue;
      return "the workers' " + name + " is " + (a == mine.end() ? "unset" : shown(a->second)) + " on " + me + " but " +
             (b == other.end() ? "unset" : shown(b->second)) + " on " + them +
             " (a setting of the config file each node was given); give every node the same config";
    }
  return "";
}

}  // namespace lockstep::launch
