#pragma once
// What makes nodes one job: see Note [Nodes agree on the job] (src/launch/rendezvous.cpp).

#include <string>
#include <utility>
#include <vector>

namespace lockstep::launch {

// NAME=VALUE pairs for a process's environment.
using EnvVars = std::vector<std::pair<std::string, std::string>>;

// The command every node of a job runs, the variables a config file gives its workers, and the
// job's id: --rdzv-id (torchrun's name), or one derived from the command and the variables, so
// that nodes started with the same command share an id without being told one.
class JobIdentity {
 public:
  JobIdentity() = default;
  // `id` empty: derived. Throws c10::ValueError for an id of more than 128 characters or with
  // characters outside [A-Za-z0-9._:-].
  JobIdentity(std::vector<std::string> program, EnvVars env, std::string id = "");

  const std::string& id() const { return id_; }
  bool id_given() const { return id_given_; }
  const std::vector<std::string>& program() const { return program_; }

  // A store value, and back; decode throws c10::Error for bytes no encode() wrote.
  std::string encode() const;
  static JobIdentity decode(const std::string& bytes);

  // Whether `other` may be another job rather than this one run with another command: their ids
  // differ and at least one was given.
  bool other_job(const JobIdentity& other) const;
  // Empty when `theirs` runs the same command with the same variables; otherwise the first
  // difference in words, naming this node `me` and theirs `them` ("node 1", "the leader HOST:PORT").
  std::string difference(const JobIdentity& theirs, const std::string& me, const std::string& them) const;

 private:
  std::string id_;
  bool id_given_ = false;
  std::vector<std::string> program_;
  EnvVars env_;
};

}  // namespace lockstep::launch
