#pragma once
// `lockstep train --precision auto`: fp32 or bf16, whichever trains the run's model faster on this
// CPU, measured (see Note [Choosing the precision by timing it]).

#include "lockstep/train/options.h"
#include "reference_data.h"

namespace lockstep::train {

struct PrecisionTiming {
  double fp32_ms = 0.0;  // median optimizer step of the local strategy in fp32 (O0)
  double bf16_ms = 0.0;  // the same in bf16 at the run's opt level (O1 unless given)
  Precision faster() const { return bf16_ms < fp32_ms ? Precision::kBf16 : Precision::kFp32; }
};

// Times steps of `o`'s model on the first batch of `data`'s epoch, in both precisions.
PrecisionTiming time_precisions(const ReferenceData& data, const TrainOptions& o);

// `o` with `precision` in place of auto (an fp32 run drops the opt level meant for bf16).
void resolve_precision(TrainOptions& o, Precision precision);

}  // namespace lockstep::train
