#include "inference_conv.h"

#include <ATen/Parallel.h>

#include <dlfcn.h>
#include <dnnl.hpp>

#include <cstring>
#include <unordered_map>

namespace lockstep::models {

// Note [Convolutions for inference through oneDNN]
// LibTorch hands every CPU convolution to oneDNN, but on each call it describes the problem anew
// and asks oneDNN for a primitive, and reorders the weights into the layout the primitive wants.
// For the small problems of inference that bookkeeping costs more than the convolution: at batch 1
// the convnet's two convolutions run 0.010 and 0.026 ms in oneDNN (ONEDNN_VERBOSE=1), and the whole
// forward took 0.106 ms through LibTorch against 0.053 this way (docs/benchmarks.md, "Convolutions
// for inference through oneDNN").
// Here the primitive is built once per input shape (prop_kind::forward_inference), and the weights
// are reordered once per value: the eval-mode BatchNorm after the convolution is folded into them,
//   w' = w * s and b' = (b - running_mean) * s + beta, with s = gamma / sqrt(running_var + eps)
// (computed in double), so one primitive computes both layers. The weights are those of the
// module's tensors as they are now: a copy of the six tensors they were folded from is kept and
// compared byte for byte on every call (~50 KB for the convnet's second block,
// a few microseconds; far less than the convolution over any batch for larger layers), so any
// change (an optimizer step, a train-mode forward's new running statistics, load_state_dict)
// folds them again on the next call. Values differ from LibTorch's by float rounding only (the
// fold, and the order of the sums), ~1e-7 relative. A convolution of fewer than 2^20 multiply-adds
// (the convnet's first at batch 1) gets a primitive built for one thread: on two threads it took
// 7 us but 18 us with the pass after it (which then reads, likely, the half the other core wrote),
// against 11.5 us with both on one thread (docs/benchmarks.md, same section). oneDNN here is the
// library LibTorch itself links (Debian's libdnnl 2.6, whose API this file uses).

namespace {

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& thread_stream() {
  thread_local dnnl::stream stream(cpu_engine());
  return stream;
}

const torch::ExpandingArray<2>* numeric_padding(const torch::nn::Conv2dImpl& conv) {
  return c10::get_if<torch::ExpandingArray<2>>(&conv.options.padding());
}

// Output extent of one spatial dimension, as LibTorch's convolution computes it.
int64_t output_extent(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation) {
  return (in + 2 * pad - dilation * (kernel - 1) - 1) / stride + 1;
}

// Below this many multiply-adds a convolution's primitive is built for one thread (see
// Note [Convolutions for inference through oneDNN]).
constexpr int64_t kOneThreadMacs = int64_t{1} << 20;

// OpenMP's thread count on the calling thread, set for a scope: oneDNN divides a primitive's work
// among as many threads as OpenMP offers when the primitive is built. The functions are looked up
// in the OpenMP runtime LibTorch has loaded, so that lockstep links none of its own; without one,
// nothing changes.
class OpenMpThreads {
 public:
  explicit OpenMpThreads(int threads) {
    static const auto get = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
    static const auto set = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
    if (get == nullptr || set == nullptr) return;
    set_ = set;
    previous_ = get();
    set_(threads);
  }
  ~OpenMpThreads() {
    if (set_ != nullptr) set_(previous_);
  }
  OpenMpThreads(const OpenMpThreads&) = delete;
  OpenMpThreads& operator=(const OpenMpThreads&) = delete;

 private:
  void (*set_)(int) = nullptr;
  int previous_ = 0;
};

std::vector<torch::Tensor> sources_of(const torch::nn::Conv2dImpl& conv, const torch::nn::BatchNorm2dImpl& norm) {
  return {conv.weight, conv.bias, norm.weight, norm.bias, norm.running_mean, norm.running_var};
}

}  // namespace

// The BatchNorm folded into the convolution (Note [Convolutions for inference through oneDNN]), in
// LibTorch's OIHW layout, and the six tensors it was folded from.
struct InferenceConv::Folded {
  // A copy of a tensor the folded weights came from, and whether the module's tensor still holds the
  // same bytes. Values, not version counters: BatchNorm's kernel updates its running statistics
  // without bumping theirs, and a write through `.data()` bumps another one.
  struct Source {
    torch::Tensor copy;
    explicit Source(const torch::Tensor& t) : copy(t.defined() ? t.detach().clone() : torch::Tensor()) {}
    bool current(const torch::Tensor& t) const {
      if (!t.defined() || !copy.defined()) return t.defined() == copy.defined();
      return t.scalar_type() == copy.scalar_type() && t.sizes() == copy.sizes() && t.strides() == copy.strides() &&
             t.is_non_overlapping_and_dense() && std::memcmp(t.data_ptr(), copy.data_ptr(), t.nbytes()) == 0;
    }
  };

