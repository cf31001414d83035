#include "lockstep/parallel/sync_batch_norm.h"

#include <torch/autograd.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/torch.h>

#include <ostream>
#include <type_traits>

// Note [BatchNorm's unexported pretty_print]: libtorch_cpu.so does not export
// BatchNormImplBase<D, BatchNormDdImpl>::pretty_print, yet a class derived from BatchNorm{1,2,3}dImpl
// names it in its construction vtables (Module is a virtual base), so linking fails without it.
// These definitions supply the symbol. They are never called: SyncBatchNormImpl overrides
// pretty_print, and the base's entry is live only while the base subobject is being constructed.
namespace torch::nn {
#define LOCKSTEP_BATCH_NORM_PRETTY_PRINT(D)                                                            \
  template <>                                                                                         \
  void BatchNormImplBase<D, BatchNorm##D##dImpl>::pretty_print(std::ostream& stream) const {          \
    stream << "torch::nn::BatchNorm" #D "d(" << options.num_features() << ", eps=" << options.eps() << ")"; \
  }
LOCKSTEP_BATCH_NORM_PRETTY_PRINT(1)
LOCKSTEP_BATCH_NORM_PRETTY_PRINT(2)
LOCKSTEP_BATCH_NORM_PRETTY_PRINT(3)
#undef LOCKSTEP_BATCH_NORM_PRETTY_PRINT
}  // namespace torch::nn

namespace lockstep::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// x (N, C, d1, ...): the dimensions summed over per channel, and (1, C, 1, ...) to broadcast a (C) tensor.
std::vector<int64_t> reduced_dims(const torch::Tensor& x) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  return dims;
}

torch::Tensor per_channel(const torch::Tensor& v, const torch::Tensor& x) {
  std::vector<int64_t> shape(x.dim(), 1);
  shape[1] = x.size(1);
  return v.view(shape);
}

// The global batch's per-channel statistics (see Note [SyncBatchNorm]).
struct GlobalStats {
  torch::Tensor mean;  // (C) fp64
  torch::Tensor var;   // (C) fp64, biased (divided by count)
  double count = 0;    // values per channel over all ranks
};

GlobalStats global_stats(const torch::Tensor& x, dist::ProcessGroup& group) {
  const int64_t channels = x.size(1);
  const int64_t local = channels > 0 ? x.numel() / channels : 0;
  const torch::Tensor x64 = x.detach().to(torch::kDouble);
  const auto dims = reduced_dims(x);
  torch::Tensor packed = torch::cat({torch::full({1}, static_cast<double>(local), torch::kDouble), x64.sum(dims),
                                     x64.square().sum(dims)});  // (2C+1): count, sum, sum of squares
  group.all_reduce(packed);
  GlobalStats s;
  s.count = packed[0].item<double>();
  TORCH_CHECK_VALUE(s.count > 1, "SyncBatchNorm on rank ", group.rank(), " of ", group.size(), ": the global batch has ",
                    s.count, " value(s) per channel (this rank ", local, ", input ", x.sizes(),
                    "); training needs more than 1: use larger batches, or eval mode");
  s.mean = packed.narrow(0, 1, channels) / s.count;
  s.var = (packed.narrow(0, 1 + channels, channels) / s.count - s.mean.square()).clamp_min(0);
  return s;
}

