// Memory profile reports: side-by-side table, per-layer table, JSON, Chrome trace, SVG.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>

#include "remat/error.h"
#include "remat/profile.h"

namespace remat {

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string flops_str(double f) {
  if (f >= 1e12) return fmt("%.2f TFLOP", f / 1e12);
  if (f >= 1e9) return fmt("%.2f GFLOP", f / 1e9);
  if (f >= 1e6) return fmt("%.2f MFLOP", f / 1e6);
  return fmt("%.0f FLOP", f);
}

std::string pad(const std::string& s, size_t w, bool right = true) {
  if (s.size() >= w) return s;
  return right ? std::string(w - s.size(), ' ') + s : s + std::string(w - s.size(), ' ');
}

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<')
      o += "&lt;";
    else if (c == '>')
      o += "&gt;";
    else if (c == '&')
      o += "&amp;";
    else if (c == '"')
      o += "&quot;";
    else
      o += c;
  }
  return o;
}

}  // namespace

// A policy's name in tables and plots, with its precision when not fp32.
namespace {
std::string shown_name(const StepProfile& p) { return p.precision == "fp32" ? p.policy : p.policy + " " + p.precision; }
}  // namespace

std::string profile_table(const std::vector<StepProfile>& ps, const std::vector<StepProfile>* measured) {
  const size_t w0 = 22;
  std::vector<size_t> w;  // per column: 16, or its policy's name and two spaces
  for (const auto& p : ps) w.push_back(std::max<size_t>(16, shown_name(p).size() + 2));
  bool offload = false;  // a host tier to show
  for (const auto& p : ps) offload = offload || p.host_peak_bytes > 0;
  std::string out = pad("", w0, false);
  for (size_t i = 0; i < ps.size(); ++i) out += pad(shown_name(ps[i]), w[i]);
  out += "\n";
  auto row = [&](const std::string& label, auto value) {
    out += pad(label, w0, false);
    for (size_t i = 0; i < ps.size(); ++i) out += pad(value(i), w[i]);
    out += "\n";
  };
  row("peak allocated", [&](size_t i) { return format_bytes(ps[i].peak_bytes); });
  for (int c = 0; c < kNumMemoryCategories; ++c)
    row(std::string("  ") + category_name(static_cast<MemoryCategory>(c)),
        [&](size_t i) { return format_bytes(ps[i].peak_by_category.bytes[static_cast<size_t>(c)]); });
  row("peak reserved", [&](size_t i) { return format_bytes(ps[i].peak_reserved_bytes); });
  if (offload) {
    row("host (pinned) peak", [&](size_t i) { return format_bytes(ps[i].host_peak_bytes); });
    row("  reserved", [&](size_t i) { return format_bytes(ps[i].host_reserved_bytes); });
  }
  row("activation high-water", [&](size_t i) {
    return format_bytes(ps[i].category_peaks.bytes[static_cast<size_t>(MemoryCategory::activation)]);
  });
  row("recomputed layers", [&](size_t i) { return std::to_string(ps[i].recomputed_layers); });
  row("recompute FLOPs", [&](size_t i) { return flops_str(ps[i].recompute_flops); });
  row("  share of step",
      [&](size_t i) { return fmt("%.1f%%", 100.0 * ps[i].recompute_flops / std::max(1.0, ps[i].step_flops())); });
  row("step FLOPs", [&](size_t i) { return flops_str(ps[i].step_flops()); });
  if (measured) {
    row("measured peak", [&](size_t i) { return format_bytes((*measured)[i].peak_bytes); });
    row("  = predicted",
        [&](size_t i) { return std::string((*measured)[i].peak_bytes == ps[i].peak_bytes ? "yes" : "NO"); });
    if (offload) {
      row("measured host peak", [&](size_t i) { return format_bytes((*measured)[i].host_peak_bytes); });
      row("  = predicted", [&](size_t i) {
        return std::string((*measured)[i].host_peak_bytes == ps[i].host_peak_bytes ? "yes" : "NO");
      });
    }
    row("step time", [&](size_t i) { return fmt("%.1f ms", (*measured)[i].step_ms.value_or(NAN)); });
  }
  return out;
}

