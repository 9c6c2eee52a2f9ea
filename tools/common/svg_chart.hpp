// SPDX-License-Identifier: MIT
// The one small SVG writer of the tools' pictures (docs/operations.md "Pictures"): plain SVG 1.1
// text, no scripts, no external fonts or files, so any browser, librsvg or
// an image viewer shows it.  Two charts: a line chart (cxlkv-replay --plot:
// hit ratio against capacity) and a ratio chart (make bench's report.svg:
// each metric against its same-run baseline and target, log scale).
// Non-finite values are left out, never written as "nan".
#pragma once

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace cxlkv::svg {

// Text content and attribute values: XML-escaped, control characters dropped.
inline std::string escape(const std::string& s) {
  std::string o;
  for (unsigned char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&apos;"; break;
      default:
        if (c >= 0x20 || c == '\t') o += char(c);
    }
  }
  return o;
}

inline std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", std::isfinite(v) ? v : 0.0);
  return b;
}

class Document {
 public:
  Document(double w, double h) : w_(w), h_(h) {}
  void rect(double x, double y, double w, double h, const std::string& fill, const std::string& stroke = "none") {
    body_ += "<rect x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" + num(std::max(0.0, w)) + "\" height=\"" +
             num(std::max(0.0, h)) + "\" fill=\"" + escape(fill) + "\" stroke=\"" + escape(stroke) + "\"/>\n";
  }
  void line(double x1, double y1, double x2, double y2, const std::string& stroke, double width = 1,
            const std::string& dash = "") {
    body_ += "<line x1=\"" + num(x1) + "\" y1=\"" + num(y1) + "\" x2=\"" + num(x2) + "\" y2=\"" + num(y2) +
             "\" stroke=\"" + escape(stroke) + "\" stroke-width=\"" + num(width) + "\"" +
             (dash.empty() ? "" : " stroke-dasharray=\"" + escape(dash) + "\"") + "/>\n";
  }
  void polyline(const std::vector<std::pair<double, double>>& pts, const std::string& stroke, double width,
                const std::string& dash = "") {
    if (pts.size() < 2) return;
    std::string p;
    for (auto& [x, y] : pts) p += num(x) + "," + num(y) + " ";
    body_ += "<polyline points=\"" + p + "\" fill=\"none\" stroke=\"" + escape(stroke) + "\" stroke-width=\"" +
             num(width) + "\"" + (dash.empty() ? "" : " stroke-dasharray=\"" + escape(dash) + "\"") + "/>\n";
  }
  void circle(double x, double y, double r, const std::string& fill) {
    body_ += "<circle cx=\"" + num(x) + "\" cy=\"" + num(y) + "\" r=\"" + num(r) + "\" fill=\"" + escape(fill) +
             "\"/>\n";
  }
  // anchor: start | middle | end; rotate: degrees about (x, y).
  void text(double x, double y, const std::string& s, double size = 12, const std::string& anchor = "start",
            const std::string& fill = "#222", bool bold = false, double rotate = 0) {
    body_ += "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\" font-size=\"" + num(size) + "\" text-anchor=\"" +
             escape(anchor) + "\" fill=\"" + escape(fill) + "\"" + (bold ? " font-weight=\"bold\"" : "") +
             (rotate != 0 ? " transform=\"rotate(" + num(rotate) + " " + num(x) + " " + num(y) + ")\"" : "") + ">" +
             escape(s) + "</text>\n";
  }
  std::string str() const {
    return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" "
           "width=\"" + num(w_) + "\" height=\"" + num(h_) + "\" viewBox=\"0 0 " + num(w_) + " " + num(h_) +
           "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n<rect width=\"100%\" height=\"100%\" "
           "fill=\"white\"/>\n" + body_ + "</svg>\n";
  }
  // Writes the file (through a temporary and a rename: never a half file).
  bool save(const std::string& path, std::string* err) const { return save_text(path, str(), err); }
  static bool save_text(const std::string& path, const std::string& text, std::string* err) {
    const std::string tmp = path + ".tmp";
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      if (!f) {
        *err = cannot_write(tmp);
        return false;
      }
      f << text;
      if (!f.flush()) {
        *err = cannot_write(tmp);
        std::remove(tmp.c_str());
        return false;
      }
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
      *err = "cannot rename " + tmp + " to " + path + ": " + std::strerror(errno);
      std::remove(tmp.c_str());
      return false;
    }
    return true;
  }
  // Whether save_text(path) can create its file: checked before a long run,
  // so that a bad path fails at once rather than after all the work.
  static bool can_save(const std::string& path, std::string* err) {
    const std::string tmp = path + ".tmp";
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) {
      *err = cannot_write(tmp);
      return false;
    }
    f.close();
    std::remove(tmp.c_str());
    return true;
  }

 private:
  static std::string cannot_write(const std::string& tmp) { return "cannot write " + tmp + ": " + std::strerror(errno); }
  double w_, h_;
  std::string body_;
};