// y = x * scale + shift per channel, scale = invstd * weight, shift = bias - mean * scale (the form
// of LibTorch's CPU batch_norm). Backward: see Note [SyncBatchNorm].
class SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
 public:
  // x (N, C, ...); weight, bias (C) or undefined; mean, invstd (C) fp32 of the global batch;
  // count: values per channel in the global batch. -> (N, C, ...) in x's dtype.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& bias, const torch::Tensor& mean, const torch::Tensor& invstd,
                               double count, dist::ProcessGroup* group) {
    ctx->save_for_backward({x, weight, mean, invstd});
    ctx->saved_data["count"] = count;
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    const torch::Tensor scale = weight.defined() ? invstd * weight.to(torch::kFloat) : invstd;
    torch::Tensor shift = -mean * scale;
    if (bias.defined()) shift += bias.to(torch::kFloat);
    return (x.to(torch::kFloat) * per_channel(scale, x) + per_channel(shift, x)).to(x.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &weight = saved[1], &mean = saved[2], &invstd = saved[3];
    const double count = ctx->saved_data["count"].toDouble();
    auto* group = reinterpret_cast<dist::ProcessGroup*>(ctx->saved_data["group"].toInt());
    const torch::Tensor dy = grads[0].to(torch::kFloat);
    const torch::Tensor x_hat = (x.to(torch::kFloat) - per_channel(mean, x)) * per_channel(invstd, x);
    const auto dims = reduced_dims(x);
    const torch::Tensor sum_dy = dy.sum(dims, false, torch::kDouble);                 // (C)
    const torch::Tensor sum_dy_x_hat = (dy * x_hat).sum(dims, false, torch::kDouble);  // (C)

    torch::Tensor grad_x, grad_weight, grad_bias;
    if (ctx->needs_input_grad(0)) {
      torch::Tensor sums = torch::cat({sum_dy, sum_dy_x_hat});  // this rank's, then the global batch's
      group->all_reduce(sums);
      const int64_t c = x.size(1);
      const torch::Tensor mean_dy = (sums.narrow(0, 0, c) / count).to(torch::kFloat);
      const torch::Tensor mean_dy_x_hat = (sums.narrow(0, c, c) / count).to(torch::kFloat);
      const torch::Tensor scale = weight.defined() ? invstd * weight.to(torch::kFloat) : invstd;
      grad_x = ((dy - per_channel(mean_dy, x) - x_hat * per_channel(mean_dy_x_hat, x)) * per_channel(scale, x))
                   .to(x.scalar_type());
    }
    // This rank's samples only, as PyTorch's SyncBatchNorm: DDP averages them over the ranks.
    if (weight.defined() && ctx->needs_input_grad(1)) grad_weight = sum_dy_x_hat.to(weight.scalar_type());
    if (ctx->needs_input_grad(2)) grad_bias = sum_dy.to(weight.defined() ? weight.scalar_type() : torch::kFloat);
    return {grad_x, grad_weight, grad_bias, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

template <typename BatchNormImpl>
const char* short_name() {
  if (std::is_same_v<BatchNormImpl, torch::nn::BatchNorm1dImpl>) return "SyncBatchNorm1d";
  if (std::is_same_v<BatchNormImpl, torch::nn::BatchNorm2dImpl>) return "SyncBatchNorm2d";
  return "SyncBatchNorm3d";
}

// Copies `from`'s tensors into `to`'s of the same names, keeping `from`'s dtype and requires_grad.
void copy_state(const torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  auto params = to.named_parameters(/*recurse=*/false);
  for (const auto& p : from.named_parameters(/*recurse=*/false)) {
    if (!p.value().defined()) continue;
    params[p.key()].set_data(p.value().detach().clone());
    params[p.key()].set_requires_grad(p.value().requires_grad());
  }
  auto buffers = to.named_buffers(/*recurse=*/false);
  for (const auto& b : from.named_buffers(/*recurse=*/false))
    if (b.value().defined()) buffers[b.key()].set_data(b.value().detach().clone());
  to.train(from.is_training());
}

}  // namespace

template <typename BatchNormImpl>
SyncBatchNormImpl<BatchNormImpl>::SyncBatchNormImpl(const torch::nn::BatchNormOptions& options,
                                                    dist::ProcessGroup& group)
    : BatchNormImpl(options), group_(&group) {}

template <typename BatchNormImpl>
torch::Tensor SyncBatchNormImpl<BatchNormImpl>::forward(const torch::Tensor& x) {
  // Eval mode, or one rank: BatchNorm itself, without communication.
  if (!this->is_training() || group_->size() == 1) return BatchNormImpl::forward(x);
  this->_check_input_dim(x);
  const GlobalStats s = global_stats(x, *group_);
  if (this->options.track_running_stats() && this->num_batches_tracked.defined()) {
    torch::NoGradGuard no_grad;
    this->num_batches_tracked += 1;
    const double factor = this->options.momentum() ? *this->options.momentum()
                                                   : 1.0 / this->num_batches_tracked.template item<double>();
    const torch::Tensor unbiased = s.var * (s.count / (s.count - 1));
    this->running_mean.copy_(this->running_mean.to(torch::kDouble) * (1 - factor) + s.mean * factor);
    this->running_var.copy_(this->running_var.to(torch::kDouble) * (1 - factor) + unbiased * factor);
  }
  const torch::Tensor mean = s.mean.to(torch::kFloat);
  const torch::Tensor invstd = (s.var + this->options.eps()).rsqrt().to(torch::kFloat);
  return SyncBatchNormFunction::apply(x, this->weight, this->bias, mean, invstd, s.count, group_);
}

template <typename BatchNormImpl>
std::shared_ptr<torch::nn::Module> SyncBatchNormImpl<BatchNormImpl>::clone(
    const c10::optional<torch::Device>& device) const {
  auto copy = std::make_shared<SyncBatchNormImpl>(this->options, *group_);
  copy_state(*this, *copy);
  if (device) copy->to(*device);
  return copy;
}

template <typename BatchNormImpl>
void SyncBatchNormImpl<BatchNormImpl>::pretty_print(std::ostream& stream) const {
  stream << "lockstep::parallel::" << short_name<BatchNormImpl>() << "(" << this->options.num_features()
         << ", eps=" << this->options.eps() << ", momentum=";
  if (this->options.momentum()) {
    stream << *this->options.momentum();
  } else {
    stream << "None";
  }
  stream << std::boolalpha << ", affine=" << this->options.affine() << ", track_running_stats=" << this->options.track_running_stats()
         << ", ranks=" << group_->size() << ")";
}

template class SyncBatchNormImpl<torch::nn::BatchNorm1dImpl>;
template class SyncBatchNormImpl<torch::nn::BatchNorm2dImpl>;
template class SyncBatchNormImpl<torch::nn::BatchNorm3dImpl>;

bool is_sync_batch_norm(const torch::nn::Module& module) {
  return dynamic_cast<const SyncBatchNorm1dImpl*>(&module) != nullptr ||
         dynamic_cast<const SyncBatchNorm2dImpl*>(&module) != nullptr ||
         dynamic_cast<const SyncBatchNorm3dImpl*>(&module) != nullptr;
}

models::NormLayer sync_batch_norm_layer(dist::ProcessGroup& group) {
  return [&group](int64_t num_features) {
    return torch::nn::AnyModule(SyncBatchNorm2d(torch::nn::BatchNormOptions(num_features), group));
  };
}

namespace {

template <typename BatchNormImpl>
torch::nn::AnyModule make_sync(const BatchNormImpl& bn, dist::ProcessGroup& group) {
  auto sync = std::make_shared<SyncBatchNormImpl<BatchNormImpl>>(bn.options, group);
  copy_state(bn, *sync);
  return torch::nn::AnyModule(sync);
}

// The SyncBatchNorm for a plain BatchNorm{1,2,3}d, or an empty AnyModule for anything else.
torch::nn::AnyModule to_sync(const torch::nn::Module& m, dist::ProcessGroup& group) {
  if (is_sync_batch_norm(m)) return {};
  if (auto* bn = dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&m)) return make_sync(*bn, group);
  if (auto* bn = dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&m)) return make_sync(*bn, group);
  if (auto* bn = dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&m)) return make_sync(*bn, group);
  return {};
}

