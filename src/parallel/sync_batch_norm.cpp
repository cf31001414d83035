#include "lockstep/parallel/sync_batch_norm.h"

#include <torch/autograd.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/torch.h>

#include <ostream>
#include <tuple>
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

torch::Tensor per_channel(const torch::Tensor& v, const torch::Tensor& x) {
  std::vector<int64_t> shape(x.dim(), 1);
  shape[1] = x.size(1);
  return v.view(shape);
}

// x (N, C, d1, ...) fp32 -> per channel, (C) fp64 each: the sum and the sum of squares, in one pass
// over x's memory as it lies: channel-first blocks of d1 x ... values, or channels-last rows of C.
std::pair<torch::Tensor, torch::Tensor> channel_sums(const torch::Tensor& x) {
  const int64_t c = x.size(1);
  torch::Tensor sum = torch::zeros({c}, torch::kDouble), squares = torch::zeros({c}, torch::kDouble);
  double* s = sum.data_ptr<double>();
  double* q = squares.data_ptr<double>();
  const bool rows = (x.dim() == 4 && x.is_contiguous(at::MemoryFormat::ChannelsLast)) ||
                    (x.dim() == 5 && x.is_contiguous(at::MemoryFormat::ChannelsLast3d));
  const torch::Tensor memory = rows ? x : x.contiguous();
  const float* p = memory.data_ptr<float>();
  if (rows) {  // (N x d1 x ..., C): each channel its own accumulator, the loop over channels vectorises
    for (int64_t r = 0, n = x.numel() / c; r < n; ++r, p += c) {
      for (int64_t j = 0; j < c; ++j) {
        const double v = p[j];
        s[j] += v;
        q[j] += v * v;
      }
    }
    return {sum, squares};
  }
  const int64_t block = x.numel() / std::max<int64_t>(1, x.size(0) * c);
  for (int64_t i = 0; i < x.size(0); ++i) {
    for (int64_t j = 0; j < c; ++j, p += block) {
      double a = 0.0, b = 0.0;
      for (int64_t k = 0; k < block; ++k) {
        const double v = p[k];
        a += v;
        b += v * v;
      }
      s[j] += a;
      q[j] += b;
    }
  }
  return {sum, squares};
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
  const auto [sum, squares] = channel_sums(x);
  torch::Tensor packed = torch::cat({torch::full({1}, static_cast<double>(local), torch::kDouble), sum, squares});
  group.all_reduce(packed);  // (2C+1): count, sum, sum of squares
  GlobalStats s;
  s.count = packed[0].item<double>();
  TORCH_CHECK_VALUE(s.count > 1, "SyncBatchNorm on rank ", group.rank(), " of ", group.size(), ": the global batch has ",
                    s.count, " value(s) per channel (this rank ", local, ", input ", x.sizes(),
                    "); training needs more than 1: use larger batches, or eval mode");
  s.mean = packed.narrow(0, 1, channels) / s.count;
  s.var = (packed.narrow(0, 1 + channels, channels) / s.count - s.mean.square()).clamp_min(0);
  return s;
}

// (x - mean) x invstd x weight + bias per channel, in one pass and with the subtraction first, by
// LibTorch's own inference batch norm: `mean` and `var` (C) fp32 stand in for its running
// statistics. x fp32 (N, C, ...); weight, bias (C) fp32 or undefined.
torch::Tensor normalise(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                        const torch::Tensor& mean, const torch::Tensor& var, double eps) {
  return torch::batch_norm(x, weight, bias, mean, var, /*training=*/false, /*momentum=*/0.0, eps,
                           /*cudnn_enabled=*/false);
}

torch::Tensor as_float(const torch::Tensor& t) { return t.defined() ? t.to(torch::kFloat) : t; }

