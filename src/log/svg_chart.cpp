#include "lockstep/log/svg_chart.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace lockstep::log {
namespace {

// Tableau 10: distinct in colour and in grey, readable on white.
constexpr const char* kPalette[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1",
                                    "#76b7b2", "#edc948", "#ff9da7", "#9c755f", "#bab0ac"};
constexpr int kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);
constexpr double kCharWidth = 6.4;  // px per character at font-size 11, for layout estimates

const char* colour(size_t i) { return kPalette[i % kPaletteSize]; }

// A value as data attributes carry it: enough digits to read back what was logged.
std::string exact(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.10g", v);
  return buf;
}

std::string px(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}

std::string svg_open(int width, int height, const std::string& title) {
  return "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"" + std::to_string(width) +
         "\" height=\"" + std::to_string(height) + "\" viewBox=\"0 0 " + std::to_string(width) + " " +
         std::to_string(height) + "\" font-family=\"sans-serif\" font-size=\"11\" role=\"img\" aria-label=\"" +
         xml_escape(title) + "\">\n<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n<text x=\"" +
         px(width / 2.0) + "\" y=\"18\" text-anchor=\"middle\" font-size=\"13\" font-weight=\"bold\">" +
         xml_escape(title) + "</text>\n";
}

std::string text(double x, double y, const std::string& anchor, const std::string& content,
                 const std::string& extra = "") {
  return "<text x=\"" + px(x) + "\" y=\"" + px(y) + "\" text-anchor=\"" + anchor + "\"" + extra + ">" +
         xml_escape(content) + "</text>\n";
}

std::string line(double x1, double y1, double x2, double y2, const std::string& stroke) {
  return "<line x1=\"" + px(x1) + "\" y1=\"" + px(y1) + "\" x2=\"" + px(x2) + "\" y2=\"" + px(y2) +
         "\" stroke=\"" + stroke + "\"/>\n";
}

// A legend, right-aligned on the line at `y`: a swatch and the name per entry.
std::string legend(const std::vector<std::string>& names, double right, double y) {
  std::string out;
  double x = right;
  for (size_t i = names.size(); i-- > 0;) {
    x -= names[i].size() * kCharWidth;
    out += text(x, y + 4, "start", names[i]);
    x -= 14;
    out += "<rect x=\"" + px(x) + "\" y=\"" + px(y - 5) + "\" width=\"10\" height=\"10\" fill=\"" + colour(i) +
           "\"/>\n";
    x -= 12;
  }
  return out;
}

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int target, double min_step) {
  TORCH_CHECK_VALUE(std::isfinite(lo) && std::isfinite(hi) && lo <= hi && target >= 1, "nice_ticks: bad range [", lo,
                    ", ", hi, "] or target ", target);
  if (hi - lo < std::max(std::abs(hi), 1.0) * 1e-12) {  // one value: a range around it
    if (std::abs(lo) < 1e-300) {  // 0, or too small for a tenth of it to widen the range (5e-324)
      hi = lo >= 0 ? 1.0 : 0.0;   // counts and rates at 0 stay non-negative
      lo = lo >= 0 ? 0.0 : -1.0;
    } else {
      const double pad = std::abs(lo) * 0.1;
      lo -= pad;
      hi += pad;
    }
  }
  // In long double: hi - lo of values near DBL_MAX (a loss of 1e308 beside -1e308) overflows double.
  const long double raw = (static_cast<long double>(hi) - lo) / target;
  const long double magnitude = std::pow(10.0L, std::floor(std::log10(raw)));
  long double step = magnitude;
  for (long double m : {1.0L, 2.0L, 5.0L, 10.0L}) {
    step = m * magnitude;
    if (step >= raw) break;
  }
  step = std::max<long double>(step, min_step);
  std::vector<double> ticks;
  // Multiples of step, by index: adding step up would accumulate rounding. The outer ticks stay
  // within double's range (the data's own bound when the next multiple is past it).
  const auto first = static_cast<int64_t>(std::floor(lo / step + 1e-9L));
  const auto last = static_cast<int64_t>(std::ceil(hi / step - 1e-9L));
  constexpr long double kMax = std::numeric_limits<double>::max();
  for (int64_t k = first; k <= last; ++k)
    ticks.push_back(static_cast<double>(std::clamp(static_cast<long double>(k) * step, -kMax, kMax)));
  return ticks;
}