// ---- line chart --------------------------------------------------------------
struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y) in data units
  std::string color = "#1f77b4";
  std::string dash;       // "" solid, e.g. "6,4"
  bool markers = true;
};

struct LineChart {
  std::string title, subtitle, xlabel, ylabel;
  double xmin = 0, xmax = 1, ymin = 0, ymax = 1;
  std::vector<Series> series;
  std::string x_suffix;  // tick label suffix, e.g. "%"
};

inline std::string render(const LineChart& c) {
  const double W = 760, H = 480, L = 80, R = 200, T = 64, B = 64;
  const double pw = W - L - R, ph = H - T - B;
  Document d(W, H);
  d.text(W / 2, 28, c.title, 17, "middle", "#111", true);
  if (!c.subtitle.empty()) d.text(W / 2, 48, c.subtitle, 12, "middle", "#555");
  const double xr = c.xmax > c.xmin ? c.xmax - c.xmin : 1, yr = c.ymax > c.ymin ? c.ymax - c.ymin : 1;
  auto X = [&](double x) { return L + (std::clamp(x, c.xmin, c.xmax) - c.xmin) / xr * pw; };
  auto Y = [&](double y) { return T + ph - (std::clamp(y, c.ymin, c.ymax) - c.ymin) / yr * ph; };
  d.rect(L, T, pw, ph, "#fafafa", "#999");
  for (int i = 0; i <= 5; i++) {
    const double yv = c.ymin + yr * i / 5, xv = c.xmin + xr * i / 5;
    d.line(L, Y(yv), L + pw, Y(yv), "#ddd");
    d.text(L - 8, Y(yv) + 4, num(yv), 11, "end", "#444");
    d.line(X(xv), T + ph, X(xv), T + ph + 5, "#666");
    char b[32];
    std::snprintf(b, sizeof b, "%g", std::round(xv * 10) / 10);
    d.text(X(xv), T + ph + 20, std::string(b) + c.x_suffix, 11, "middle", "#444");
  }
  d.text(L + pw / 2, H - 18, c.xlabel, 13, "middle", "#222");
  d.text(22, T + ph / 2, c.ylabel, 13, "middle", "#222", false, -90);
  double ly = T + 10;
  for (const auto& s : c.series) {
    std::vector<std::pair<double, double>> pts;
    for (auto& [x, y] : s.points)
      if (std::isfinite(x) && std::isfinite(y)) pts.emplace_back(X(x), Y(y));
    d.polyline(pts, s.color, 2.5, s.dash);
    if (s.markers)
      for (auto& [x, y] : pts) d.circle(x, y, 4, s.color);
    d.line(L + pw + 16, ly, L + pw + 44, ly, s.color, 2.5, s.dash);
    d.text(L + pw + 50, ly + 4, s.name, 12, "start", "#222");
    ly += 22;
  }
  return d.str();
}

// ---- ratio chart ---------------------------------------------------------------
struct RatioRow {
  std::string label;   // the metric
  std::string detail;  // e.g. "6.38 GB/s vs kv.gather_write_gbps 7.39"
  double ratio = NAN;  // metric against its baseline, oriented so that more is better
  double target = NAN; // the target as a ratio (NaN: none)
};