std::string layer_table(const StepProfile& p) {
  std::string out = "policy " + shown_name(p) + ": per layer\n";
  out += pad("layer", 28, false) + pad("type", 14, false) + pad("saved", 12) + pad("plan", 12) + pad("fwd FLOPs", 14) +
         "\n";
  for (const auto& l : p.layers) {
    out += pad(l.name, 28, false) + pad(l.type, 14, false) + pad(format_bytes(l.saved_bytes), 12) +
           pad(!l.keep         ? "recompute"
               : l.keep_extras ? "keep"
                               : "rec. extras",
               12) +
           pad(flops_str(l.forward_flops), 14) + "\n";
  }
  return out;
}

nlohmann::json profile_json(const std::vector<StepProfile>& predicted, const std::vector<StepProfile>* measured,
                            const ProfileJsonExtras& extras) {
  nlohmann::json arr = nlohmann::json::array();
  for (size_t i = 0; i < predicted.size(); ++i) {
    const StepProfile& p = predicted[i];
    const StepProfile& shown = measured ? (*measured)[i] : p;
    nlohmann::json cats, highs;
    for (int c = 0; c < kNumMemoryCategories; ++c) {
      cats[category_name(static_cast<MemoryCategory>(c))] = shown.peak_by_category.bytes[static_cast<size_t>(c)];
      highs[category_name(static_cast<MemoryCategory>(c))] = shown.category_peaks.bytes[static_cast<size_t>(c)];
    }
    // What each layer recomputes: the bytes its recomputes allocate, and its forward FLOPs
    // once per recompute.
    std::map<std::string, int64_t> rec_bytes;
    for (const auto& e : shown.events)
      if (e.kind == MemoryEvent::Kind::alloc && e.phase == Phase::recompute && e.owner < shown.owners.size())
        rec_bytes[shown.owners[e.owner]] += e.bytes;
    std::map<std::string, int> rec_runs;
    for (const auto& sp : shown.spans)
      if (sp.phase == Phase::recompute && sp.layer >= 0 && static_cast<size_t>(sp.layer) < shown.layer_names.size())
        rec_runs[shown.layer_names[static_cast<size_t>(sp.layer)]]++;
    nlohmann::json layers = nlohmann::json::array();
    for (const auto& l : shown.layers) {
      const double rf = (rec_runs.count(l.name) ? rec_runs[l.name] : 0) * l.forward_flops;
      layers.push_back({{"name", l.name},
                        {"type", l.type},
                        {"kind", l.kind},
                        {"keep", l.keep},
                        {"keep_extras", l.keep_extras},
                        {"saved_bytes", l.saved_bytes},
                        {"forward_flops", l.forward_flops},
                        {"recomputed_bytes", rec_bytes.count(l.name) ? rec_bytes[l.name] : 0},
                        {"recompute_flops", rf},
                        {"recompute_share", rf / std::max(1.0, shown.step_flops())}});
    }
    nlohmann::json pj{
        {"policy", p.policy},
        {"precision", p.precision},
        {"ranks", p.ranks},
        {"shard_optimizer", p.shard_optimizer},
        {"predicted_only", !measured},
        {"device", shown.device.str()},
        {"peak_bytes", shown.peak_bytes},
        {"peak_by_category", cats},
        {"category_peaks", highs},
        {"peak_reserved_bytes", shown.peak_reserved_bytes},
        {"host_peak_bytes", shown.host_peak_bytes},
        {"host_reserved_bytes", shown.host_reserved_bytes},
        {"recomputed_layers", shown.recomputed_layers},
        {"recompute_flops", shown.recompute_flops},
        {"step_flops", shown.step_flops()},
        {"predicted_peak_bytes", p.peak_bytes},
        {"measured_peak_bytes", measured ? nlohmann::json((*measured)[i].peak_bytes) : nlohmann::json(nullptr)},
        {"step_ms",
         measured && (*measured)[i].step_ms ? nlohmann::json(*(*measured)[i].step_ms) : nlohmann::json(nullptr)},
        {"layers", layers}};
    if (p.policy.rfind("budget:", 0) == 0)  // "budget:SIZE[+offload] -> the plan found"
      pj["budget_bytes"] = parse_size(split_offload_suffix(p.policy.substr(0, p.policy.find(' '))).base.substr(7));
    if (!shown.events.empty()) pj["timeline"] = step_timeline_json(shown);
    arr.push_back(pj);
  }
  nlohmann::json out{{"format", "remat-memprof-2"}, {"policies", arr}};
  if (!extras.title.empty()) out["title"] = extras.title;
  if (extras.candidates && extras.front) {
    auto list = [](const std::vector<PlanCandidate>& v) {
      nlohmann::json a = nlohmann::json::array();
      for (const auto& c : v)
        a.push_back({{"name", c.name}, {"peak_bytes", c.peak_bytes}, {"recompute_flops", c.recompute_flops}});
      return a;
    };
    out["pareto"] = {{"candidates", list(*extras.candidates)}, {"front", list(*extras.front)}};
  }
  return out;
}