  std::vector<Source> sources;
  torch::Tensor weights, bias;  // fp32, contiguous

  Folded(const torch::nn::Conv2dImpl& conv, const torch::nn::BatchNorm2dImpl& norm,
         const std::vector<torch::Tensor>& from) {
    for (const torch::Tensor& t : from) sources.emplace_back(t);
    torch::NoGradGuard no_grad;
    const int64_t channels = conv.options.out_channels();
    const auto as_double = [](const torch::Tensor& t) { return t.detach().to(torch::kDouble); };
    const auto ones = torch::ones({channels}, torch::kDouble), zeros = torch::zeros({channels}, torch::kDouble);
    const torch::Tensor gamma = norm.weight.defined() ? as_double(norm.weight) : ones;
    const torch::Tensor beta = norm.bias.defined() ? as_double(norm.bias) : zeros;
    const torch::Tensor conv_bias = conv.bias.defined() ? as_double(conv.bias) : zeros;
    const torch::Tensor scale = gamma / (as_double(norm.running_var) + norm.options.eps()).sqrt();
    weights = (as_double(conv.weight) * scale.view({-1, 1, 1, 1})).to(torch::kFloat).contiguous();
    bias = ((conv_bias - as_double(norm.running_mean)) * scale + beta).to(torch::kFloat).contiguous();
  }
  bool current(const std::vector<torch::Tensor>& now) const {
    for (size_t i = 0; i < now.size(); ++i)
      if (!sources[i].current(now[i])) return false;
    return true;
  }
};

// oneDNN's primitive for one input shape, and the folded weights reordered into its layout.
struct InferenceConv::Compiled {
  dnnl::convolution_forward primitive;
  dnnl::memory::desc src, dst, weights_layout, bias_layout;
  size_t scratchpad_bytes = 0;
  std::array<int64_t, 4> output_shape{};  // (N, out_channels, H', W')
  dnnl::memory weights, bias;             // in the primitive's layout
  std::shared_ptr<const Folded> from;     // what `weights` and `bias` hold
};

InferenceConv::InferenceConv() = default;
InferenceConv::~InferenceConv() = default;

bool InferenceConv::supports(const torch::nn::Conv2dImpl& conv, const torch::nn::BatchNorm2dImpl& norm,
                             const torch::Tensor& x) {
  const auto& o = conv.options;
  const auto* pad = numeric_padding(conv);
  if (pad == nullptr || o.groups() != 1 || !c10::get_if<torch::enumtype::kZeros>(&o.padding_mode())) return false;
  if (!x.device().is_cpu() || x.scalar_type() != torch::kFloat || x.dim() != 4 || x.size(0) == 0 ||
      x.size(1) != o.in_channels() || !conv.weight.device().is_cpu() || conv.weight.scalar_type() != torch::kFloat)
    return false;
  if (!norm.options.track_running_stats() || !norm.running_mean.defined() ||
      norm.running_mean.scalar_type() != torch::kFloat || norm.running_mean.size(0) != o.out_channels())
    return false;
  for (int d = 0; d < 2; ++d)
    if (output_extent(x.size(2 + d), (*o.kernel_size())[d], (*o.stride())[d], (**pad)[d], (*o.dilation())[d]) < 1)
      return false;
  return true;
}

std::shared_ptr<InferenceConv::Compiled> InferenceConv::compiled_for(const torch::nn::Conv2dImpl& conv,
                                                                     const torch::nn::BatchNorm2dImpl& norm,
                                                                     const torch::Tensor& x) {
  // oneDNN divides a primitive's work among the threads there are when it is built, as many as
  // LibTorch's intra-op threads on this thread: a new count gets its own primitive.
  at::internal::lazy_init_num_threads();
  const std::array<int64_t, 5> shape{x.size(0), x.size(1), x.size(2), x.size(3), at::get_num_threads()};
  const std::vector<torch::Tensor> now = sources_of(conv, norm);
  std::lock_guard<std::mutex> lock(mutex_);
  if (!folded_ || !folded_->current(now)) folded_ = std::make_shared<const Folded>(conv, norm, now);
  auto found = compiled_.find(shape);
  if (found != compiled_.end() && found->second->from == folded_) return found->second;

  auto entry = std::make_shared<Compiled>();
  if (found != compiled_.end()) {  // the same shape, new values: keep the primitive
    *entry = *found->second;
  } else {
    const auto& o = conv.options;
    const auto& pad = **numeric_padding(conv);
    const int64_t kh = (*o.kernel_size())[0], kw = (*o.kernel_size())[1];
    entry->output_shape = {shape[0], o.out_channels(),
                           output_extent(shape[2], kh, (*o.stride())[0], pad[0], (*o.dilation())[0]),
                           output_extent(shape[3], kw, (*o.stride())[1], pad[1], (*o.dilation())[1])};
    using tag = dnnl::memory::format_tag;
    const auto f32 = dnnl::memory::data_type::f32;
    const dnnl::memory::desc src({shape[0], shape[1], shape[2], shape[3]}, f32, tag::nhwc);
    const dnnl::memory::desc weights({o.out_channels(), o.in_channels(), kh, kw}, f32, tag::any);
    const dnnl::memory::desc bias({o.out_channels()}, f32, tag::a);
    const auto& out = entry->output_shape;
    const dnnl::memory::desc dst({out[0], out[1], out[2], out[3]}, f32, tag::nhwc);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // a buffer per call: callable from many threads
    const dnnl::convolution_forward::desc desc(
        dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src, weights, bias, dst,
        {(*o.stride())[0], (*o.stride())[1]}, {(*o.dilation())[0] - 1, (*o.dilation())[1] - 1}, {pad[0], pad[1]},
        {pad[0], pad[1]});
    const int64_t macs = out[0] * out[1] * out[2] * out[3] * o.in_channels() * kh * kw;
    OpenMpThreads threads(macs < kOneThreadMacs ? 1 : static_cast<int>(shape[4]));
    const dnnl::convolution_forward::primitive_desc pd(desc, attr, cpu_engine());
    entry->primitive = dnnl::convolution_forward(pd);
    entry->src = pd.src_desc();
    entry->dst = pd.dst_desc();
    entry->scratchpad_bytes = pd.scratchpad_desc().get_size();
    entry->weights_layout = pd.weights_desc();
    entry->bias_layout = pd.bias_desc();
  }
  // New buffers, never the previous entry's: a call still running on it keeps its weights.
  entry->weights = dnnl::memory(entry->weights_layout, cpu_engine());
  entry->bias = dnnl::memory(entry->bias_layout, cpu_engine());
  const auto& folded = *folded_;
  dnnl::memory plain({entry->weights_layout.dims(), dnnl::memory::data_type::f32, dnnl::memory::format_tag::oihw},
                     cpu_engine(), folded.weights.data_ptr());
  dnnl::reorder(plain, entry->weights).execute(thread_stream(), plain, entry->weights);
  thread_stream().wait();
  std::memcpy(entry->bias.get_data_handle(), folded.bias.data_ptr(), folded.bias.nbytes());
  entry->from = folded_;

  if (found == compiled_.end() && compiled_.size() >= 64) compiled_.clear();  // many shapes: start over
  compiled_[shape] = entry;
  return entry;
}

torch::Tensor InferenceConv::forward(const torch::nn::Conv2dImpl& conv, const torch::nn::BatchNorm2dImpl& norm,
                                     const torch::Tensor& x) {
  TORCH_CHECK(supports(conv, norm, x), "InferenceConv: unsupported convolution or input ", x.sizes());
  const std::shared_ptr<Compiled> c = compiled_for(conv, norm, x);
  const torch::Tensor in = x.contiguous(torch::MemoryFormat::ChannelsLast);
  torch::Tensor out = torch::empty(c->output_shape, x.options().memory_format(torch::MemoryFormat::ChannelsLast));
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, dnnl::memory(c->src, cpu_engine(), in.data_ptr())},
                                             {DNNL_ARG_WEIGHTS, c->weights},
                                             {DNNL_ARG_BIAS, c->bias},
                                             {DNNL_ARG_DST, dnnl::memory(c->dst, cpu_engine(), out.data_ptr())}};
  torch::Tensor scratchpad;
  if (c->scratchpad_bytes > 0) {
    const auto bytes = static_cast<int64_t>(c->scratchpad_bytes);
    scratchpad = torch::empty({bytes}, x.options().dtype(torch::kByte));
    args.emplace(DNNL_ARG_SCRATCHPAD,
                 dnnl::memory({{bytes}, dnnl::memory::data_type::u8, dnnl::memory::format_tag::a}, cpu_engine(),
                              scratchpad.data_ptr()));
  }
  c->primitive.execute(thread_stream(), args);
  thread_stream().wait();
  return out;
}

}  // namespace lockstep::models
