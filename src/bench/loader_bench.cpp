#include "lockstep/bench/loader_bench.h"

#include <torch/torch.h>

#include <chrono>

#include "lockstep/data/image_folder.h"
#include "lockstep/train/image_folder_data.h"

namespace lockstep::bench {

LoaderBenchResult run_loader_bench(const LoaderBenchOptions& o) {
  TORCH_CHECK_VALUE(o.batch_size() >= 1 && o.epochs() >= 1, "loader bench: batch size ", o.batch_size(), " and epochs ",
                    o.epochs(), " must be at least 1");
  auto data = std::make_shared<train::ImageFolderData>(
      std::make_shared<const data::ImageFolder>(o.data_dir()),
      train::ImageFolderDataOptions().transforms(data::Transforms::parse(o.transform())));
  train::BatchLoader loader(data, o.loader());
  LoaderBenchResult r;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t epoch = 0; epoch < o.epochs(); ++epoch) {
    const auto batches = train::sampler_batches(data->size(), {epoch, 1, 0, o.batch_size(), o.seed()});
    loader.start(batches, 0, epoch, o.seed());
    for (size_t b = 0; b < batches.size(); ++b) {
      const train::Example batch = loader.next();
      r.images += batch.data.size(0);
      r.checksum += batch.data.sum().item<double>();
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.images_per_s = static_cast<double>(r.images) / r.seconds;
  return r;
}

}  // namespace lockstep::bench