nlohmann::json chrome_trace(const std::vector<StepProfile>& ps) {
  // Time axis: one microsecond per allocator event (alloc or free), so memory changes and
  // layer spans line up exactly whatever the device.
  nlohmann::json ev = nlohmann::json::array();
  for (size_t k = 0; k < ps.size(); ++k) {
    const StepProfile& p = ps[k];
    const int pid = static_cast<int>(k) + 1;
    ev.push_back(
        {{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", "policy " + shown_name(p)}}}});
    ev.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 1}, {"args", {{"name", "layers"}}}});
    CategoryCounts cur;  // relative to the start of the step
    for (const auto& e : p.events) {
      if (e.kind != MemoryEvent::Kind::alloc && e.kind != MemoryEvent::Kind::free) continue;
      cur[e.category] += e.kind == MemoryEvent::Kind::alloc ? e.bytes : -e.bytes;
      nlohmann::json args;
      for (int c = 0; c < kNumMemoryCategories; ++c)
        args[category_name(static_cast<MemoryCategory>(c))] = cur.bytes[static_cast<size_t>(c)];
      ev.push_back({{"name", "memory"}, {"ph", "C"}, {"pid", pid}, {"ts", e.seq}, {"args", args}});
    }
    for (const auto& s : p.spans) {
      const std::string name = s.layer >= 0 && static_cast<size_t>(s.layer) < p.layer_names.size()
                                   ? p.layer_names[static_cast<size_t>(s.layer)]
                                   : "?";
      ev.push_back({{"name", name},
                    {"cat", phase_name(s.phase)},
                    {"ph", "X"},
                    {"pid", pid},
                    {"tid", 1},
                    {"ts", s.begin},
                    {"dur", std::max<uint64_t>(1, s.end - s.begin)}});
    }
  }
  return {{"traceEvents", ev},
          {"displayTimeUnit", "ns"},
          {"otherData", {{"time_axis", "1 us = one allocator event (alloc or free)"}}}};
}

namespace {

// Round ticks for [lo, hi] in units of `unit`: steps of 1, 2 or 5 times a power of ten,
// about `want` of them.
std::vector<double> nice_ticks(double lo, double hi, double unit, int want) {
  const double span = std::max((hi - lo) / unit, 1e-12);
  const double raw = span / want, mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) {
      step = m * mag;
      break;
    }
  std::vector<double> t;
  for (double v = std::ceil(lo / unit / step) * step; v <= hi / unit + 1e-9; v += step) t.push_back(v * unit);
  return t;
}

std::string tick_label(double v, double unit, const char* name) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%g %s", std::round(v / unit * 1000.0) / 1000.0, name);
  return buf;
}

}  // namespace

