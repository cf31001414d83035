// The rank's device (Note [The rank's device]): the choice by name, what a rank binds for each
// count of visible devices, the refusals that name the rank and what it sees, and torchrun's
// --nproc-per-node words. The choice logic runs everywhere; binding a CUDA device needs one.
#include "lockstep/core/device.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <torch/cuda.h>

#include "../test_util.h"
#include "lockstep/launch/launch_settings.h"

namespace lockstep {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

WorldInfo rank_of(int64_t rank, int64_t world_size, int64_t local_rank, int64_t local_world_size) {
  WorldInfo w;
  w.rank = rank;
  w.world_size = world_size;
  w.local_rank = local_rank;
  w.local_world_size = local_world_size;
  return w;
}

VisibleDevices gpus(int64_t n, std::optional<std::string> mask = std::nullopt) {
  VisibleDevices v;
  v.cuda_built = true;
  v.cuda = n;
  v.cuda_visible_devices = std::move(mask);
  return v;
}

TEST(Device, ChoicesAreNamedAsTorchNamesDevices) {
  EXPECT_EQ(device_choice_from_name("cpu"), DeviceChoice::kCpu);
  EXPECT_EQ(device_choice_from_name("cuda"), DeviceChoice::kCuda);
  EXPECT_EQ(device_choice_from_name("auto"), DeviceChoice::kAuto);
  EXPECT_THAT(testing::error_message([] { device_choice_from_name("gpu0"); }),
              HasSubstr("unknown device 'gpu0'; choose cpu, cuda, auto"));
}

// Local rank r takes cuda:r among the visible devices, whatever its global rank (the second node's
// local rank 1 is global rank 5 of 8); auto is cuda when a device is visible, else cpu.
TEST(Device, EachLocalRankTakesTheVisibleDeviceOfItsIndex) {
  EXPECT_EQ(rank_device(DeviceChoice::kCpu, rank_of(5, 8, 1, 4), gpus(4)), torch::Device(torch::kCPU));
  EXPECT_EQ(rank_device(DeviceChoice::kCuda, rank_of(5, 8, 1, 4), gpus(4)), torch::Device(torch::kCUDA, 1));
  EXPECT_EQ(rank_device(DeviceChoice::kAuto, rank_of(3, 4, 3, 4), gpus(4)), torch::Device(torch::kCUDA, 3));
  EXPECT_EQ(rank_device(DeviceChoice::kAuto, rank_of(3, 4, 3, 4), gpus(0)), torch::Device(torch::kCPU));
}

TEST(Device, CudaWithoutADeviceOfItsOwnIsRefusedNamingTheRankAndWhatItSees) {
  EXPECT_THAT(testing::error_message([] { rank_device(DeviceChoice::kCuda, rank_of(1, 2, 1, 2), gpus(0, "")); }),
              AllOf(HasSubstr("device cuda: rank 1 of 2 (local rank 1 of 2 on its node) sees no CUDA device "
                              "visible (CUDA_VISIBLE_DEVICES=)"),
                    HasSubstr("train on the CPU (device cpu or auto)")));
  EXPECT_THAT(
      testing::error_message([] { rank_device(DeviceChoice::kAuto, rank_of(6, 8, 2, 4), gpus(2, "0,3")); }),
      AllOf(HasSubstr("rank 6 of 8 (local rank 2 of 4 on its node) has no CUDA device of its own: 2 CUDA device(s) "
                      "visible (CUDA_VISIBLE_DEVICES=0,3)"),
            HasSubstr("start at most 2 process(es) on this node")));
  VisibleDevices cpu_only;
  EXPECT_THAT(testing::error_message([&] { rank_device(DeviceChoice::kCuda, rank_of(0, 1, 0, 1), cpu_only); }),
              HasSubstr("this LibTorch is built without CUDA"));
}

// What this process sees is torch's count, and the variable as it is set.
TEST(Device, VisibleDevicesAreWhatTorchCounts) {
  const VisibleDevices here = VisibleDevices::probe();
  EXPECT_EQ(here.cuda, here.cuda_built ? torch::cuda::device_count() : 0);
  const char* mask = std::getenv("CUDA_VISIBLE_DEVICES");
  EXPECT_EQ(here.cuda_visible_devices.has_value(), mask != nullptr);
  EXPECT_THAT(gpus(0).describe(), HasSubstr("CUDA_VISIBLE_DEVICES unset"));
}

// torchrun's words: gpu is one worker per visible device (refused without one), cpu one per core,
// auto either; a number is itself (LaunchOptions::validate bounds it).
TEST(Device, NprocPerNodeWordsCountDevicesOrCores) {
  EXPECT_EQ(launch::nproc_per_node_from("gpu", "--nproc-per-node", gpus(8), 16), 8);
  EXPECT_EQ(launch::nproc_per_node_from("auto", "--nproc-per-node", gpus(8), 16), 8);
  EXPECT_EQ(launch::nproc_per_node_from("auto", "--nproc-per-node", gpus(0), 16), 16);
  EXPECT_EQ(launch::nproc_per_node_from("cpu", "--nproc-per-node", gpus(8), 16), 16);
  EXPECT_EQ(launch::nproc_per_node_from("3", "--nproc-per-node", gpus(8), 16), 3);
  EXPECT_THAT(testing::error_message([] { launch::nproc_per_node_from("gpu", "--nproc-per-node", gpus(0), 2); }),
              HasSubstr("--nproc-per-node gpu starts one worker per CUDA device, but this host has no CUDA device "
                        "visible (CUDA_VISIBLE_DEVICES unset); give a number, or cpu for one per core (2)"));
  EXPECT_THAT(testing::error_message([] { launch::nproc_per_node_from("2x", "--nproc-per-node", gpus(0), 2); }),
              HasSubstr("--nproc-per-node '2x' is not a number of workers, nor gpu, cpu or auto"));
}

// Binding makes the device current for work that names none (torch.cuda.set_device). Needs a GPU:
// listed in tests/skip-allowlist.
TEST(DeviceOnGpu, BindingMakesTheRanksDeviceCurrent) {
  const VisibleDevices here = VisibleDevices::probe();
  if (here.cuda == 0) GTEST_SKIP() << "no CUDA device: " << here.describe();
  const torch::Device device = rank_device(DeviceChoice::kCuda, rank_of(0, 1, here.cuda - 1, here.cuda), here);
  bind_device(device);
  EXPECT_EQ(torch::empty({1}, torch::kCUDA).device(), device);
  bind_device(torch::kCPU);  // nothing for the CPU: the CUDA device stays current
  EXPECT_EQ(torch::empty({1}, torch::kCUDA).device(), device);
}

}  // namespace
}  // namespace lockstep
