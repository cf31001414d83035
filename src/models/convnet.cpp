#include "lockstep/models/convnet.h"

namespace lockstep::models {
namespace {

// MaxPool2d(2) whose forward runs in channels-last layout, taking and giving the usual NCHW
// tensors. Values and gradients are exactly those of MaxPool2d; only the speed differs: LibTorch
// 1.13's CPU max_pool2d_with_indices forward is about 8x slower on NCHW than on channels-last input
// (5.5 ms vs 0.6 ms for a (100, 16, 28, 28) batch on one thread), far more than the layout copy
// costs, while its backward is fastest on NCHW (1.7 ms vs 3.6 ms in fp32). The indices (h * W + w
// within each plane) mean the same in both layouts, so backward runs on NCHW.
struct ChannelsLastMaxPool : torch::autograd::Function<ChannelsLastMaxPool> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x) {  // x (B, C, H, W)
    auto [y, indices] = torch::max_pool2d_with_indices(x.contiguous(torch::MemoryFormat::ChannelsLast), {2, 2});
    ctx->save_for_backward({x, indices.contiguous()});
    return y.contiguous();  // (B, C, H/2, W/2)
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {torch::max_pool2d_with_indices_backward(grads[0].contiguous(), saved[0], {2, 2}, {2, 2}, {0, 0},
                                                    {1, 1}, /*ceil_mode=*/false, saved[1])};
  }
};

// No parameters: the state-dict keys stay those of the Python model.
class ChannelsLastMaxPool2dImpl : public torch::nn::Module {
 public:
  // Without autograd (evaluation, inference) the output stays channels-last: the next convolution,
  // BatchNorm and ReLU take it as it is, and only the flatten before fc copies it into NCHW order.
  torch::Tensor forward(const torch::Tensor& x) {
    if (torch::GradMode::is_enabled() && x.requires_grad()) return ChannelsLastMaxPool::apply(x);
    return torch::max_pool2d(x.contiguous(torch::MemoryFormat::ChannelsLast), {2, 2});
  }
};
TORCH_MODULE(ChannelsLastMaxPool2d);

torch::nn::Sequential conv_block(int64_t in, int64_t out, const NormLayer& norm_layer) {
  namespace nn = torch::nn;
  return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, out, 5).stride(1).padding(2)),
                        norm_layer(out), nn::ReLU(), ChannelsLastMaxPool2d());
}

}  // namespace

ConvNetImpl::ConvNetImpl(int64_t num_classes, const NormLayer& norm_layer) {
  layer1 = register_module("layer1", conv_block(1, 16, norm_layer));
  layer2 = register_module("layer2", conv_block(16, 32, norm_layer));
  fc = register_module("fc", torch::nn::Linear(7 * 7 * 32, num_classes));
}

std::vector<Block> ConvNetImpl::blocks() {
  auto l1 = layer1.ptr(), l2 = layer2.ptr();
  auto head = fc.ptr();
  return {{"layer1", {l1}, [l1](const torch::Tensor& x) { return l1->forward(x); }},
          {"layer2", {l2}, [l2](const torch::Tensor& x) { return l2->forward(x); }},
          {"fc", {head}, [head](const torch::Tensor& x) { return head->forward(x.flatten(1)); }}};
}

}  // namespace lockstep::models
