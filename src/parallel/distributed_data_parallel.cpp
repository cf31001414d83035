#include "lockstep/parallel/distributed_data_parallel.h"

#include <torch/csrc/utils/tensor_flatten.h>
#include <torch/torch.h>

#include <sstream>

#include "lockstep/parallel/sync_batch_norm.h"

namespace lockstep::parallel {
namespace {

std::string describe(const std::string& kind, const std::string& name, const torch::Tensor& t) {
  std::ostringstream s;
  s << kind << " '" << name << "' " << t.sizes() << " " << t.scalar_type();
  return s.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// Rank 0 broadcasts a description of its model; every rank compares it with its own and all ranks
// agree on the verdict, so either all continue or all fail, each naming what it found.
void check_same_model_on_all_ranks(torch::nn::Module& module, dist::ProcessGroup& group) {
  std::string mine;
  for (const auto& p : module.named_parameters()) mine += describe("parameter", p.key(), p.value()) + "\n";
  for (const auto& b : module.named_buffers()) mine += describe("buffer", b.key(), b.value()) + "\n";

  torch::Tensor length = torch::tensor({static_cast<int64_t>(mine.size())});
  group.broadcast(length);
  torch::Tensor bytes = torch::zeros({length.item<int64_t>()}, torch::kUInt8);
  if (group.rank() == 0) std::memcpy(bytes.data_ptr(), mine.data(), mine.size());
  group.broadcast(bytes);
  const std::string theirs(static_cast<const char*>(bytes.data_ptr()), bytes.numel());

  std::string problem;
  if (theirs != mine) {
    auto a = lines_of(mine), b = lines_of(theirs);
    size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
    problem = "rank " + std::to_string(group.rank()) + " has " +
              (i < a.size() ? a[i] : std::string("no more entries")) + " where rank 0 has " +
              (i < b.size() ? b[i] : std::string("no more entries"));
  }
  torch::Tensor bad = torch::tensor({problem.empty() ? 0 : 1}, torch::kInt32);
  group.all_reduce(bad);
  TORCH_CHECK(bad.item<int32_t>() == 0, "DistributedDataParallel: the model differs across ranks (",
              bad.item<int32_t>(), " of ", group.size(), " ranks disagree with rank 0). ",
              problem.empty() ? "This rank matches rank 0; see the other ranks' errors" : problem,
              ". Build the same model, with the same options, on every rank");
}

// One broadcast, whatever the dtypes: every tensor's bytes go into one flat uint8 buffer (BN
// buffers mix float statistics with an int64 counter), which saves a collective per forward.
void broadcast_from_rank0(dist::ProcessGroup& group, const std::vector<torch::Tensor>& tensors) {
  if (group.size() == 1 || tensors.empty()) return;
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> bytes;
  for (const auto& t : tensors) bytes.push_back(t.detach().contiguous().reshape({-1}).view(torch::kUInt8));
  torch::Tensor flat = torch::cat(bytes);
  group.broadcast(flat, 0);
  int64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t n = bytes[i].numel();
    // clone(): a slice at an odd byte offset cannot be viewed as a wider dtype in place.
    tensors[i].copy_(flat.narrow(0, offset, n).clone().view(tensors[i].scalar_type()).view(tensors[i].sizes()));
    offset += n;
  }
}

}  // namespace

void sync_module_states(torch::nn::Module& module, dist::ProcessGroup& group) {
  check_same_model_on_all_ranks(module, group);
  std::vector<torch::Tensor> state;
  for (const auto& p : module.parameters()) state.push_back(p);
  for (const auto& b : module.buffers()) state.push_back(b);
  broadcast_from_rank0(group, state);
}

DistributedDataParallel::DistributedDataParallel(torch::nn::AnyModule module, dist::ProcessGroup& group,
                                                 DistributedDataParallelOptions options)
    : forward_(std::move(module)), module_(forward_.ptr()), group_(group), options_(options) {
  TORCH_CHECK_VALUE(options_.bucket_cap_mb() > 0, "bucket_cap_mb=", options_.bucket_cap_mb(),
                    " must be positive");
  if (options_.init_sync()) sync_module_states(*module_, group_);

  std::vector<torch::Tensor> params;
  std::vector<std::string> names;
  for (const auto& item : module_->named_parameters()) {
    if (!item.value().requires_grad()) continue;
    params.push_back(item.value());
    names.push_back(item.key());
  }
  ReducerOptions ro;
  ro.bucket_cap_bytes = static_cast<int64_t>(options_.bucket_cap_mb() * 1024 * 1024);
  ro.first_bucket_cap_bytes = std::min<int64_t>(ro.first_bucket_cap_bytes, ro.bucket_cap_bytes);
  ro.find_unused_parameters = options_.find_unused_parameters();
  ro.comm_hook = options_.comm_hook();
  ro.gradient_as_bucket_view = options_.gradient_as_bucket_view();
  reducer_ = std::make_unique<Reducer>(std::move(params), std::move(names), group_, ro);
}

DistributedDataParallel::~DistributedDataParallel() = default;

// Every buffer but SyncBatchNorm's, whose running statistics are equal on every rank already
// (see Note [SyncBatchNorm]).
std::vector<torch::Tensor> DistributedDataParallel::buffers_to_broadcast() const {
  std::vector<torch::Tensor> out;
  for (const auto& m : module_->modules()) {
    if (is_sync_batch_norm(*m)) continue;
    for (const auto& b : m->buffers(/*recurse=*/false)) out.push_back(b);
  }
  return out;
}

void DistributedDataParallel::broadcast_buffers() { broadcast_from_rank0(group_, buffers_to_broadcast()); }

void DistributedDataParallel::pre_forward() {
  if (options_.broadcast_buffers() && module_->is_training() && torch::GradMode::is_enabled()) broadcast_buffers();
}

void DistributedDataParallel::post_forward(const torch::Tensor& out) {
  if (torch::GradMode::is_enabled() && reducer_->sync()) reducer_->prepare_for_backward({out});
}

}  // namespace lockstep::parallel
