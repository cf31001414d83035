// data/transforms.h against torchvision 0.14 on the PIL path (tests/python/image_oracle.py), the
// random transforms' parameters and determinism, and the spec parser.
#include "lockstep/data/transforms.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <set>

#include "../test_util.h"
#include "image_oracle.h"
#include "lockstep/data/image.h"

namespace lockstep::data {
namespace {

using ::testing::HasSubstr;
namespace F = functional;

// Each deterministic transform equals torchvision's output pixel for pixel (tolerance 0 for the
// uint8 results, including PIL's antialiased bilinear resize up, down and on noise; see Note
// [PIL's fixed-point resampling]) and to 1e-7 for the float ones (the same float32 operations:
// measured 0).
TEST(TransformOracle, DeterministicTransformsEqualTorchvision) {
  LOCKSTEP_IMAGE_ORACLE_OR_SKIP(oracle);
  const torch::Tensor img = read_image(oracle->path("rgb.png"));
  const torch::Tensor noise = read_image(oracle->path("noise.png"));
  SampleRandom none(0, 0, 0);  // the deterministic transforms draw nothing
  const std::vector<std::pair<std::string, torch::Tensor>> ours = {
      {"resize/int_down", Resize({20}).apply(img, none)},
      {"resize/int_up", F::resize(img, 116, 90)},
      {"resize/pair_down", F::resize(img, 17, 29)},
      {"resize/pair_up", F::resize(img, 100, 71)},
      {"resize/pair_mixed", F::resize(img, 30, 80)},
      {"resize/max_size", Resize({30}, 35).apply(img, none)},
      {"resize/noise_int", Resize({32}).apply(noise, none)},
      {"resize/noise_pair", F::resize(noise, 50, 77)},
      {"resize/grey", Resize({19}).apply(F::to_grayscale(img, 1), none)},
      {"center_crop/odd_margins", F::center_crop(img, 20, 20)},
      {"center_crop/pair", F::center_crop(img, 31, 46)},
      {"center_crop/larger", F::center_crop(img, 70, 50)},
      {"center_crop/wider", F::center_crop(img, 20, 60)},
      {"grayscale/1", F::to_grayscale(img, 1)},
      {"grayscale/3", F::to_grayscale(img, 3)},
      {"resized_crop", F::resized_crop(img, 5, 7, 30, 25, 24, 24)},
      {"resized_crop/noise", F::resized_crop(noise, 11, 3, 150, 190, 37, 29)},
      {"crop/outside", F::crop(img, -3, 40, 20, 30)},
      {"pad/ltrb", F::pad(img, 1, 2, 3, 4, {10, 20, 30})},
      {"pad/int", F::pad(img, 3, 3, 3, 3, {7})},
      {"hflip", F::hflip(img)},
  };
  for (const auto& [key, tensor] : ours) {
    const torch::Tensor theirs = oracle->at(key);
    ASSERT_EQ(tensor.sizes(), theirs.sizes()) << key;
    EXPECT_EQ(testing::max_difference(tensor, theirs), 0) << key;
  }
  SampleRandom random(0, 0, 0);
  EXPECT_LE(testing::max_difference(F::to_tensor(img), oracle->at("to_tensor")), 1e-7);
  const Normalize normalize({0.485, 0.456, 0.406}, {0.229, 0.224, 0.225});
  EXPECT_LE(testing::max_difference(normalize.apply(F::to_tensor(img), random), oracle->at("normalize")), 1e-7);
  const Transforms pipeline = Transforms::parse("Resize(32), CenterCrop(28), ToTensor(), Normalize((0.5,), (0.5,))");
  EXPECT_LE(testing::max_difference(pipeline(read_image(oracle->path("rgb420.jpg")), random), oracle->at("pipeline")),
            1e-7);
}

// torchvision's size rule: the short edge to `size`, the long one int(size * long / short),
// capped by max_size.
TEST(Transform, ResizedSizeFollowsTorchvision) {
  EXPECT_EQ(F::resized_size(61, 47, {20}, std::nullopt), (std::pair<int64_t, int64_t>{25, 20}));
  EXPECT_EQ(F::resized_size(47, 61, {20}, std::nullopt), (std::pair<int64_t, int64_t>{20, 25}));
  EXPECT_EQ(F::resized_size(61, 47, {30}, 35), (std::pair<int64_t, int64_t>{35, 27}));
  EXPECT_EQ(F::resized_size(10, 10, {7, 3}, std::nullopt), (std::pair<int64_t, int64_t>{7, 3}));
  EXPECT_EQ(F::resized_size(3, 1000, {7}, std::nullopt), (std::pair<int64_t, int64_t>{7, 2333}));
}

// The generator: uniform in [0, 1), integers in [low, high] hitting every value about equally,
// and one stream per (seed, epoch, index).
TEST(SampleRandom, UniformAndIntegerCoverTheirRangesEvenly) {
  SampleRandom random(7, 1, 3);
  std::vector<int> counts(5, 0);
  double sum = 0;
  for (int i = 0; i < 50000; ++i) {
    const double u = random.uniform();
    ASSERT_TRUE(u >= 0 && u < 1) << u;
    sum += u;
    const int64_t k = random.integer(-2, 2);
    ASSERT_TRUE(k >= -2 && k <= 2) << k;
    ++counts[k + 2];
  }
  EXPECT_NEAR(sum / 50000, 0.5, 0.01);
  for (int c : counts) EXPECT_NEAR(c, 10000, 500);
  EXPECT_EQ(random.integer(4, 4), 4);
  SampleRandom a(7, 1, 3), b(7, 1, 3), c(7, 1, 4), d(7, 2, 3), e(8, 1, 3);
  const double first = a.uniform();
  EXPECT_EQ(first, b.uniform());
  for (SampleRandom* other : {&c, &d, &e}) EXPECT_NE(first, other->uniform());
}

// RandomResizedCrop's parameters stay within torchvision's bounds: inside the image, the area
// fraction within `scale` and the aspect ratio within `ratio` up to rounding, or the central
// fallback; the pixels are torchvision's resized_crop with those parameters.
TEST(Transform, RandomResizedCropParamsWithinTorchvisionsBounds) {
  for (int64_t index = 0; index < 2000; ++index) {
    SampleRandom random(1, 0, index);
    const int64_t h = 20 + index % 200, w = 30 + (index * 7) % 150;
    const CropParams p = RandomResizedCrop::params(h, w, {0.08, 1.0}, {3.0 / 4.0, 4.0 / 3.0}, random);
    ASSERT_TRUE(p.top >= 0 && p.left >= 0 && p.height > 0 && p.width > 0 && p.top + p.height <= h &&
                p.left + p.width <= w)
        << h << "x" << w << " " << p.top << "," << p.left << "," << p.height << "," << p.width;
    const double area = static_cast<double>(p.height * p.width) / static_cast<double>(h * w);
    EXPECT_LE(area, 1.0 + 1e-9);
    const double aspect = static_cast<double>(p.width) / static_cast<double>(p.height);
    // Rounding each side to an integer moves the ratio by up to 1/side either way.
    EXPECT_GE(aspect, 0.75 * (1 - 1.0 / p.width) - 1.0 / p.height) << index;
    EXPECT_LE(aspect, 4.0 / 3.0 * (1 + 1.0 / p.width) + 1.0 / p.height) << index;
  }
  // A 1 x 100 strip: no try fits the ratio, so the fallback's central crop of ratio 4/3.
  SampleRandom random(1, 0, 0);
  const CropParams strip = RandomResizedCrop::params(3, 100, {0.08, 1.0}, {3.0 / 4.0, 4.0 / 3.0}, random);
  EXPECT_EQ(strip.height, 3);
  EXPECT_EQ(strip.width, 4);
  EXPECT_EQ(strip.left, 48);
}

TEST(TransformOracle, RandomTransformsAreTorchvisionsWithTheirParams) {
  LOCKSTEP_IMAGE_ORACLE_OR_SKIP(oracle);
  const torch::Tensor img = read_image(oracle->path("rgb.png"));
  const RandomResizedCrop crop(24, 24);
  std::set<std::string> seen;
  for (int64_t index = 0; index < 20; ++index) {
    SampleRandom for_params(5, 2, index), for_apply(5, 2, index), again(5, 2, index);
    const CropParams p = RandomResizedCrop::params(61, 47, {0.08, 1.0}, {3.0 / 4.0, 4.0 / 3.0}, for_params);
    const torch::Tensor out = crop.apply(img, for_apply);
    EXPECT_TRUE(torch::equal(out, F::resized_crop(img, p.top, p.left, p.height, p.width, 24, 24))) << index;
    EXPECT_TRUE(torch::equal(out, crop.apply(img, again))) << "same (seed, epoch, index), other pixels: " << index;
    seen.insert(std::to_string(p.top) + "," + std::to_string(p.left) + "," + std::to_string(p.height));
  }
  EXPECT_GE(seen.size(), 15u) << "different indices should mostly crop differently";
  // The crop at (2, 40) of 20 x 30 reaches outside the image: zeros there, as PIL's crop.
  EXPECT_TRUE(torch::equal(F::crop(img, -3, 40, 20, 30), oracle->at("crop/outside")));
}

// RandomCrop(28, padding=4) pads with zeros then crops uniformly; pad_if_needed pads both sides
// by the shortfall; RandomHorizontalFlip flips about half the samples.
TEST(Transform, RandomCropAndFlipFollowTorchvision) {
  const torch::Tensor img = torch::randint(1, 256, {28, 28, 3}, torch::kUInt8);
  const RandomCrop crop(28, 28, {4});
  std::set<int64_t> tops;
  for (int64_t index = 0; index < 200; ++index) {
    SampleRandom random(3, 0, index), same(3, 0, index);
    const torch::Tensor out = crop.apply(img, random);
    const CropParams p = RandomCrop::params(36, 36, 28, 28, same);
    ASSERT_TRUE(torch::equal(out, F::crop(F::pad(img, 4, 4, 4, 4, {0}), p.top, p.left, 28, 28)));
    tops.insert(p.top);
  }
  EXPECT_EQ(tops, (std::set<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8}));
  SampleRandom random(0, 0, 0);
  EXPECT_EQ(RandomCrop(30, 32, {}, true).apply(img, random).sizes(), (std::vector<int64_t>{30, 32, 3}));
  int flipped = 0;
  for (int64_t index = 0; index < 1000; ++index) {
    SampleRandom r(9, 0, index);
    flipped += torch::equal(RandomHorizontalFlip().apply(img, r), F::hflip(img)) ? 1 : 0;
  }
  EXPECT_NEAR(flipped, 500, 60);
  EXPECT_THAT(testing::error_message([] { RandomCrop(8, 8, {}, false, {0}, "reflect"); }),
              HasSubstr("padding_mode 'reflect' is not supported"));
  EXPECT_THAT(testing::error_message([&] { RandomCrop(40, 40).apply(img, random); }),
              HasSubstr("larger than the (padded) image (28, 28)"));
}

// Specs as a user copies them from Python come back from str() in one canonical spelling, which
// parses to itself.
TEST(TransformSpec, GoodSpecsRoundTripThroughStr) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"Resize(32), CenterCrop(28), RandomHorizontalFlip(), ToTensor(), Normalize((0.5,), (0.5,))",
       "Compose(Resize(32), CenterCrop(28), RandomHorizontalFlip(), ToTensor(), Normalize(mean=(0.5,), std=(0.5,)))"},
      {"T.RandomResizedCrop(224); transforms.RandomHorizontalFlip(p=0.25); T.ToTensor;"
       " T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])",
       "Compose(RandomResizedCrop(224), RandomHorizontalFlip(p=0.25), ToTensor(), "
       "Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)))"},
      {"RandomCrop(28, padding=4), Grayscale(3)", "Compose(RandomCrop(28, padding=4), Grayscale(num_output_channels=3), ToTensor())"},
      {"RandomCrop(size=(28, 20), padding=(1, 2), pad_if_needed=True, fill=(1, 2, 3), padding_mode='constant')",
       "Compose(RandomCrop((28, 20), padding=(1, 2), pad_if_needed=True, fill=(1, 2, 3)), ToTensor())"},
      {"Resize((32, 48), interpolation=T.InterpolationMode.BILINEAR, max_size=None, antialias=True)",
       "Compose(Resize((32, 48), antialias=True), ToTensor())"},
      {"RandomResizedCrop([32], scale=(0.5, 1), ratio=(3/4, 4.0 / 3.0))",
       "Compose(RandomResizedCrop(32, scale=(0.5, 1.0)), ToTensor())"},
      {"Resize(32, max_size=40)", "Compose(Resize(32, max_size=40), ToTensor())"},
      {"ToTensor()", "Compose(ToTensor())"},
  };
  for (const auto& [spec, canonical] : cases) {
    const Transforms parsed = Transforms::parse(spec);
    EXPECT_EQ(parsed.str(), canonical) << spec;
    const std::string inner = canonical.substr(8, canonical.size() - 9);
    EXPECT_EQ(Transforms::parse(inner).str(), canonical) << inner;
  }
  EXPECT_EQ(Transforms().str(), "Compose(ToTensor())");
  EXPECT_TRUE(Transforms::parse("RandomCrop(28, padding=4)").random());
  EXPECT_FALSE(Transforms::parse("Resize(28)").random());
}

