#include "lockstep/amp/autocast.h"

#include <ATen/autocast_mode.h>

namespace lockstep::amp {
namespace {

// The one seam between devices: LibTorch keeps separate autocast flags and dtypes per device
// (CUDA's under the unqualified names).
struct DeviceAutocast {
  bool (*is_enabled)();
  void (*set_enabled)(bool);
  at::ScalarType (*get_dtype)();
  void (*set_dtype)(at::ScalarType);
};

DeviceAutocast device_autocast(torch::DeviceType device) {
  switch (device) {
    case torch::kCPU:
      return {at::autocast::is_cpu_enabled, at::autocast::set_cpu_enabled,
              at::autocast::get_autocast_cpu_dtype, at::autocast::set_autocast_cpu_dtype};
    case torch::kCUDA:
      return {at::autocast::is_enabled, at::autocast::set_enabled, at::autocast::get_autocast_gpu_dtype,
              at::autocast::set_autocast_gpu_dtype};
    default:
      TORCH_CHECK(false, "autocast supports the devices cpu and cuda, got ", device);
  }
}

void check_dtype(torch::DeviceType device, torch::ScalarType dtype) {
  const bool ok = dtype == torch::kBFloat16 || (device == torch::kCUDA && dtype == torch::kHalf);
  TORCH_CHECK(ok, "autocast on ", device, " does not support dtype ", dtype, ": use ",
              device == torch::kCUDA ? "torch::kHalf or torch::kBFloat16" : "torch::kBFloat16",
              " (LibTorch's CPU autocast runs bf16 only)");
}

}  // namespace

AutocastGuard::AutocastGuard(torch::DeviceType device, torch::ScalarType dtype, bool enabled)
    : device_(device) {
  const DeviceAutocast autocast = device_autocast(device);
  if (enabled) check_dtype(device, dtype);
  previous_enabled_ = autocast.is_enabled();
  previous_dtype_ = autocast.get_dtype();
  autocast.set_enabled(enabled);
  if (enabled) autocast.set_dtype(dtype);
  at::autocast::increment_nesting();
}

// Note [Autocast weight cache]: inside an autocast region, the low-precision copy of each fp32 leaf
// that requires grad (a weight) is cast once and reused by later ops. The copy goes stale when the
// optimizer updates the weight, so like torch.autocast we drop the cache when the outermost region
// ends; a weight changed in place *inside* a region is still seen through the stale copy.
AutocastGuard::~AutocastGuard() {
  const DeviceAutocast autocast = device_autocast(device_);
  autocast.set_enabled(previous_enabled_);
  autocast.set_dtype(previous_dtype_);
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
}

bool autocast_enabled(torch::DeviceType device) { return device_autocast(device).is_enabled(); }

torch::ScalarType autocast_dtype(torch::DeviceType device) { return device_autocast(device).get_dtype(); }

}  // namespace lockstep::amp