inline std::string render(const std::string& title, const std::string& subtitle, const std::vector<RatioRow>& rows) {
  const double W = 1240, L = 340, R = 470, T = 76, row_h = 30;
  const double H = T + row_h * double(std::max<size_t>(rows.size(), 1)) + 70, pw = W - L - R;
  double lo = 0.5, hi = 2;
  for (auto& r : rows)
    for (double v : {r.ratio, r.target})
      if (std::isfinite(v) && v > 0) lo = std::min(lo, v), hi = std::max(hi, v);
  const double l0 = std::floor(std::log10(lo)), l1 = std::ceil(std::log10(hi));
  auto X = [&](double v) { return L + (std::log10(std::clamp(v, std::pow(10.0, l0), std::pow(10.0, l1))) - l0) / (l1 - l0) * pw; };
  Document d(W, H);
  d.text(W / 2, 28, title, 17, "middle", "#111", true);
  d.text(W / 2, 48, subtitle, 12, "middle", "#555");
  const double bottom = T + row_h * double(rows.size());
  for (double e = l0; e <= l1; e += 1) {
    for (int m = 1; m < 10; m++) {
      const double v = std::pow(10.0, e) * m;
      if (v > std::pow(10.0, l1)) break;
      d.line(X(v), T - 6, X(v), bottom, m == 1 ? "#ccc" : "#eee");
    }
    char b[32];
    std::snprintf(b, sizeof b, "%g\xc3\x97", std::pow(10.0, e));
    d.text(X(std::pow(10.0, e)), bottom + 18, b, 11, "middle", "#444");
  }
  d.line(X(1), T - 10, X(1), bottom, "#333", 1.5);
  d.text(X(1), T - 14, "baseline (same run)", 11, "middle", "#333");
  for (size_t i = 0; i < rows.size(); i++) {
    const RatioRow& r = rows[i];
    const double y = T + row_h * double(i);
    if (i % 2) d.rect(8, y, W - 16, row_h, "#f6f6f6");
    d.text(L - 10, y + 19, r.label, 12, "end", "#222");
    const bool has_t = std::isfinite(r.target) && r.target > 0;
    const bool met = has_t && std::isfinite(r.ratio) && r.ratio >= r.target * (1 - 1e-9);
    const std::string color = !has_t ? "#8c8c8c" : met ? "#2ca02c" : "#d62728";
    if (std::isfinite(r.ratio) && r.ratio > 0) {
      const double x0 = X(1), x1 = X(r.ratio);
      d.rect(std::min(x0, x1), y + 7, std::fabs(x1 - x0) < 1.5 ? 1.5 : std::fabs(x1 - x0), row_h - 14, color);
    }
    if (has_t) {
      d.line(X(r.target), y + 3, X(r.target), y + row_h - 3, "#000", 2.5);
    }
    char b[96];
    auto times = [&](double v) {  // 4 digits below 10x: 0.9998x must not read as 1x
      std::snprintf(b, sizeof b, v < 10 ? "%.4g\xc3\x97" : "%.3g\xc3\x97", v);
      return std::string(b);
    };
    std::string v = std::isfinite(r.ratio) ? times(r.ratio) : "n/a";
    if (has_t) {
      v += "  target \xe2\x89\xa5 " + times(r.target) + (met ? "  met" : "  missed");
    }
    d.text(L + pw + 10, y + 14, v, 12, "start", color == "#8c8c8c" ? "#444" : color, true);
    d.text(L + pw + 10, y + 26, r.detail, 9, "start", "#666");
  }
  const double ly = bottom + 42;
  d.rect(L, ly - 9, 14, 10, "#2ca02c");
  d.text(L + 20, ly, "target met", 11);
  d.rect(L + 110, ly - 9, 14, 10, "#d62728");
  d.text(L + 130, ly, "target missed", 11);
  d.rect(L + 240, ly - 9, 14, 10, "#8c8c8c");
  d.text(L + 260, ly, "no target", 11);
  d.line(L + 350, ly - 10, L + 350, ly + 2, "#000", 2.5);
  d.text(L + 358, ly, "target", 11);
  return d.str();
}

}  // namespace cxlkv::svg