std::string fixed(double value, int digits) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, value);
  return buf;
}

std::string short_number(double value) {
  char buf[32];
  const double a = std::abs(value);
  if (a >= 1e9) {
    std::snprintf(buf, sizeof(buf), "%.3gG", value / 1e9);
  } else if (a >= 1e6) {
    std::snprintf(buf, sizeof(buf), "%.3gM", value / 1e6);
  } else if (a >= 1e4) {
    std::snprintf(buf, sizeof(buf), "%.3gk", value / 1e3);
  } else {
    std::snprintf(buf, sizeof(buf), "%.4g", value);
  }
  return buf;
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {

// Note [Downsampled line charts]
// A chart is at most a few hundred pixels wide, and a run logs a point per step: a million points
// made a 589 MB page. A series with more than two points per pixel column keeps, in each column,
// its lowest and its highest point (in step order) and its first non-finite one (the gap), as
// TensorBoard-like viewers do: every spike stays visible, the line looks as it would with every
// point, and the page has at most ~3 markers per column and series. The kept points carry their
// logged values unrounded (Note [Charts that carry their values]); the chart says how many it
// drew. Non-finite values are gaps in the line, counted in the same note.
LineSeries downsample(const LineSeries& s, double x_lo, double x_hi, int columns) {
  LineSeries out{s.name, {}, {}};
  const auto keep = [&](size_t i) { out.x.push_back(s.x[i]), out.y.push_back(s.y[i]); };
  if (s.x.size() <= 2 * static_cast<size_t>(columns)) {
    out.x = s.x, out.y = s.y;
    return out;
  }
  const long double span = static_cast<long double>(x_hi) - x_lo;
  const auto column = [&](double x) {
    if (!std::isfinite(x)) return int64_t{-1};
    return std::clamp(static_cast<int64_t>((x - x_lo) / span * columns), int64_t{0}, int64_t{columns - 1});
  };
  for (size_t begin = 0; begin < s.x.size();) {
    const int64_t c = column(s.x[begin]);
    size_t end = begin, low = SIZE_MAX, high = SIZE_MAX, gap = SIZE_MAX;
    for (; end < s.x.size() && column(s.x[end]) == c; ++end) {
      if (c < 0 || !std::isfinite(s.y[end])) {
        gap = std::min(gap, end);
      } else {
        if (low == SIZE_MAX || s.y[end] < s.y[low]) low = end;
        if (high == SIZE_MAX || s.y[end] > s.y[high]) high = end;
      }
    }
    size_t kept[] = {low, high, gap};
    std::sort(std::begin(kept), std::end(kept));
    for (size_t k = 0; k < 3; ++k)
      if (kept[k] != SIZE_MAX && (k == 0 || kept[k] != kept[k - 1])) keep(kept[k]);
    begin = end;
  }
  return out;
}

}  // namespace

std::string line_chart_svg(const LineChartOptions& o, const std::vector<LineSeries>& series) {
  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo, y_lo = x_lo, y_hi = -x_lo;
  for (const LineSeries& s : series) {
    TORCH_CHECK_VALUE(s.x.size() == s.y.size(), "line chart '", o.title(), "': series '", s.name, "' has ", s.x.size(),
                      " x values but ", s.y.size(), " y values");
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      x_lo = std::min(x_lo, s.x[i]);
      x_hi = std::max(x_hi, s.x[i]);
      y_lo = std::min(y_lo, s.y[i]);
      y_hi = std::max(y_hi, s.y[i]);
    }
  }
  std::string svg = svg_open(o.width(), o.height(), o.title());
  if (!std::isfinite(x_lo)) {
    svg += text(o.width() / 2.0, o.height() / 2.0, "middle", o.empty_message(), " fill=\"#666666\"");
    return svg + "</svg>\n";
  }
  if (o.y_from_zero()) y_lo = std::min(y_lo, 0.0);
  const std::vector<double> xt = nice_ticks(x_lo, x_hi, 6, o.integer_x() ? 1.0 : 0.0), yt = nice_ticks(y_lo, y_hi, 5);
  x_lo = xt.front(), x_hi = xt.back(), y_lo = yt.front(), y_hi = yt.back();
  double left = 16;
  for (double t : yt) left = std::max(left, short_number(t).size() * kCharWidth + 30);
  const double right = o.width() - 18.0, top = series.size() > 1 ? 46.0 : 34.0, bottom = o.height() - 42.0;
  // In long double, so that any finite values map to finite pixels (see nice_ticks).
  auto sx = [&](double x) {
    return static_cast<double>(left + (static_cast<long double>(x) - x_lo) / (static_cast<long double>(x_hi) - x_lo) *
                                          (right - left));
  };
  auto sy = [&](double y) {
    return static_cast<double>(bottom - (static_cast<long double>(y) - y_lo) /
                                            (static_cast<long double>(y_hi) - y_lo) * (bottom - top));
  };

  for (double t : yt) {
    svg += line(left, sy(t), right, sy(t), "#e4e4e4");
    svg += text(left - 6, sy(t) + 4, "end", short_number(t));
  }
  for (double t : xt) {
    svg += line(sx(t), bottom, sx(t), bottom + 4, "#333333");
    svg += text(sx(t), bottom + 16, "middle", short_number(t));
  }
  svg += line(left, bottom, right, bottom, "#333333") + line(left, top, left, bottom, "#333333");
  svg += text((left + right) / 2, o.height() - 8.0, "middle", o.x_label());
  svg += text(14, (top + bottom) / 2, "middle", o.y_label(),
              " transform=\"rotate(-90 14 " + px((top + bottom) / 2) + ")\"");
  if (series.size() > 1) {
    std::vector<std::string> names;
    for (const LineSeries& s : series) names.push_back(s.name);
    svg += legend(names, right, 34);
  }

  size_t logged = 0, drawn = 0, not_finite = 0;
  for (size_t k = 0; k < series.size(); ++k) {
    const LineSeries s = downsample(series[k], x_lo, x_hi, std::max(1, static_cast<int>(right - left)));
    logged += series[k].x.size();
    drawn += s.x.size();
    for (size_t i = 0; i < series[k].x.size(); ++i)
      not_finite += !std::isfinite(series[k].x[i]) || !std::isfinite(series[k].y[i]);
    std::string points;
    auto flush = [&] {
      if (!points.empty())
        svg += "<polyline fill=\"none\" stroke=\"" + std::string(colour(k)) + "\" stroke-width=\"1.8\" points=\"" +
               points + "\"/>\n";
      points.clear();
    };
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) {
        flush();
        continue;
      }
      points += (points.empty() ? "" : " ") + px(sx(s.x[i])) + "," + px(sy(s.y[i]));
    }
    flush();
    const std::string r = series[k].x.size() <= 60 ? "3" : "1.6";
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      svg += "<circle class=\"point\" cx=\"" + px(sx(s.x[i])) + "\" cy=\"" + px(sy(s.y[i])) + "\" r=\"" + r +
             "\" fill=\"" + colour(k) + "\" data-series=\"" + xml_escape(s.name) + "\" data-x=\"" + exact(s.x[i]) +
             "\" data-y=\"" + exact(s.y[i]) + "\"><title>" + xml_escape(s.name) + " " + short_number(s.y[i]) +
             " at " + xml_escape(o.x_label()) + " " + short_number(s.x[i]) + "</title></circle>\n";
    }
  }
  std::string note;
  if (drawn < logged)
    note = std::to_string(logged) + " points, drawn as each pixel column's lowest and highest (" +
           std::to_string(drawn) + ")";
  if (not_finite > 0) note += (note.empty() ? "" : "; ") + std::to_string(not_finite) + " not finite: gaps";
  if (!note.empty()) svg += text(left, top - 5, "start", note, " class=\"chart-note\" font-size=\"10\" fill=\"#666666\"");
  return svg + "</svg>\n";
}