// y = (x - mean) x invstd x weight + bias with the global batch's mean and invstd.
// Backward: see Note [SyncBatchNorm].
class SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
 public:
  // x (N, C, ...); weight, bias (C) or undefined; mean, var (C) fp32 of the global batch (var
  // biased); count: values per channel in the global batch. -> (N, C, ...) in x's dtype.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& bias, const torch::Tensor& mean, const torch::Tensor& var,
                               double eps, double count, dist::ProcessGroup* group) {
    ctx->save_for_backward({x, weight, mean, var});
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["count"] = count;
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    return normalise(x.to(torch::kFloat), as_float(weight), as_float(bias), mean, var, eps).to(x.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &weight = saved[1], &mean = saved[2], &var = saved[3];
    const torch::Tensor x = saved[0].to(torch::kFloat), dy = grads[0].to(torch::kFloat);
    const double eps = ctx->saved_data["eps"].toDouble(), count = ctx->saved_data["count"].toDouble();
    auto* group = reinterpret_cast<dist::ProcessGroup*>(ctx->saved_data["group"].toInt());
    const torch::Tensor invstd = (var.to(torch::kDouble) + eps).rsqrt().to(torch::kFloat);
    // This rank's sum of dy x x_hat and sum of dy per channel (C): LibTorch's batch-norm backward
    // reduction, given the global mean and invstd, asked for nothing else.
    // A rank without samples adds zeros (the kernel divides by its count).
    torch::Tensor sum_dy_x_hat = torch::zeros_like(mean), sum_dy = torch::zeros_like(mean);
    if (x.numel() > 0)
      std::tie(std::ignore, sum_dy_x_hat, sum_dy) = torch::native_batch_norm_backward(
          dy, x, /*weight=*/{}, {}, {}, mean, invstd, /*train=*/true, eps, {false, true, true});

    torch::Tensor grad_x, grad_weight, grad_bias;
    if (ctx->needs_input_grad(0)) {
      torch::Tensor global = torch::cat({sum_dy, sum_dy_x_hat}).to(torch::kDouble);  // the global batch's
      group->all_reduce(global);
      const int64_t c = x.size(1);
      const torch::Tensor mean_dy = global.narrow(0, 0, c) / count, mean_dy_x_hat = global.narrow(0, c, c) / count;
      const torch::Tensor scale =
          weight.defined() ? invstd.to(torch::kDouble) * weight.to(torch::kDouble) : invstd.to(torch::kDouble);
      // grad_x = scale (dy - mean_dy - x_hat mean_dy_x_hat): the x_hat term as a batch norm of x with
      // weight -scale mean_dy_x_hat and bias -scale mean_dy, then + dy scale.
      grad_x = normalise(x, (-scale * mean_dy_x_hat).to(torch::kFloat), (-scale * mean_dy).to(torch::kFloat), mean,
                         var, eps)
                   .addcmul_(dy, per_channel(scale.to(torch::kFloat), x))
                   .to(saved[0].scalar_type());
    }
    // This rank's samples only, as PyTorch's SyncBatchNorm: DDP averages them over the ranks.
    if (weight.defined() && ctx->needs_input_grad(1)) grad_weight = sum_dy_x_hat.to(weight.scalar_type());
    if (ctx->needs_input_grad(2)) grad_bias = sum_dy.to(weight.defined() ? weight.scalar_type() : torch::kFloat);
    return {grad_x,          grad_weight,     grad_bias,       torch::Tensor(), torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
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
  const GlobalStats s = global_stats(x.to(torch::kFloat), *group_);
  if (this->options.track_running_stats() && this->num_batches_tracked.defined()) {
    torch::NoGradGuard no_grad;
    this->num_batches_tracked += 1;
    const double factor = this->options.momentum() ? *this->options.momentum()
                                                   : 1.0 / this->num_batches_tracked.template item<double>();
    const torch::Tensor unbiased = s.var * (s.count / (s.count - 1));
    this->running_mean.copy_(this->running_mean.to(torch::kDouble) * (1 - factor) + s.mean * factor);
    this->running_var.copy_(this->running_var.to(torch::kDouble) * (1 - factor) + unbiased * factor);
  }
  return SyncBatchNormFunction::apply(x, this->weight, this->bias, s.mean.to(torch::kFloat), s.var.to(torch::kFloat),
                                      this->options.eps(), s.count, group_);
}

template <typename BatchNormImpl>
void SyncBatchNormImpl<BatchNormImpl>::sum_over_ranks(torch::Tensor& values) const {
  if (group_->size() > 1) group_->all_reduce(values);
}

template <typename BatchNormImpl>
std::string SyncBatchNormImpl<BatchNormImpl>::rank_description() const {
  return "rank " + std::to_string(group_->rank()) + " of " + std::to_string(group_->size());
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