// Held-out images get each random step's deterministic counterpart, as torchvision's reference
// scripts pair them.
TEST(TransformSpec, ForEvaluationReplacesEachRandomStepByItsCounterpart) {
  EXPECT_EQ(Transforms::parse("RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor(), Normalize((0.5,), (0.5,))")
                .for_evaluation().str(),
            "Compose(Resize(224), CenterCrop(224), ToTensor(), Normalize(mean=(0.5,), std=(0.5,)))");
  EXPECT_EQ(Transforms::parse("RandomCrop((28, 20), padding=4), Grayscale()").for_evaluation().str(),
            "Compose(CenterCrop((28, 20)), Grayscale(), ToTensor())");
  EXPECT_FALSE(Transforms::parse("RandomResizedCrop((32, 48)), RandomHorizontalFlip(p=1)").for_evaluation().random());
  EXPECT_EQ(Transforms::parse("Resize(32)").for_evaluation().str(), "Compose(Resize(32), ToTensor())");
}

// Bad specs: c10::ValueError naming the spec, the offending text and what is known.
TEST(TransformSpec, BadSpecsNameTheSpecTheTextAndWhatIsKnown) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"Resize(32), Blur(3)", "unknown transform 'Blur' at 'Blur(3)' (offset 12); known transforms: CenterCrop, "
                              "Grayscale, Normalize, RandomCrop, RandomHorizontalFlip, RandomResizedCrop, Resize, ToTensor"},
      {"Resize(32, sizee=3)", "Resize has no argument 'sizee'; it takes Resize(size, interpolation, max_size, antialias)"},
      {"Resize()", "Resize needs its argument 'size'"},
      {"Resize(32, interpolation=InterpolationMode.NEAREST)", "interpolation 'InterpolationMode.NEAREST' is not supported"},
      {"CenterCrop(28, 3)", "CenterCrop takes at most 1 arguments"},
      {"CenterCrop('a')", "expected an int or (h, w), got ''a''"},
      {"Resize(32) CenterCrop(28)", "expected ',' or ';' between transforms at 'CenterCrop(28)'"},
      {"Resize(32", "expected ',' or ')' in the arguments of Resize at the end"},
      {"ToTensor(), Resize(32)", "Resize(32) works on the uint8 image and must come before ToTensor() at 'Resize(32)'"},
      {"Normalize((0.5,), (0.5,))", "works on the float tensor and needs ToTensor() before it"},
      {"ToTensor(), ToTensor()", "ToTensor() twice"},
      {"Normalize(mean=0.5, std=0)", "is zero (in float32)"},
      {"RandomCrop(8, padding_mode='edge')", "padding_mode 'edge' is not supported"},
      {"Resize(size=3, 4)", "a positional argument after a keyword argument"},
      {"", "no transforms"},
      // Issue 53 item 18: sizes no image can have were accepted here and refused at the first batch
      // as a memory request; 10^23 was clamped to INT64_MAX.
      {"Resize(100000)", "integer 100000 is larger than any transform takes (at most 65535, the largest side of a "
                         "JPEG image) at '100000)'"},
      {"Resize(99999999999999999999999)", "integer 99999999999999999999999 is larger than any transform takes"},
      {"RandomCrop(28, padding=100000)", "integer 100000 is larger"},
      {"Resize(20000)", "an output of at least 20000 x 20000 pixels is more than the 178956970 an image may have"},
      {"CenterCrop((60000, 60000))", "an output of at least 60000 x 60000 pixels"},
      {"RandomResizedCrop(30000)", "an output of at least 30000 x 30000 pixels"},
  };
  for (const auto& [spec, expected] : cases) {
    try {
      Transforms::parse(spec);
      ADD_FAILURE() << spec << " parsed";
    } catch (const c10::ValueError& e) {
      EXPECT_THAT(e.what_without_backtrace(), HasSubstr("transform spec '" + spec + "'")) << spec;
      EXPECT_THAT(e.what_without_backtrace(), HasSubstr(expected)) << spec;
    }
  }
}

