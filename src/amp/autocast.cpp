#include "lockstep/amp/autocast.h"

#include <ATen/autocast_mode.h>

namespace lockstep::amp {
namespace {

void check_device(torch::DeviceType device) {
  TORCH_CHECK(device == torch::kCPU || device == torch::kCUDA, "autocast supports the devices cpu and cuda, got ",
              device);
}

// LibTorch 2.x autocasts to either 16-bit type on both devices (1.13's CPU autocast ran bf16 only).
void check_dtype(torch::DeviceType device, torch::ScalarType dtype) {
  TORCH_CHECK(dtype == torch::kBFloat16 || dtype == torch::kHalf, "autocast on ", device, " does not support dtype ",
              dtype, ": use torch::kBFloat16 or torch::kHalf");
}

}  // namespace

AutocastGuard::AutocastGuard(torch::DeviceType device, torch::ScalarType dtype, bool enabled)
    : device_(device) {
  check_device(device);
  if (enabled) check_dtype(device, dtype);
  previous_enabled_ = at::autocast::is_autocast_enabled(device);
  previous_dtype_ = at::autocast::get_autocast_dtype(device);
  at::autocast::set_autocast_enabled(device, enabled);
  if (enabled) at::autocast::set_autocast_dtype(device, dtype);
  at::autocast::increment_nesting();
}

// Note [Autocast weight cache]: inside an autocast region, the low-precision copy of each fp32 leaf
// that requires grad (a weight) is cast once and reused by later ops. The copy goes stale when the
// optimizer updates the weight, so like torch.autocast we drop the cache when the outermost region
// ends; a weight changed in place *inside* a region is still seen through the stale copy.
AutocastGuard::~AutocastGuard() {
  at::autocast::set_autocast_enabled(device_, previous_enabled_);
  at::autocast::set_autocast_dtype(device_, previous_dtype_);
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
}

bool autocast_enabled(torch::DeviceType device) {
  check_device(device);
  return at::autocast::is_autocast_enabled(device);
}

torch::ScalarType autocast_dtype(torch::DeviceType device) {
  check_device(device);
  return at::autocast::get_autocast_dtype(device);
}

}  // namespace lockstep::amp
