#pragma once
// The data sets `lockstep train` has built in (Fashion-MNIST, synthetic images, text), each with
// the reference model --model builds for it; what train() (train.cpp) hands a Trainer.

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/dist/process_group.h"
#include "lockstep/models/classifier.h"
#include "lockstep/train/evaluate.h"
#include "lockstep/train/options.h"
#include "lockstep/train/training_data.h"

namespace lockstep::train {

// A freshly initialised model for the data; with `initial_weights`, --init-weights loaded (text:
// the embeddings resized to the tokenizer after it).
using ModelFactory = std::function<std::shared_ptr<models::Classifier>(dist::ProcessGroup* group, bool initial_weights)>;

struct ReferenceData {
  std::shared_ptr<TrainingData> train, test;
  ModelFactory make_model;  // --model or --model-file for this data
  parallel::LossFunction loss;
  Metric metric = Metric::kAccuracy;
  int64_t eval_batch_size = 200;
  // What a checkpoint must share with the run beyond its options (text: the tokenizer's
  // fingerprint, Note [Tokenizer fingerprint]); added to TrainOptions::run_settings().
  std::vector<std::pair<std::string, std::string>> run_settings;
};

// Fashion-MNIST or synthetic images (see load_data), an image folder or a CSV file, and their
// classifier.
ReferenceData make_image_data(const TrainOptions& o);
// Fortunes or a text file and gpt-mini (see Note [Text training]).
ReferenceData make_text_data(const TrainOptions& o);

}  // namespace lockstep::train