// Allocated memory over one step, one line per policy: round ticks in binary units on the
// memory axis and in percent of the step's allocator events; twelve colours, then dashed;
// each policy's peak marked, its value in the legend and beside the mark where the label
// does not collide; long policy names shortened in the legend (in full in its tooltip).
std::string memory_svg(const std::vector<StepProfile>& ps, const std::string& title) {
  const double W = 980, L = 80, R = 290, T = 40, B = 50;
  const double H = std::max(480.0, T + 20.0 * static_cast<double>(ps.size()) + 40 + B);
  int64_t ymax = 1;
  for (const auto& p : ps) ymax = std::max(ymax, p.peak_bytes);
  const double unit = ymax >= (int64_t{1} << 30) ? 1073741824.0 : ymax >= (1 << 20) ? 1048576.0 : 1024.0;
  const char* uname = unit == 1073741824.0 ? "GiB" : unit == 1048576.0 ? "MiB" : "KiB";
  std::vector<double> yt = nice_ticks(0.0, static_cast<double>(ymax), unit, 5);
  const double ystep = yt.size() > 1 ? yt[1] - yt[0] : unit;
  const double ytop = std::max(ystep, std::ceil(static_cast<double>(ymax) / ystep) * ystep);
  yt = nice_ticks(0.0, ytop, unit, 5);
  const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
                          "#e377c2", "#17becf", "#7f7f7f", "#bcbd22", "#393b79", "#ad494a"};
  auto num = [](double v) { return fmt("%.1f", v); };
  std::string s =
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(W) + "\" height=\"" + num(H) +
      "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += "<text x=\"" + num((W - R + L) / 2) + "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" +
       xml_escape(title) + "</text>\n";
  const double pw = W - L - R, ph = 480 - T - B;
  auto Y = [&](double b) { return T + ph - ph * b / ytop; };
  for (double v : yt)
    s += "<line x1=\"" + num(L - 4) + "\" y1=\"" + num(Y(v)) + "\" x2=\"" + num(L + pw) + "\" y2=\"" + num(Y(v)) +
         "\" stroke=\"#e5e5e5\"/>\n<text x=\"" + num(L - 8) + "\" y=\"" + num(Y(v) + 4) +
         "\" text-anchor=\"end\" class=\"tick\">" + tick_label(v, unit, uname) + "</text>\n";
  for (int k = 0; k <= 4; ++k) {
    const double x = L + pw * k / 4.0;
    s += "<line x1=\"" + num(x) + "\" y1=\"" + num(T + ph) + "\" x2=\"" + num(x) + "\" y2=\"" + num(T + ph + 4) +
         "\" stroke=\"black\"/>\n<text x=\"" + num(x) + "\" y=\"" + num(T + ph + 17) +
         "\" text-anchor=\"middle\" class=\"tick\">" + std::to_string(25 * k) + "%</text>\n";
  }
  s += "<line x1=\"" + num(L) + "\" y1=\"" + num(T + ph) + "\" x2=\"" + num(L + pw) + "\" y2=\"" + num(T + ph) +
       "\" stroke=\"black\"/>\n<line x1=\"" + num(L) + "\" y1=\"" + num(T) + "\" x2=\"" + num(L) + "\" y2=\"" +
       num(T + ph) + "\" stroke=\"black\"/>\n";
  s += "<text x=\"" + num(L + pw / 2) + "\" y=\"" + num(T + ph + 38) +
       "\" text-anchor=\"middle\">progress through the training step (share of its allocator events)</text>\n";
  struct Box {
    double x, y, w;
  };
  std::vector<Box> placed;
  for (size_t k = 0; k < ps.size(); ++k) {
    const StepProfile& p = ps[k];
    const std::string col = colors[k % 12];
    const std::string dash = k >= 12 ? " stroke-dasharray=\"6 3\"" : "";
    std::string pts;
    size_t n = 0;
    for (const auto& e : p.events) n += e.kind == MemoryEvent::Kind::alloc || e.kind == MemoryEvent::Kind::free;
    size_t i = 0;
    double peak_x = L, peak_y = T + ph;
    int64_t peak = -1;
    const size_t stride = std::max<size_t>(1, n / 4000);  // keep files small
    for (const auto& e : p.events) {
      if (e.kind != MemoryEvent::Kind::alloc && e.kind != MemoryEvent::Kind::free) continue;
      const int64_t a = e.allocated_after - p.base_bytes;
      const double x = L + pw * static_cast<double>(i) / static_cast<double>(std::max<size_t>(1, n - 1));
      const double y = Y(static_cast<double>(a));
      if (a > peak) {
        peak = a;
        peak_x = x;
        peak_y = y;
      }
      if (i % stride == 0 || i + 1 == n) pts += num(x) + "," + num(y) + " ";
      ++i;
    }
    s += "<polyline fill=\"none\" stroke=\"" + col + "\" stroke-width=\"1.5\"" + dash + " points=\"" + pts + "\"/>\n";
    s += "<circle cx=\"" + num(peak_x) + "\" cy=\"" + num(peak_y) + "\" r=\"4\" fill=\"" + col + "\"/>\n";
    const std::string label = "peak " + format_bytes(p.peak_bytes);
    const double w = 7.0 * static_cast<double>(label.size()), lx = std::min(peak_x + 6, L + pw - w), ly = peak_y - 6;
    bool free = ly > T;
    for (const Box& b : placed) free = free && (std::fabs(b.y - ly) >= 14 || lx + w < b.x || lx > b.x + b.w);
    if (free) {
      placed.push_back({lx, ly, w});
      s += "<text x=\"" + num(lx) + "\" y=\"" + num(ly) + "\" fill=\"" + col + "\" class=\"label\">" + label +
           "</text>\n";
    }
    std::string name = shown_name(p);
    const std::string full = name;
    if (name.size() > 26) name = name.substr(0, 25) + "\u2026";
    const double ly2 = T + 10 + 20.0 * static_cast<double>(k);
    s += "<g><title>" + xml_escape(full) + "</title><line x1=\"" + num(L + pw + 15) + "\" y1=\"" + num(ly2) +
         "\" x2=\"" + num(L + pw + 40) + "\" y2=\"" + num(ly2) + "\" stroke=\"" + col + "\" stroke-width=\"3\"" + dash +
         "/>\n<text x=\"" + num(L + pw + 46) + "\" y=\"" + num(ly2 + 4) + "\" class=\"legend\">" + xml_escape(name) +
         "  " + format_bytes(p.peak_bytes) + "</text></g>\n";
  }
  return s + "</svg>\n";
}