std::string bar_chart_svg(const BarChartOptions& o, const std::vector<std::string>& categories,
                          const std::vector<BarSeries>& series) {
  std::vector<double> totals(categories.size(), 0.0);
  for (const BarSeries& s : series) {
    TORCH_CHECK_VALUE(s.values.size() == categories.size(), "bar chart '", o.title(), "': series '", s.name, "' has ",
                      s.values.size(), " values for ", categories.size(), " categories");
    for (size_t i = 0; i < s.values.size(); ++i) {
      TORCH_CHECK_VALUE(s.values[i] >= 0 && std::isfinite(s.values[i]), "bar chart '", o.title(), "': series '",
                        s.name, "' has value ", s.values[i], " for '", categories[i], "'; bars need finite values >= 0");
      totals[i] += s.values[i];
    }
  }
  double label_width = 0;
  for (const std::string& c : categories) label_width = std::max(label_width, c.size() * kCharWidth);
  const double left = std::min(label_width + 16, o.width() * 0.45), right = o.width() - 60.0;
  const double top = series.size() > 1 ? 48.0 : 32.0;
  const double bottom = top + static_cast<double>(categories.size()) * o.row_height();
  const int height = static_cast<int>(bottom) + 44;
  std::string svg = svg_open(o.width(), height, o.title());
  const double max_total = totals.empty() ? 0.0 : *std::max_element(totals.begin(), totals.end());
  const std::vector<double> ticks = nice_ticks(0.0, std::max(max_total, 1e-300), 5);
  const double v_hi = ticks.back();
  auto sx = [&](double v) { return left + v / v_hi * (right - left); };

  for (double t : ticks) {
    svg += line(sx(t), top, sx(t), bottom, "#e4e4e4");
    svg += text(sx(t), bottom + 16, "middle", short_number(t));
  }
  svg += line(left, bottom, right, bottom, "#333333") + line(left, top, left, bottom, "#333333");
  svg += text((left + right) / 2, height - 8.0, "middle", o.value_label());
  if (series.size() > 1) {
    std::vector<std::string> names;
    for (const BarSeries& s : series) names.push_back(s.name);
    svg += legend(names, o.width() - 12.0, 34);
  }
  for (size_t i = 0; i < categories.size(); ++i) {
    const double y = top + static_cast<double>(i) * o.row_height(), bar = o.row_height() * 0.64;
    const double bar_top = y + (o.row_height() - bar) / 2;
    svg += text(left - 6, bar_top + bar / 2 + 4, "end", categories[i]);
    double start = 0;
    for (size_t k = 0; k < series.size(); ++k) {
      const double v = series[k].values[i];
      svg += "<rect class=\"bar\" x=\"" + px(sx(start)) + "\" y=\"" + px(bar_top) + "\" width=\"" +
             px(sx(start + v) - sx(start)) + "\" height=\"" + px(bar) + "\" fill=\"" + colour(k) +
             "\" data-category=\"" + xml_escape(categories[i]) + "\" data-series=\"" + xml_escape(series[k].name) +
             "\" data-value=\"" + exact(v) + "\"><title>" + xml_escape(categories[i]) + ", " +
             xml_escape(series[k].name) + ": " + short_number(v) + "</title></rect>\n";
      start += v;
    }
    svg += text(sx(start) + 4, bar_top + bar / 2 + 4, "start", short_number(totals[i]));
  }
  return svg + "</svg>\n";
}

}  // namespace lockstep::log