// Issue 53 item 2: 30,000 nested parentheses overflowed the parser's stack (rc 139). Values nest
// at most 64 deep; the message shows a long spec by its start, so it stays short.
TEST(TransformSpec, DeepNestingIsRefusedNotRecursedInto) {
  for (const size_t depth : {65, 30000, 1000000}) {
    std::string spec = "Resize(";
    spec.append(depth, '(').append("28").append(depth, ')').append(")");
    const std::string message = testing::error_message([&] { Transforms::parse(spec); });
    EXPECT_THAT(message, HasSubstr("values nested more than 64 deep")) << depth;
    const std::string characters = c10::str("(", spec.size(), " characters)");
    if (spec.size() > 200) EXPECT_THAT(message, HasSubstr(characters)) << depth;
    EXPECT_LT(message.size(), 1000u) << depth;
  }
  // 64 deep parses as Python reads it: (((28))) is 28.
  EXPECT_EQ(Transforms::parse("Resize(" + std::string(64, '(') + "28" + std::string(64, ')') + ")").str(),
            Transforms::parse("Resize(28)").str());
}

// Padding within the integer bound can still ask for more pixels than an image may have: refused by
// the transform, naming the size, before the allocation.
TEST(Transform, PaddingBeyondTheImageLimitIsRefusedBeforeAllocating) {
  SampleRandom random(0, 0, 0);
  const torch::Tensor image = torch::zeros({28, 28, 1}, torch::kUInt8);
  EXPECT_THAT(testing::error_message([&] { Transforms::parse("RandomCrop(28, padding=60000)")(image, random); }),
              HasSubstr("pad: an output of 120028 x 120028 pixels is more than the 178956970"));
}

// After ToTensor a transform that needs the uint8 image refuses a float tensor with a message
// (for pipelines built in code, which the parser does not see).
TEST(Transform, ImageTransformsRefuseTensors) {
  SampleRandom random(0, 0, 0);
  const torch::Tensor tensor = torch::rand({3, 8, 8});
  EXPECT_THAT(testing::error_message([&] { Resize({4}).apply(tensor, random); }),
              HasSubstr("Resize: expected a uint8 (H, W, C) image (before ToTensor)"));
  EXPECT_THAT(testing::error_message([&] { Normalize({0.5, 0.5}, {0.5, 0.5}).apply(tensor, random); }),
              HasSubstr("has 2 values for an image of 3 channels"));
}

}  // namespace
}  // namespace lockstep::data
