// `lockstep bench --loader`: the loader alone over an image folder, the same pixels for any
// worker count, and its JSON line.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "lockstep/bench/loader_bench.h"
#include "lockstep/data/image_folder.h"

namespace lockstep::bench {
namespace {

TEST(LoaderBench, EveryWorkerCountDeliversTheSamePixelsAndTheCliPrintsImagesPerSecond) {
  testing::TempDir dir;
  data::write_image_folder(data::make_synthetic(data::SyntheticOptions().size(150).seed(1)), dir / "f");
  const auto options = LoaderBenchOptions().data_dir(dir / "f").batch_size(16).epochs(2).transform(
      "RandomCrop(24, padding=2), RandomHorizontalFlip(), Grayscale(), ToTensor()");
  const LoaderBenchResult none = run_loader_bench(options);
  EXPECT_EQ(none.images, 300);
  EXPECT_GT(none.images_per_s, 0);
  for (int64_t workers : {1, 3}) {
    auto with = options;
    with.loader().workers(workers);
    const LoaderBenchResult r = run_loader_bench(with);
    EXPECT_EQ(r.images, 300);
    EXPECT_EQ(r.checksum, none.checksum) << workers << " workers";
  }
  const auto cli = testing::run_command("timeout 60 " + std::string(LOCKSTEP_CLI) + " bench --loader --data-dir " +
                                        dir / "f" + " --workers 2 --batch-size 16 --transform 'Grayscale()'");
  ASSERT_EQ(cli.exit_code, 0) << cli.output;
  const auto line = nlohmann::json::parse(testing::last_json_line(cli.output));
  EXPECT_EQ(line["images"].get<int64_t>(), 150);
  EXPECT_EQ(line["workers"].get<int64_t>(), 2);
  EXPECT_GT(line["images_per_s"].get<double>(), 0);
}

}  // namespace
}  // namespace lockstep::bench
