#include "lockstep/core/device.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>

#include <cstdlib>

#include "lockstep/core/names.h"

namespace lockstep {

const std::vector<std::string>& device_choice_names() {
  static const std::vector<std::string> names{"cpu", "cuda", "auto"};
  return names;
}

DeviceChoice device_choice_from_name(const std::string& name) {
  return enum_from_name<DeviceChoice>(device_choice_names(), name, "device");
}

VisibleDevices VisibleDevices::probe() {
  VisibleDevices v;
  v.cuda_built = at::detail::getCUDAHooks().isBuilt();
  v.cuda = v.cuda_built ? static_cast<int64_t>(torch::cuda::device_count()) : 0;
  if (const char* mask = std::getenv("CUDA_VISIBLE_DEVICES")) v.cuda_visible_devices = mask;
  return v;
}

std::string VisibleDevices::describe() const {
  const std::string mask =
      cuda_visible_devices ? "CUDA_VISIBLE_DEVICES=" + *cuda_visible_devices : "CUDA_VISIBLE_DEVICES unset";
  if (!cuda_built) return "no CUDA device visible (this LibTorch is built without CUDA)";
  if (cuda == 0) return "no CUDA device visible (" + mask + ")";
  return std::to_string(cuda) + " CUDA device(s) visible (" + mask + ")";
}

torch::Device rank_device(DeviceChoice choice, const WorldInfo& world, const VisibleDevices& visible) {
  if (choice == DeviceChoice::kCpu || (choice == DeviceChoice::kAuto && visible.cuda == 0)) return torch::kCPU;
  const std::string who = "rank " + std::to_string(world.rank) + " of " + std::to_string(world.world_size) +
                          " (local rank " + std::to_string(world.local_rank) + " of " +
                          std::to_string(world.local_world_size) + " on its node)";
  TORCH_CHECK_VALUE(visible.cuda > 0, "device cuda: ", who, " sees ", visible.describe(),
                    "; train on the CPU (device cpu or auto), or run where a GPU is visible");
  TORCH_CHECK_VALUE(world.local_rank < visible.cuda, "device ", enum_name(device_choice_names(), choice), ": ", who,
                    " has no CUDA device of its own: ", visible.describe(), ", and local rank r takes cuda:r; start "
                    "at most ", visible.cuda, " process(es) on this node (one per visible device), or make more "
                    "devices visible");
  return {torch::kCUDA, static_cast<c10::DeviceIndex>(world.local_rank)};
}

void bind_device(torch::Device device) {
  if (device.is_cpu()) return;
  c10::impl::getDeviceGuardImpl(device.type())->setDevice(device);
}

}  // namespace lockstep