bool is_plain_batch_norm(const torch::nn::Module& m) {
  return !is_sync_batch_norm(m) && (dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&m) != nullptr ||
                                    dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&m) != nullptr ||
                                    dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&m) != nullptr);
}

}  // namespace

std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(std::shared_ptr<torch::nn::Module> module,
                                                          dist::ProcessGroup& group) {
  TORCH_CHECK_VALUE(module != nullptr, "convert_sync_batchnorm: the module is null");
  if (torch::nn::AnyModule sync = to_sync(*module, group); !sync.is_empty()) return sync.ptr();
  // First every BatchNorm must be reachable: inside a Sequential, whose list can be edited.
  for (const auto& parent : module->named_modules()) {
    if (dynamic_cast<torch::nn::SequentialImpl*>(parent.value().get()) != nullptr) continue;
    for (const auto& child : parent.value()->named_children()) {
      if (!is_plain_batch_norm(*child.value())) continue;
      const std::string path = parent.key().empty() ? child.key() : parent.key() + "." + child.key();
      TORCH_CHECK_VALUE(false, "convert_sync_batchnorm: '", path, "' (", child.value()->name(), ") is held by '",
                        parent.key().empty() ? std::string("the model") : parent.key(), "' (", parent.value()->name(),
                        "), whose forward calls it through its own member, which no conversion can change; build "
                        "the model with its norm layers from parallel::sync_batch_norm_layer(group) instead (see Note "
                        "[Norm layer factory]; models::make_model takes one). Nothing was converted");
    }
  }
  for (const auto& item : module->modules()) {
    auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(item.get());
    if (sequential == nullptr) continue;
    const auto children = sequential->named_children();  // in the order of its list
    size_t index = 0;
    for (auto it = sequential->begin(); it != sequential->end(); ++it, ++index) {
      torch::nn::AnyModule sync = to_sync(*it->ptr(), group);
      if (sync.is_empty()) continue;
      sequential->replace_module(children[index].key(), sync.ptr());  // the state dict's view
      *it = std::move(sync);                                          // the forward's view
    }
  }
  return module;
}

}  // namespace lockstep::parallel
