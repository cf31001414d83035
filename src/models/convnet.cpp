#include "lockstep/models/convnet.h"

#include <ATen/autocast_mode.h>

#include <vector>

#include "inference_conv.h"
#include "norm_relu_pool.h"

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
  // In eval mode without autograd the output stays channels-last: the next convolution takes it as
  // it is, and only the flatten before fc copies it into NCHW order. In train mode it is always the
  // autograd path's NCHW output, so that activation checkpointing's forward without autograd and its
  // recomputation with it feed the next BatchNorm the same layout and update its statistics alike.
  torch::Tensor forward(const torch::Tensor& x) {
    if (is_training() || torch::GradMode::is_enabled()) return ChannelsLastMaxPool::apply(x);
    return torch::max_pool2d(x.contiguous(torch::MemoryFormat::ChannelsLast), {2, 2});
  }
};
TORCH_MODULE(ChannelsLastMaxPool2d);

torch::nn::Sequential conv_block(int64_t in, int64_t out, const NormLayer& norm_layer) {
  namespace nn = torch::nn;
  return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, out, 5).stride(1).padding(2)),
                        norm_layer(out), nn::ReLU(), ChannelsLastMaxPool2d());
}

// (a > b, or a is NaN) ? a : b: the maximum that, as LibTorch's max-pool and ReLU, keeps a NaN.
inline float max_keeping_nan(float a, float b) { return (a > b || a != a) ? a : b; }

// Note [One pass for ReLU and the max-pool in evaluation]
// In eval mode without autograd a conv block's convolution and BatchNorm run as one
// convolution with the BatchNorm folded in (Note [Convolutions for inference],
// inference_conv.cpp), and its ReLU and 2x2 max-pool, which need each element once, as one pass
// over that convolution's channels-last output that writes only the pooled quarter, where LibTorch
// makes three passes (BatchNorm, ReLU, max-pool) and two full-size temporaries: at inference's batch
// sizes those passes and their layout copies cost as much as the block's convolutions
// (docs/benchmarks.md, "... one pass after the convolution in evaluation"). The order of max and
// ReLU does not matter (ReLU is monotonic); NaNs are kept, as by LibTorch's ReLU and max-pool.
// x (N, C, H, W) fp32 channels-last -> (N, C, H/2, W/2) fp32 channels-last.
torch::Tensor relu_pool_eval(const torch::Tensor& x) {
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3), oh = h / 2, ow = w / 2;
  const torch::Tensor in = x.contiguous(torch::MemoryFormat::ChannelsLast);
  torch::Tensor out = torch::empty({n, c, oh, ow}, x.options().memory_format(torch::MemoryFormat::ChannelsLast));
  const float* src = in.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  // On the calling thread. (at::parallel_for would be too: it is a header template whose OpenMP
  // pragma needs -fopenmp, which lockstep is not compiled with.)
  for (int64_t row = 0; row < n * oh; ++row) {  // one output row: image row / oh, rows 2y and 2y+1
    const float* top = src + ((row / oh) * h + 2 * (row % oh)) * w * c;
    const float* bottom = top + w * c;
    float* o = dst + row * ow * c;
    for (int64_t x0 = 0; x0 < ow; ++x0, o += c) {
      const float* p = top + 2 * x0 * c;
      const float* q = bottom + 2 * x0 * c;
      for (int64_t k = 0; k < c; ++k) {
        const float m = max_keeping_nan(max_keeping_nan(p[k], p[c + k]), max_keeping_nan(q[k], q[c + k]));
        o[k] = max_keeping_nan(m, 0.0f);
      }
    }
  }
  return out;
}

// A conv block's forward: see Note [One pass for ReLU and the max-pool in evaluation] for the
// evaluation path and Note [BatchNorm, ReLU and the max-pool as one function in training]
// (norm_relu_pool.cpp) for training's (BatchNorm2d or SyncBatchNorm); everything else (autograd in
// eval mode, autocast in evaluation, another norm layer, an input neither path takes) runs the
// Sequential as it is.
torch::Tensor run_conv_block(torch::nn::SequentialImpl& block, InferenceConv& inference, const torch::Tensor& x) {
  const auto& conv = *block[0]->as<torch::nn::Conv2d>();
  auto* norm = block[1]->as<torch::nn::BatchNorm2d>();
  if (norm == nullptr) return block.forward(x);
  if (!norm->is_training()) {
    const bool evaluating = !torch::GradMode::is_enabled() && !at::autocast::is_autocast_enabled(at::kCPU) &&
                            InferenceConv::supports(conv, *norm, x);
    return evaluating ? relu_pool_eval(inference.forward(conv, *norm, x)) : block.forward(x);
  }
  torch::Tensor y = block.begin()->forward(x);  // the convolution
  if (norm_relu_pool_trains(*norm, y)) return norm_relu_pool_train(*norm, y);
  for (auto it = block.begin() + 1; it != block.end(); ++it) y = it->forward(y);
  return y;
}

}  // namespace

ConvNetImpl::ConvNetImpl(int64_t num_classes, const NormLayer& norm_layer) {
  layer1 = register_module("layer1", conv_block(1, 16, norm_layer));
  layer2 = register_module("layer2", conv_block(16, 32, norm_layer));
  fc = register_module("fc", torch::nn::Linear(7 * 7 * 32, num_classes));
  inference_ = {std::make_shared<InferenceConv>(), std::make_shared<InferenceConv>()};
}

std::vector<Block> ConvNetImpl::blocks() {
  auto l1 = layer1.ptr(), l2 = layer2.ptr();
  auto head = fc.ptr();
  auto i1 = inference_[0], i2 = inference_[1];
  return {{"layer1", {l1}, [l1, i1](const torch::Tensor& x) { return run_conv_block(*l1, *i1, x); }},
          {"layer2", {l2}, [l2, i2](const torch::Tensor& x) { return run_conv_block(*l2, *i2, x); }},
          {"fc", {head}, [head](const torch::Tensor& x) { return head->forward(x.flatten(1)); }}};
}

}  // namespace lockstep::models
