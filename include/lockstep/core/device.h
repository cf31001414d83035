#pragma once

#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/core/world.h"

namespace lockstep {

// Note [The rank's device]
// A rank trains on one device, chosen once when the process starts: cpu, cuda, or auto (cuda when
// this process sees a CUDA device, else cpu). On CUDA, local rank r of a node takes cuda:r among
// the devices CUDA_VISIBLE_DEVICES leaves visible, as torch.cuda.set_device(LOCAL_RANK) does in a
// torchrun script: the launcher starts one worker per visible device (torchrun's
// --nproc-per-node gpu) and passes CUDA_VISIBLE_DEVICES through untouched, so every worker of a
// node sees the same devices and picks its own by local rank. The device is then an option every
// component receives; nothing above core asks which one it is.

enum class DeviceChoice { kCpu, kCuda, kAuto };
const std::vector<std::string>& device_choice_names();  // "cpu", "cuda", "auto"
DeviceChoice device_choice_from_name(const std::string& name);

// The CUDA devices this process can use, as torch counts them (after CUDA_VISIBLE_DEVICES).
struct VisibleDevices {
  int64_t cuda = 0;
  std::optional<std::string> cuda_visible_devices;  // the variable as set; nullopt when unset
  bool cuda_built = false;                          // this LibTorch carries CUDA kernels

  // What torch sees now: torch::cuda::device_count(), the variable, at::hasCUDA().
  static VisibleDevices probe();
  // "2 CUDA device(s) visible (CUDA_VISIBLE_DEVICES=0,3)", "no CUDA device visible
  // (CUDA_VISIBLE_DEVICES unset)", or "... (this LibTorch is built without CUDA)": for messages.
  std::string describe() const;
};

// The device `world`'s rank trains on under `choice` (see Note [The rank's device]). Throws
// c10::ValueError naming the rank, its local rank and what is visible when cuda is asked for and
// none is visible, or when the local rank has no device of its own (more processes on the node
// than visible devices).
torch::Device rank_device(DeviceChoice choice, const WorldInfo& world, const VisibleDevices& visible);

// Makes `device` the process's current CUDA device (torch.cuda.set_device): what CUDA work that
// names no device (NCCL's communicators, streams, events) runs on. Nothing for the CPU.
void bind_device(torch::Device device);

}  // namespace lockstep
