// accelerate config files (issue 53). See targets.h.
#include "lockstep/launch/accelerate_config.h"
#include "targets.h"

namespace lockstep::fuzz {

void accelerate_config_input(const uint8_t* data, size_t size) {
  const std::string path = write_input("accelerate.yaml", data, size);
  expect_clean_outcome(path, [&] {
    (void)launch::accelerate_launch_settings(path, launch::AccelerateConfigOptions().reporter(Reporter()));
  });
}

}  // namespace lockstep::fuzz
