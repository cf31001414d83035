// DeepSpeed JSON configs (issue 53). See targets.h.
#include "lockstep/train/deepspeed_config.h"
#include "targets.h"

namespace lockstep::fuzz {

void deepspeed_config_input(const uint8_t* data, size_t size) {
  const std::string path = write_input("ds_config.json", data, size);
  expect_clean_outcome(path, [&] {
    (void)train::with_deepspeed_config_file(train::TrainOptions(), path,
                                            train::DeepSpeedConfigOptions().world_size(2).reporter(Reporter()));
  });
}

}  // namespace lockstep::fuzz