// Peak memory against recompute FLOPs: every candidate grey, the Pareto front red and
// joined, labels on front points only where they do not collide, axes with round ticks
// in binary units and FLOPs. The FLOP axis ends a little above the front's highest point;
// candidates above it are drawn as triangles on the top edge and counted in a note.
std::string pareto_svg(const std::vector<PlanCandidate>& all, const std::vector<PlanCandidate>& front,
                       const std::string& title) {
  const double W = 860, H = 520, L = 90, R = 40, T = 56, B = 60;
  const double pw = W - L - R, ph = H - T - B;
  int64_t xlo = INT64_MAX, xhi = 1;
  double yhi = 0;
  for (const auto& c : all) xlo = std::min(xlo, c.peak_bytes), xhi = std::max(xhi, c.peak_bytes);
  for (const auto& c : front) yhi = std::max(yhi, c.recompute_flops);
  if (all.empty()) xlo = 0;
  yhi = yhi > 0 ? yhi * 1.12 : 1.0;
  const double xunit = xhi >= (int64_t{1} << 30) ? 1073741824.0 : xhi >= (1 << 20) ? 1048576.0 : 1024.0;
  const char* xname = xunit == 1073741824.0 ? "GiB" : xunit == 1048576.0 ? "MiB" : "KiB";
  const double yunit = yhi >= 1e12 ? 1e12 : yhi >= 1e9 ? 1e9 : yhi >= 1e6 ? 1e6 : 1.0;
  const char* yname = yunit == 1e12 ? "TFLOP" : yunit == 1e9 ? "GFLOP" : yunit == 1e6 ? "MFLOP" : "FLOP";
  // x from a round value below the smallest peak, so the candidates spread over the plot.
  std::vector<double> xt = nice_ticks(static_cast<double>(xlo), static_cast<double>(xhi), xunit, 6);
  const double xstep = xt.size() > 1 ? xt[1] - xt[0] : xunit;
  const double x0 = std::floor(static_cast<double>(xlo) / xstep) * xstep;
  const double x1 = std::max(x0 + xstep, std::ceil(static_cast<double>(xhi) / xstep) * xstep);
  xt = nice_ticks(x0, x1, xunit, 6);
  const std::vector<double> yt = nice_ticks(0.0, yhi, yunit, 5);
  auto X = [&](double b) { return L + pw * (b - x0) / (x1 - x0); };
  auto Y = [&](double f) { return T + ph - ph * std::min(f, yhi) / yhi; };
  auto num = [](double v) { return fmt("%.1f", v); };
  std::string s =
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(W) + "\" height=\"" + num(H) +
      "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += "<text x=\"" + num(W / 2) + "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" + xml_escape(title) +
       "</text>\n";
  for (double v : xt)
    s += "<line x1=\"" + num(X(v)) + "\" y1=\"" + num(T) + "\" x2=\"" + num(X(v)) + "\" y2=\"" + num(T + ph) +
         "\" stroke=\"#eee\"/>\n<text x=\"" + num(X(v)) + "\" y=\"" + num(T + ph + 16) +
         "\" text-anchor=\"middle\" class=\"tick\">" + tick_label(v, xunit, xname) + "</text>\n";
  for (double v : yt)
    s += "<line x1=\"" + num(L) + "\" y1=\"" + num(Y(v)) + "\" x2=\"" + num(L + pw) + "\" y2=\"" + num(Y(v)) +
         "\" stroke=\"#eee\"/>\n<text x=\"" + num(L - 6) + "\" y=\"" + num(Y(v) + 4) +
         "\" text-anchor=\"end\" class=\"tick\">" + tick_label(v, yunit, yname) + "</text>\n";
  s += "<line x1=\"" + num(L) + "\" y1=\"" + num(T + ph) + "\" x2=\"" + num(L + pw) + "\" y2=\"" + num(T + ph) +
       "\" stroke=\"black\"/>\n<line x1=\"" + num(L) + "\" y1=\"" + num(T) + "\" x2=\"" + num(L) + "\" y2=\"" +
       num(T + ph) + "\" stroke=\"black\"/>\n";
  s += "<text x=\"" + num(L + pw / 2) + "\" y=\"" + num(H - 14) +
       "\" text-anchor=\"middle\">peak memory of a step</text>\n";
  s += "<text x=\"18\" y=\"" + num(T + ph / 2) + "\" transform=\"rotate(-90 18 " + num(T + ph / 2) +
       ")\" text-anchor=\"middle\">recompute FLOPs per step</text>\n";
  int above = 0;
  for (const auto& c : all) {
    const double cx = X(static_cast<double>(c.peak_bytes));
    if (c.recompute_flops > yhi) {
      ++above;
      s += "<path d=\"M" + num(cx - 4) + " " + num(T + 6) + " L" + num(cx + 4) + " " + num(T + 6) + " L" + num(cx) +
           " " + num(T - 1) + " Z\" fill=\"#999\"/>\n";
    } else {
      s += "<circle cx=\"" + num(cx) + "\" cy=\"" + num(Y(c.recompute_flops)) + "\" r=\"3\" fill=\"#bbb\"/>\n";
    }
  }
  std::string pts, labels;
  struct Box {
    double x, y, w;  // a placed label: left, baseline, width
  };
  std::vector<Box> placed;
  for (const auto& c : front) {
    const double cx = X(static_cast<double>(c.peak_bytes)), cy = Y(c.recompute_flops);
    pts += num(cx) + "," + num(cy) + " ";
    s += "<circle cx=\"" + num(cx) + "\" cy=\"" + num(cy) + "\" r=\"4\" fill=\"#d62728\"/>\n";
    const double w = 7.0 * static_cast<double>(c.name.size()), lx = std::min(cx + 6, L + pw - w), ly = cy - 8;
    bool free = ly > T + 12;
    for (const Box& p : placed) free = free && (std::fabs(p.y - ly) >= 14 || lx + w < p.x || lx > p.x + p.w);
    if (!free) continue;
    placed.push_back({lx, ly, w});
    labels += "<text x=\"" + num(lx) + "\" y=\"" + num(ly) + "\" class=\"label\">" + xml_escape(c.name) + "</text>\n";
  }
  s += "<polyline fill=\"none\" stroke=\"#d62728\" stroke-width=\"1.5\" points=\"" + pts + "\"/>\n" + labels;
  std::string legend = "red: Pareto front (" + std::to_string(front.size()) + " plans, " +
                       std::to_string(placed.size()) + " labelled); grey: the other " +
                       std::to_string(all.size() - std::min(all.size(), front.size())) + " candidates";
  if (above) legend += "; " + std::to_string(above) + " above the chart (triangles)";
  s += "<text x=\"" + num(L) + "\" y=\"42\" font-size=\"11\" fill=\"#555\">" + xml_escape(legend) + "</text>\n";
  return s + "</svg>\n";
}

std::string memory_report(const MemoryStats& s, const std::string& title) {
  std::string out = title + "\n";
  char line[160];
  std::snprintf(line, sizeof line, "  %-16s %14s %8s\n", "category", "at peak", "share");
  out += line;
  for (int c = 0; c < kNumMemoryCategories; ++c) {
    const int64_t b = s.by_category_at_peak.bytes[static_cast<size_t>(c)];
    std::snprintf(line, sizeof line, "  %-16s %14s %7.1f%%\n", category_name(static_cast<MemoryCategory>(c)),
                  format_bytes(b).c_str(),
                  s.peak_allocated ? 100.0 * static_cast<double>(b) / static_cast<double>(s.peak_allocated) : 0.0);
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-16s %14s\n  %-16s %14s\n", "peak allocated",
                format_bytes(s.peak_allocated).c_str(), "peak reserved", format_bytes(s.peak_reserved).c_str());
  out += line;
  return out;
}

}  // namespace remat
