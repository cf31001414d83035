// The optimizer and scheduler sections of a DeepSpeed config. See Note [DeepSpeed configs].
#include <c10/util/StringUtil.h>

#include "deepspeed_reader.h"
#include "lockstep/core/names.h"

namespace lockstep::train::deepspeed {

// DeepSpeed's optimizer types by lockstep's kinds: Adam is AdamW unless adam_w_mode is false.
void Reader::read_optimizer(const json& opt) {
  if (!opt.is_object() || !opt.contains("type") || is_auto(opt["type"])) return;
  TORCH_CHECK_VALUE(opt["type"].is_string(), source_, ": optimizer.type is ", opt["type"].dump(), "; give a name");
  const std::string type = lower(opt["type"].get<std::string>());
  const json params = opt.contains("params") ? opt["params"] : json::object();
  optim::OptimizerKind kind;
  if (type == "adam") {
    const bool adam_w_mode = !params.contains("adam_w_mode") || !params["adam_w_mode"].is_boolean() ||
                             params["adam_w_mode"].get<bool>();
    kind = adam_w_mode ? optim::OptimizerKind::kAdamW : optim::OptimizerKind::kAdam;
  } else if (type == "adamw") {
    kind = optim::OptimizerKind::kAdamW;
  } else if (type == "sgd") {
    kind = optim::OptimizerKind::kSGD;
  } else {
    unsupported("optimizer.type " + opt["type"].get<std::string>(),
                "lockstep has SGD, Adam and AdamW; the run keeps " + optim::to_string(o_.optimizer().kind()));
    return;
  }
  agree(how_.given().optimizer, optim::to_string(o_.optimizer().kind()), optim::to_string(kind),
        "optimizer.type " + opt["type"].get<std::string>(), "optimizer");
  o_.optimizer().kind(kind);
  read_optimizer_params(params, kind);
}

void Reader::read_optimizer_params(const json& params, optim::OptimizerKind kind) {
  if (const c10::optional<double> lr = number(params, "lr", "optimizer.params.lr")) {
    agree(how_.given().lr, o_.optimizer_options().lr(), *lr, "optimizer.params.lr", "lr");
    o_.lr(*lr);
  }
  if (params.contains("betas") && !is_auto(params["betas"])) {
    const json& b = params["betas"];
    TORCH_CHECK_VALUE(b.is_array() && b.size() == 2 && b[0].is_number() && b[1].is_number(), source_,
                      ": optimizer.params.betas is ", b.dump(), "; give [beta1, beta2]");
    agree(how_.given().betas, c10::str(o_.optimizer().beta1(), ",", o_.optimizer().beta2()),
          c10::str(b[0].get<double>(), ",", b[1].get<double>()), "optimizer.params.betas", "betas");
    o_.optimizer().beta1(b[0].get<double>()).beta2(b[1].get<double>());
  }
  if (const c10::optional<double> eps = number(params, "eps", "optimizer.params.eps")) {
    agree(how_.given().eps, o_.optimizer().eps(), *eps, "optimizer.params.eps", "eps");
    o_.optimizer().eps(*eps);
  }
  // DeepSpeed's optimizers default to no weight decay (PyTorch's AdamW to 0.01).
  const c10::optional<double> decay = number(params, "weight_decay", "optimizer.params.weight_decay");
  if (decay) agree(how_.given().weight_decay, o_.optimizer_options().weight_decay().value_or(0.0), *decay,
                   "optimizer.params.weight_decay", "weight decay");
  if (decay || !how_.given().weight_decay) o_.optimizer().weight_decay(decay.value_or(0.0));
  if (const c10::optional<double> momentum = number(params, "momentum", "optimizer.params.momentum")) {
    agree(how_.given().momentum, o_.momentum().value_or(0.9), *momentum, "optimizer.params.momentum", "momentum");
    o_.momentum(*momentum);
  } else if (kind == optim::OptimizerKind::kSGD && !how_.given().momentum) {
    o_.momentum(0.0);  // torch.optim.SGD's default, which DeepSpeed builds
  }
  if (params.contains("bias_correction") && params["bias_correction"] == false)
    unsupported("optimizer.params.bias_correction", "lockstep's Adam always corrects the moments' bias");
  if (params.contains("amsgrad") && params["amsgrad"].is_boolean()) o_.optimizer().amsgrad(params["amsgrad"].get<bool>());
}

// DeepSpeed's warmup schedulers as lockstep's linear warmup (LinearLR from lr / W to lr over W
// steps), then constant or cosine. Its log-shaped warmup and non-zero starting lr have no
// counterpart and are warned about. Defaults are DeepSpeed's (lr_schedules.py).
void Reader::read_scheduler(const json& s) {
  if (!s.is_object() || !s.contains("type") || is_auto(s["type"])) return;
  TORCH_CHECK_VALUE(s["type"].is_string(), source_, ": scheduler.type is ", s["type"].dump(), "; give a name");
  const std::string type = s["type"].get<std::string>();
  const json params = s.contains("params") ? s["params"] : json::object();
  if (type != "WarmupLR" && type != "WarmupDecayLR" && type != "WarmupCosineLR") {
    unsupported("scheduler.type " + type, "lockstep has linear warmup with constant, step, multistep and cosine "
                "schedules (DeepSpeed's WarmupLR, WarmupDecayLR without its decay, WarmupCosineLR)");
    return;
  }
  const LrScheduleKind kind = type == "WarmupCosineLR" ? LrScheduleKind::kCosine : LrScheduleKind::kConstant;
  agree(how_.given().lr_schedule, enum_name(lr_schedule_names(), o_.lr_schedule().kind()),
        enum_name(lr_schedule_names(), kind), "scheduler.type " + type, "lr schedule");
  o_.lr_schedule().kind(kind);
  const bool warmup_auto = params.contains("warmup_num_steps") && is_auto(params["warmup_num_steps"]);
  if (!warmup_auto) {
    const double steps = number(params, "warmup_num_steps", "scheduler.params.warmup_num_steps").value_or(1000.0);
    agree(how_.given().warmup_steps, o_.lr_schedule().warmup_steps(), static_cast<int64_t>(steps),
          "scheduler.params.warmup_num_steps", "warmup steps");
    o_.lr_schedule().warmup_steps(static_cast<int64_t>(steps));
  }
  const bool lr_auto = params.contains("warmup_max_lr") && is_auto(params["warmup_max_lr"]);
  if (type != "WarmupCosineLR" && !lr_auto) {  // WarmupCosineLR warms up to the optimizer's lr
    const double max_lr = number(params, "warmup_max_lr", "scheduler.params.warmup_max_lr").value_or(0.001);
    agree(how_.given().lr, o_.optimizer_options().lr(), max_lr, "scheduler.params.warmup_max_lr", "lr");
    o_.lr(max_lr);
  }
  if (type == "WarmupCosineLR") {
    o_.lr_schedule().total_steps(
        static_cast<int64_t>(number(params, "total_num_steps", "scheduler.params.total_num_steps").value_or(0.0)));
    o_.lr_schedule().eta_min(number(params, "cos_min_ratio", "scheduler.params.cos_min_ratio").value_or(0.0001) *
                             o_.optimizer_options().lr());
  }
  if (type == "WarmupDecayLR")
    unsupported("scheduler.type WarmupDecayLR", "lockstep has no linear decay after warmup; the lr stays at its "
                "peak after warmup");
  const std::string shape = params.contains("warmup_type") && params["warmup_type"].is_string()
                                ? params["warmup_type"].get<std::string>()
                                : "log";
  if (shape != "linear")
    unsupported("scheduler.params.warmup_type " + shape, "lockstep's warmup is linear; the lr rises linearly");
  const double start = number(params, type == "WarmupCosineLR" ? "warmup_min_ratio" : "warmup_min_lr",
                              "scheduler.params.warmup_min_lr").value_or(0.0);
  if (start != 0.0)
    unsupported("scheduler.params.warmup_min_lr", "lockstep's warmup starts at lr / warmup steps, not at a given lr");
}

}  // namespace lockstep::train::deepspeed
