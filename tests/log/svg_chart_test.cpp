#include "lockstep/log/svg_chart.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <regex>

#include "../test_util.h"

namespace lockstep::log {
namespace {

using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Pointwise;

// The attribute values of every element whose tag starts with `tag_start`, in document order.
std::vector<std::string> attribute(const std::string& svg, const std::string& tag_start, const std::string& name) {
  std::vector<std::string> out;
  const std::regex tag("<" + tag_start + "[^>]*>"), attr(" " + name + "=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), tag); it != std::sregex_iterator(); ++it) {
    std::smatch m;
    const std::string element = it->str();
    if (std::regex_search(element, m, attr)) out.push_back(m[1]);
  }
  return out;
}

TEST(NiceTicks, AreRoundStepsThatCoverTheRange) {
  EXPECT_THAT(nice_ticks(0.0, 1.0, 5), Pointwise(DoubleNear(1e-12), {0.0, 0.2, 0.4, 0.6, 0.8, 1.0}));
  EXPECT_THAT(nice_ticks(3.0, 397.0, 6), ElementsAre(0.0, 100.0, 200.0, 300.0, 400.0));
  EXPECT_THAT(nice_ticks(-0.3, 0.25, 5), Pointwise(DoubleNear(1e-12), {-0.4, -0.2, 0.0, 0.2, 0.4}));
  const auto lr = nice_ticks(0.0, 0.02, 5);
  EXPECT_DOUBLE_EQ(lr.front(), 0.0);
  EXPECT_NEAR(lr.back(), 0.02, 1e-12);
  EXPECT_EQ(lr.size(), 5u);  // steps of 0.005
  EXPECT_THAT(nice_ticks(1.0, 2.0, 6, 1.0), ElementsAre(1.0, 2.0)) << "whole epochs: no ticks between them";
  EXPECT_THAT(nice_ticks(0.0, 0.0, 5), Pointwise(DoubleNear(1e-12), {0.0, 0.2, 0.4, 0.6, 0.8, 1.0}))
      << "nothing skipped: 0 to 1, not negative";
  const auto one = nice_ticks(7.0, 7.0, 5);  // a single value gets a range around it
  EXPECT_LT(one.front(), 7.0);
  EXPECT_GT(one.back(), 7.0);
  EXPECT_THAT(testing::error_message([] { nice_ticks(1.0, NAN, 5); }), HasSubstr("bad range"));
}

TEST(ShortNumber, UsesFewDigitsAndThousandsSuffixes) {
  EXPECT_EQ(short_number(0), "0");
  EXPECT_EQ(short_number(0.25), "0.25");
  EXPECT_EQ(short_number(1500), "1500");
  EXPECT_EQ(short_number(12000), "12k");
  EXPECT_EQ(short_number(65536), "65.5k");
  EXPECT_EQ(short_number(2.5e6), "2.5M");
  EXPECT_EQ(short_number(1e-5), "1e-05");
}

TEST(LineChart, EveryFinitePointCarriesItsValueAndNonFiniteOnesAreGaps) {
  // Inputs, not results of training: printing them is the same on every x86-64 CPU.
  const LineSeries loss{"loss", {10, 20, 30, 40}, {2.5, NAN, 0.123456789012, 0.1}};
  const std::string svg = line_chart_svg(LineChartOptions().title("Loss <train>").x_label("step"), {loss});
  EXPECT_THAT(attribute(svg, "circle", "data-x"), ElementsAre("10", "30", "40"));
  EXPECT_THAT(attribute(svg, "circle", "data-y"), ElementsAre("2.5", "0.123456789", "0.1"));
  EXPECT_EQ(attribute(svg, "polyline", "points").size(), 2u) << "the NaN splits the line in two";
  EXPECT_THAT(svg, HasSubstr("Loss &lt;train&gt;"));
  EXPECT_THAT(svg, Not(HasSubstr("<train>")));
  EXPECT_THAT(testing::error_message([] { line_chart_svg(LineChartOptions().title("t"), {{"s", {1, 2}, {1}}}); }),
              HasSubstr("series 's' has 2 x values but 1 y values"));
}

// Points land inside the plot area, higher values higher up (SVG's y grows downwards).
TEST(LineChart, MapsValuesMonotonicallyIntoThePlot) {
  const std::string svg =
      line_chart_svg(LineChartOptions().width(400).height(200), {{"acc", {1, 2, 3}, {0.5, 0.7, 0.9}}});
  const auto cx = attribute(svg, "circle", "cx"), cy = attribute(svg, "circle", "cy");
  ASSERT_EQ(cx.size(), 3u);
  for (size_t i = 0; i + 1 < 3; ++i) {
    EXPECT_LT(std::stod(cx[i]), std::stod(cx[i + 1]));
    EXPECT_GT(std::stod(cy[i]), std::stod(cy[i + 1]));
  }
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_GT(std::stod(cx[i]), 0);
    EXPECT_LT(std::stod(cx[i]), 400);
    EXPECT_GT(std::stod(cy[i]), 20);
    EXPECT_LT(std::stod(cy[i]), 200);
  }
  EXPECT_THAT(line_chart_svg(LineChartOptions().empty_message("nothing here"), {}), HasSubstr("nothing here"));
}

// Note [Downsampled line charts]: a million points are drawn as each pixel column's lowest and
// highest, so the chart stays small and a one-step spike (and a one-step dip) still shows with its
// logged value; before, every point was a marker and the chart was ~250 MB.
TEST(LineChart, AMillionPointsAreDrawnAsEachColumnsLowestAndHighest) {
  constexpr int kPoints = 1000000;
  LineSeries loss{"loss", std::vector<double>(kPoints), std::vector<double>(kPoints)};
  for (int i = 0; i < kPoints; ++i) loss.x[i] = i + 1, loss.y[i] = 2.0 + 0.001 * (i % 7);
  loss.y[123456] = 97.25;  // a spike
  loss.y[765432] = -3.5;   // a dip
  loss.y[500000] = NAN;    // a gap
  const std::string svg = line_chart_svg(LineChartOptions().width(560).height(300), {loss});
  EXPECT_LT(svg.size(), 400000u) << "one marker per point would be ~250 MB";
  const auto ys = attribute(svg, "circle", "data-y"), xs = attribute(svg, "circle", "data-x");
  EXPECT_LE(ys.size(), 2u * 560) << "at most the lowest and highest of each column";
  EXPECT_GE(ys.size(), 2u * 400);
  EXPECT_THAT(ys, ::testing::Contains("97.25"));
  EXPECT_THAT(ys, ::testing::Contains("-3.5"));
  EXPECT_THAT(xs, ::testing::Contains("123457"));
  for (size_t i = 0; i + 1 < xs.size(); ++i) EXPECT_LT(std::stod(xs[i]), std::stod(xs[i + 1])) << "in step order";
  EXPECT_EQ(attribute(svg, "polyline", "points").size(), 2u) << "the NaN is still a gap";
  EXPECT_THAT(svg, HasSubstr("1000000 points, drawn as each pixel column&#39;s lowest and highest"));
  EXPECT_THAT(svg, HasSubstr("1 not finite: gaps"));
}

// Any finite values get finite pixel coordinates and ticks, however far apart (the range of
// -1e308 to 1e308 overflows a double: the coordinates were -nan). Infinities and NaN are gaps,
// counted under the title.
TEST(LineChart, ExtremeFiniteValuesGetFiniteCoordinates) {
  const double max = std::numeric_limits<double>::max();
  for (const auto& y : std::vector<std::vector<double>>{{1e308, -1e308, 1.0, 5e-324},
                                                         {max, -max, INFINITY, NAN},
                                                         {max, max * 0.999999, -INFINITY, 0.0}}) {
    const std::string svg = line_chart_svg(LineChartOptions(), {{"loss", {1, 2, 3, 4}, y}});
    std::vector<std::string> coordinates = attribute(svg, "circle", "cx");
    for (const auto& a : {"cy", "y1", "y2", "x1", "x2"}) {
      const auto more = attribute(svg, a[0] == 'c' ? "circle" : "line", a);
      coordinates.insert(coordinates.end(), more.begin(), more.end());
    }
    for (const auto& p : attribute(svg, "polyline", "points")) coordinates.push_back(p);
    for (const auto& c : coordinates) EXPECT_THAT(c, ::testing::Not(::testing::ContainsRegex("nan|inf"))) << y[0];
    EXPECT_EQ(attribute(svg, "circle", "cy").size(), static_cast<size_t>(std::count_if(y.begin(), y.end(), [](double v) {
                return std::isfinite(v);
              })));
  }
  EXPECT_THAT(line_chart_svg(LineChartOptions(), {{"loss", {1, 2, 3}, {1.0, INFINITY, NAN}}}),
              HasSubstr("2 not finite: gaps"));
  // A single subnormal value: a tenth of it is 0, so it got a range of 0 and a tick step of 0,
  // and dividing by it gave a tick index of inf (fuzz/crashes/run_log/).
  for (const double tiny : {5e-324, -5e-324}) {
    const auto around = nice_ticks(tiny, tiny, 5);
    ASSERT_GE(around.size(), 2u);
    EXPECT_LE(around.front(), tiny);
    EXPECT_GE(around.back(), tiny);
  }
  const auto ticks = nice_ticks(-1e308, 1e308, 5);
  ASSERT_GE(ticks.size(), 3u);
  for (double t : ticks) EXPECT_TRUE(std::isfinite(t)) << t;
  EXPECT_LE(ticks.front(), -1e308);
  EXPECT_GE(ticks.back(), 1e308);
}

TEST(BarChart, StacksSeriesAndLabelsTotals) {
  const std::string svg = bar_chart_svg(BarChartOptions().title("Memory"), {"ddp", "zero2"},
                                        {{"params", {4, 4}}, {"optimizer", {8, 4}}});
  EXPECT_THAT(attribute(svg, "rect class=\"bar\"", "data-value"), ElementsAre("4", "8", "4", "4"));
  EXPECT_THAT(attribute(svg, "rect class=\"bar\"", "data-category"), ElementsAre("ddp", "ddp", "zero2", "zero2"));
  const auto x = attribute(svg, "rect class=\"bar\"", "x"), w = attribute(svg, "rect class=\"bar\"", "width");
  EXPECT_NEAR(std::stod(x[1]), std::stod(x[0]) + std::stod(w[0]), 0.2) << "the second segment starts where the first ends";
  EXPECT_NEAR(std::stod(w[1]), 2 * std::stod(w[0]), 0.2);
  EXPECT_THAT(svg, HasSubstr(">12</text>"));  // ddp's total
  EXPECT_THAT(testing::error_message([] { bar_chart_svg({}, {"a"}, {{"s", {-1}}}); }),
              HasSubstr("has value -1 for 'a'"));
  EXPECT_THAT(testing::error_message([] { bar_chart_svg({}, {"a", "b"}, {{"s", {1}}}); }),
              HasSubstr("series 's' has 1 values for 2 categories"));
}

}  // namespace
}  // namespace lockstep::log
