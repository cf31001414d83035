#include "lockstep/core/zip_checksum.h"
#include "lockstep/models/mlp.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/train/checkpoint.h"
#include "targets.h"

namespace lockstep::fuzz {

void state_dict_input(const uint8_t* data, size_t size) {
  // Built once: the seeds are state dicts of this model, so accepted inputs reach every copy.
  static models::MLP model;
  const std::string path = write_input("model.pt", data, size);
  expect_clean_outcome(path, [&] { models::load_state_dict_file(*model, path); });
}

void checkpoint_input(const uint8_t* data, size_t size) {
  const std::string path = write_input("step-00000001.pt", data, size);
  expect_clean_outcome(path, [&] { train::load_checkpoint(path); });
}

void zip_checksum_input(const uint8_t* data, size_t size) {
  try {
    verify_zip_checksums(std::vector<char>(data, data + size));
  } catch (const c10::Error&) {
    // A clean rejection; anything else escapes to the driver as a crash.
  }
}

}  // namespace lockstep::fuzz
