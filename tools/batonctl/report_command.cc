// `batonctl report`: turns the JSON outputs of `batonctl simulate`, `batonctl replay` and the
// approximation-error check into DIR/report.md with PNG plots drawn by gnuplot.
//
// An input is recognised by its keys: {"kind": "replay", ...}, {"kind": "approx_error", ...},
// or {"results": [...]} with or without "kind": "simulate". Each input gets its own section,
// in the order given. The plots of input n are "<n>-<kind>-<plot>.png"; the gnuplot script of
// each is kept beside it ("<same name>.gp") so that a plot can be redrawn or restyled by hand.
//
// Exit status 2 for an input that cannot be read, is not JSON, has an unknown shape or lacks a
// field (the message names the file and the field); 1 when gnuplot is missing or fails.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "commands.h"
#include "nlohmann/json.hpp"

extern char** environ;

namespace baton::tools {
namespace {

using nlohmann::json;

struct ReportOptions {
  std::string out;
  std::vector<std::string> inputs;
  std::string gnuplot = "gnuplot";
};

// One plot: the PNG's file name and the gnuplot commands that draw it (terminal and output
// are added when it is drawn).
struct Plot {
  std::string file;
  std::string commands;
};

// A section of report.md and the plots it shows.
struct Section {
  std::string markdown;
  std::vector<Plot> plots;
};

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Field access with errors that name the file and the path of the field.
class Fields {
 public:
  explicit Fields(std::string file) : file_(std::move(file)) {}

  absl::Status Error(absl::string_view path, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(file_, ": ", path, ": ", what));
  }
  absl::StatusOr<double> Number(const json& object, absl::string_view where,
                                const char* key) const {
    auto it = object.find(key);
    if (it == object.end() || !it->is_number()) {
      return Error(absl::StrCat(where, key),
                   it == object.end() ? "missing; expected a number"
                                      : absl::StrCat("expected a number, got ", it->dump()));
    }
    return it->get<double>();
  }
  absl::StatusOr<std::string> String(const json& object, absl::string_view where,
                                     const char* key) const {
    auto it = object.find(key);
    if (it == object.end() || !it->is_string()) {
      return Error(absl::StrCat(where, key), "missing or not a string");
    }
    return it->get<std::string>();
  }
  absl::StatusOr<const json*> Array(const json& object, absl::string_view where,
                                    const char* key) const {
    auto it = object.find(key);
    if (it == object.end() || !it->is_array()) {
      return Error(absl::StrCat(where, key), "missing or not an array");
    }
    return &*it;
  }
  // Each item of an array must be an object.
  absl::Status Objects(const json& array, absl::string_view path) const {
    for (size_t i = 0; i < array.size(); ++i) {
      if (!array[i].is_object()) {
        return Error(absl::StrCat(path, "[", i, "]"), "expected an object");
      }
    }
    return absl::OkStatus();
  }
  const std::string& file() const { return file_; }

 private:
  std::string file_;
};

// A table cell: "-" for missing or null; integers as they are; other numbers to 4 digits.
std::string Cell(const json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return "-";
  if (it->is_number_integer()) return it->dump();
  if (it->is_number()) return absl::StrFormat("%.4g", it->get<double>());
  if (it->is_string()) return it->get<std::string>();
  if (it->is_boolean()) return it->get<bool>() ? "yes" : "no";
  return it->dump();
}

std::string GiBCell(const json& object, const char* key, const char* null_text) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return null_text;
  if (!it->is_number()) return it->dump();
  return absl::StrFormat("%.3f", it->get<double>() / kGiB);
}

std::string Table(const std::vector<std::string>& headers,
                  const std::vector<std::vector<std::string>>& rows) {
  std::string out = absl::StrCat("| ", absl::StrJoin(headers, " | "), " |\n|");
  for (size_t i = 0; i < headers.size(); ++i) out += " --- |";
  out += "\n";
  for (const auto& row : rows) absl::StrAppend(&out, "| ", absl::StrJoin(row, " | "), " |\n");
  return out;
}

// A gnuplot single-quoted string ('' stands for a quote inside one).
std::string Quoted(absl::string_view text) {
  return absl::StrCat("'", absl::StrReplaceAll(text, {{"'", "''"}}), "'");
}

// A gnuplot datablock named $name holding "x y" rows.
std::string DataBlock(const std::string& name, const std::vector<std::pair<double, double>>& xy) {
  std::string out = absl::StrCat("$", name, " << EOD\n");
  for (const auto& [x, y] : xy) absl::StrAppendFormat(&out, "%.10g %.10g\n", x, y);
  return out + "EOD\n";
}

std::string PlotName(size_t input, absl::string_view kind, absl::string_view plot) {
  return absl::StrCat(input, "-", kind, "-", plot, ".png");
}

// ---- simulate ----

// One simulate result: its store budget and token hit ratio.
struct BudgetPoint {
  std::optional<double> budget_gib;  // nullopt: unlimited
  double hit_ratio;
};

// gnuplot commands of the hit ratio against the store budget, a line per group (block size,
// keep, hit cap), on a log x axis when the budgets differ.
std::string HitRatioPlot(std::map<std::string, std::vector<BudgetPoint>>& groups,
                         const std::vector<std::string>& order, std::optional<double> min_budget,
                         std::optional<double> max_budget) {
  // Unlimited points sit at the right edge, one doubling past the largest budget, under a
  // tick labelled "unlimited".
  const double unlimited_x = max_budget ? *max_budget * 2 : 1.0;
  std::string commands =
      "set title 'Hit ratio against store budget'\n"
      "set xlabel 'store budget (GiB)'\nset ylabel 'token hit ratio'\n"
      "set yrange [0:*]\nset offsets 0, 0, graph 0.05, 0\nset grid\nset key outside right\n";
  if (min_budget && *min_budget > 0 && *max_budget > *min_budget) {
    commands += "set logscale x 2\n";
    absl::StrAppendFormat(&commands, "set xrange [%.10g:%.10g]\n", *min_budget / 1.5,
                          unlimited_x * 1.5);
  } else {
    absl::StrAppendFormat(&commands, "set xrange [%.10g:%.10g]\n", 0.0, unlimited_x * 1.25);
  }
  absl::StrAppendFormat(&commands, "set xtics add ('unlimited' %.10g)\n", unlimited_x);
  // Finite budgets as a line; the unlimited point in the same colour, unconnected, as its x
  // position is only a place on the axis.
  std::vector<std::string> plot_items;
  for (size_t g = 0; g < order.size(); ++g) {
    std::vector<std::pair<double, double>> finite, unlimited;
    for (const BudgetPoint& p : groups[order[g]]) {
      (p.budget_gib ? finite : unlimited)
          .emplace_back(p.budget_gib.value_or(unlimited_x), p.hit_ratio);
    }
    std::sort(finite.begin(), finite.end());
    std::string title = absl::StrCat(" title ", Quoted(order[g]));
    if (!finite.empty()) {
      commands += DataBlock(absl::StrCat("g", g), finite);
      plot_items.push_back(
          absl::StrCat("$g", g, " using 1:2 with linespoints pt 7 lc ", g + 1, title));
      title = " notitle";
    }
    if (!unlimited.empty()) {
      commands += DataBlock(absl::StrCat("u", g), unlimited);
      plot_items.push_back(
          absl::StrCat("$u", g, " using 1:2 with points pt 9 ps 1.5 lc ", g + 1, title));
    }
  }
  commands += "plot " + absl::StrJoin(plot_items, ", \\\n     ") + "\n";
  return commands;
}

absl::StatusOr<Section> SimulateSection(const json& doc, const Fields& f, size_t input) {
  absl::StatusOr<const json*> results = f.Array(doc, "", "results");
  if (!results.ok()) return results.status();
  if ((*results)->empty()) return f.Error("results", "empty; nothing to report");
  if (absl::Status s = f.Objects(**results, "results"); !s.ok()) return s;

  // One line per (block_size, keep, hit_cap), with window and max_backtrack when they vary.
  bool window_varies = false, backtrack_varies = false;
  for (const json& r : **results) {
    window_varies |= Cell(r, "window") != Cell((**results)[0], "window");
    backtrack_varies |= Cell(r, "max_backtrack") != Cell((**results)[0], "max_backtrack");
  }
  std::map<std::string, std::vector<BudgetPoint>> groups;
  std::vector<std::string> order;
  std::vector<std::vector<std::string>> rows;
  std::optional<double> min_budget, max_budget;
  for (size_t i = 0; i < (*results)->size(); ++i) {
    const json& r = (**results)[i];
    const std::string where = absl::StrCat("results[", i, "].");
    absl::StatusOr<double> block = f.Number(r, where, "block_size");
    if (!block.ok()) return block.status();
    absl::StatusOr<double> keep = f.Number(r, where, "keep");
    if (!keep.ok()) return keep.status();
    absl::StatusOr<std::string> cap = f.String(r, where, "hit_cap");
    if (!cap.ok()) return cap.status();
    absl::StatusOr<double> ratio = f.Number(r, where, "token_hit_ratio");
    if (!ratio.ok()) return ratio.status();
    BudgetPoint point{.budget_gib = std::nullopt, .hit_ratio = *ratio};
    if (auto it = r.find("store_budget"); it != r.end() && !it->is_null()) {
      if (!it->is_number()) {
        return f.Error(absl::StrCat(where, "store_budget"), "expected bytes or null (unlimited)");
      }
      point.budget_gib = it->get<double>() / kGiB;
      min_budget = std::min(min_budget.value_or(*point.budget_gib), *point.budget_gib);
      max_budget = std::max(max_budget.value_or(*point.budget_gib), *point.budget_gib);
    }
    std::string label = absl::StrFormat("B=%d K=%d %s", static_cast<int64_t>(*block),
                                        static_cast<int64_t>(*keep), *cap);
    if (window_varies) absl::StrAppend(&label, " W=", Cell(r, "window"));
    if (backtrack_varies) absl::StrAppend(&label, " bt=", Cell(r, "max_backtrack"));
    if (groups.find(label) == groups.end()) order.push_back(label);
    groups[label].push_back(point);
    rows.push_back({Cell(r, "block_size"), Cell(r, "keep"), Cell(r, "window"),
                    Cell(r, "max_backtrack"), Cell(r, "hit_cap"),
                    GiBCell(r, "store_budget", "unlimited"), Cell(r, "requests"),
                    Cell(r, "token_hit_ratio"), Cell(r, "request_hit_ratio"),
                    Cell(r, "evicted_blocks"), GiBCell(r, "stored_bytes_peak", "-"),
                    Cell(r, "flops_vs_no_cache"), Cell(r, "flops_vs_uncapped")});
  }

  const std::string commands = HitRatioPlot(groups, order, min_budget, max_budget);

  Section section;
  const std::string png = PlotName(input, "simulate", "hit-ratio");
  section.plots.push_back({png, commands});
  section.markdown = absl::StrCat(
      "## Simulate: `", f.file(), "`\n\n", (*results)->size(),
      " settings. Hit ratio against store budget (one line per block size, keep and hit cap; "
      "an unlimited store is drawn at the right edge, at the tick labelled \"unlimited\"):\n\n"
      "![Hit ratio against store budget](",
      png, ")\n\n",
      Table({"block", "keep", "window", "max_backtrack", "hit_cap", "budget (GiB)", "requests",
             "token_hit_ratio", "request_hit_ratio", "evicted_blocks", "peak (GiB)",
             "flops_vs_no_cache", "flops_vs_uncapped"},
            rows),
      "\n");
  return section;
}

// ---- replay ----

// The requests' TTFT in ten bins of their cached fraction: a table row per bin (count, mean,
// median) and each bin's mean at its middle.
void BinByCachedFraction(const std::vector<std::pair<double, double>>& points,
                         std::vector<std::vector<std::string>>& bin_rows,
                         std::vector<std::pair<double, double>>& means) {
  constexpr int kBins = 10;
  std::vector<std::vector<double>> bins(kBins);
  for (const auto& [fraction, ttft] : points) {
    bins[std::clamp(static_cast<int>(fraction * kBins), 0, kBins - 1)].push_back(ttft);
  }
  for (int b = 0; b < kBins; ++b) {
    std::vector<double>& v = bins[b];
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    double sum = 0;
    for (double x : v) sum += x;
    const double mean = sum / static_cast<double>(v.size());
    means.emplace_back((b + 0.5) / kBins, mean);
    bin_rows.push_back(
        {absl::StrFormat("[%.1f, %.1f%s", b / 10.0, (b + 1) / 10.0, b == kBins - 1 ? "]" : ")"),
         absl::StrCat(v.size()), absl::StrFormat("%.4g", mean),
         absl::StrFormat("%.4g", v[v.size() / 2])});
  }
}

absl::StatusOr<Section> ReplaySection(const json& doc, const Fields& f, size_t input) {
  absl::StatusOr<double> requests = f.Number(doc, "", "requests");
  if (!requests.ok()) return requests.status();
  absl::StatusOr<const json*> per_request = f.Array(doc, "", "per_request");
  if (!per_request.ok()) return per_request.status();
  if (absl::Status s = f.Objects(**per_request, "per_request"); !s.ok()) return s;

  const auto percentile = [&doc](const char* group, const char* p) -> std::string {
    auto it = doc.find(group);
    return it != doc.end() && it->is_object() ? Cell(*it, p) : "-";
  };
  std::vector<std::vector<std::string>> summary = {
      {"requests", Cell(doc, "requests")},
      {"errors", Cell(doc, "errors")},
      {"request_hit_rate", Cell(doc, "request_hit_rate")},
      {"token_hit_rate", Cell(doc, "token_hit_rate")},
      {"cached_tokens", Cell(doc, "cached_tokens")},
      {"replayed_rows", Cell(doc, "replayed_rows")},
      {"output_tokens_per_s", Cell(doc, "output_tokens_per_s")}};
  for (const char* group : {"ttft_ms", "itl_ms"}) {
    for (const char* p : {"p50", "p90", "p99"}) {
      summary.push_back({absl::StrCat(group, " ", p), percentile(group, p)});
    }
  }

  // Successful requests: (cached fraction, TTFT), and ten bins of the fraction.
  std::vector<std::pair<double, double>> points;
  for (size_t i = 0; i < (*per_request)->size(); ++i) {
    const json& r = (**per_request)[i];
    const std::string where = absl::StrCat("per_request[", i, "].");
    if (auto ok = r.find("ok"); ok != r.end() && ok->is_boolean() && !ok->get<bool>()) continue;
    absl::StatusOr<double> prompt = f.Number(r, where, "prompt_tokens");
    if (!prompt.ok()) return prompt.status();
    absl::StatusOr<double> cached = f.Number(r, where, "cached_tokens");
    if (!cached.ok()) return cached.status();
    absl::StatusOr<double> ttft = f.Number(r, where, "ttft_ms");
    if (!ttft.ok()) return ttft.status();
    if (*prompt <= 0) continue;
    points.emplace_back(*cached / *prompt, *ttft);
  }
  std::vector<std::vector<std::string>> bin_rows;
  std::vector<std::pair<double, double>> means;
  BinByCachedFraction(points, bin_rows, means);

  Section section;
  section.markdown =
      absl::StrCat("## Replay: `", f.file(), "`\n\n", Table({"metric", "value"}, summary), "\n");
  if (points.empty()) {
    absl::StrAppend(&section.markdown,
                    "No successful request with prompt tokens: no TTFT plot.\n\n");
    return section;
  }
  const std::string png = PlotName(input, "replay", "ttft");
  std::string commands =
      "set title 'TTFT against cached fraction'\n"
      "set xlabel 'cached tokens / prompt tokens'\nset ylabel 'TTFT (ms)'\n"
      "set xrange [-0.02:1.02]\nset yrange [0:*]\nset offsets 0, 0, graph 0.05, 0\n"
      "set grid\nset key top right\n";
  commands += DataBlock("requests", points) + DataBlock("bins", means);
  commands +=
      "plot $requests using 1:2 with points pt 7 ps 0.6 lc rgb '#8080c0' title 'request', \\\n"
      "     $bins using 1:2 with linespoints pt 5 lw 2 lc rgb '#c03030' title 'bin mean'\n";
  section.plots.push_back({png, commands});
  absl::StrAppend(
      &section.markdown, "TTFT against the cached fraction of the prompt (", points.size(),
      " successful requests; bins of 0.1):\n\n", "![TTFT against cached fraction](", png, ")\n\n",
      Table({"cached fraction", "requests", "mean TTFT (ms)", "p50 TTFT (ms)"}, bin_rows), "\n");
  return section;
}

// ---- approximation error ----

// One approximation-error result: its keep and errors.
struct ErrorPoint {
  double keep, kl_mean, max_abs;
};

// Per-step KL against the querying row's distance from the retained region's edge, as the
// curve of the run's label and K: step i predicts position L + i from the row at L - 1 + i,
// which lies K - 1 + i past L - K. One mode only (the first listed: `edge_mode` says whether
// this run is of it): mask and compact agree on every retained row. Cold runs only: after a
// prefix hit of H > L - K tokens the edge is H, which the input does not give. `edge_min` keeps
// the least positive KL.
absl::Status AddEdgeCurve(
    const json& r, bool edge_mode, const std::string& label, double keep, const Fields& f,
    const std::string& where,
    std::map<std::string, std::vector<std::pair<double, double>>>& edge_curves,
    std::optional<double>& edge_min) {
  const bool cold = !r.contains("prefix_hit_tokens") || r["prefix_hit_tokens"] == 0;
  auto steps = r.find("steps");
  if (!edge_mode || !cold || steps == r.end() || !steps->is_array() || steps->empty()) {
    return absl::OkStatus();
  }
  std::vector<std::pair<double, double>>& curve =
      edge_curves[absl::StrCat(label, " K=", Cell(r, "keep"))];
  for (const json& step : *steps) {
    if (!step.is_object() || !step.contains("step") || !step["step"].is_number() ||
        !step.contains("kl_mean") || !step["kl_mean"].is_number()) {
      return f.Error(absl::StrCat(where, "steps"),
                     "each entry must hold numbers \"step\" and \"kl_mean\"");
    }
    const double kl_step = step["kl_mean"].get<double>();
    curve.emplace_back(keep - 1 + step["step"].get<double>(), kl_step);
    if (kl_step > 0) edge_min = std::min(edge_min.value_or(kl_step), kl_step);
  }
  return absl::OkStatus();
}

// gnuplot commands of the error against K: kl_mean and max_abs_logit_diff per group (mode and
// hit), on a log axis when `log_y` (zeros drawn at `zero_at`, and `zeros` set when there were).
std::string ErrorVsKeepPlot(std::map<std::string, std::vector<ErrorPoint>>& groups,
                            const std::vector<std::string>& order, bool log_y, double zero_at,
                            bool& zeros) {
  std::string commands =
      "set title 'Error against K'\nset xlabel 'keep K'\n"
      "set ylabel 'kl_mean (nats), max |logit diff|'\nset grid\nset key outside right\n";
  commands += log_y ? "set logscale y 10\nset format y '%g'\n" : "set yrange [0:*]\n";
  std::vector<std::string> plot_items;
  for (size_t g = 0; g < order.size(); ++g) {
    std::vector<ErrorPoint>& points = groups[order[g]];
    std::sort(points.begin(), points.end(),
              [](const ErrorPoint& a, const ErrorPoint& b) { return a.keep < b.keep; });
    std::vector<std::pair<double, double>> kl, max_abs;
    for (const ErrorPoint& p : points) {
      zeros |= log_y && (p.kl_mean <= 0 || p.max_abs <= 0);
      kl.emplace_back(p.keep, p.kl_mean > 0 || !log_y ? p.kl_mean : zero_at);
      max_abs.emplace_back(p.keep, p.max_abs > 0 || !log_y ? p.max_abs : zero_at);
    }
    commands += DataBlock(absl::StrCat("kl", g), kl) + DataBlock(absl::StrCat("max", g), max_abs);
    plot_items.push_back(absl::StrCat("$kl", g, " using 1:2 with linespoints pt 7 lc ", g + 1,
                                      " title ", Quoted(absl::StrCat("kl_mean ", order[g]))));
    plot_items.push_back(absl::StrCat("$max", g, " using 1:2 with linespoints pt 5 dt 2 lc ", g + 1,
                                      " title ",
                                      Quoted(absl::StrCat("max_abs_logit_diff ", order[g]))));
  }
  commands += "plot " + absl::StrJoin(plot_items, ", \\\n     ") + "\n";
  return commands;
}

// gnuplot commands of the KL per step against the distance from the retained edge, one curve
// per label, on a log axis (exact steps drawn at `floor_at`).
std::string EdgePlot(std::map<std::string, std::vector<std::pair<double, double>>>& edge_curves,
                     double floor_at) {
  std::string edge =
      "set title 'KL against distance from the retained edge'\n"
      "set xlabel 'query row - (L - K)'\nset ylabel 'kl_mean (nats)'\nset grid\n"
      "set key outside right\nset logscale y 10\nset format y '%g'\n";
  std::vector<std::string> items;
  size_t g = 0;
  for (auto& [label, curve] : edge_curves) {
    for (auto& [x, y] : curve) y = y > 0 ? y : floor_at;
    edge += DataBlock(absl::StrCat("edge", g), curve);
    items.push_back(absl::StrCat("$edge", g, " using 1:2 with lines lw 2 lc ", g + 1, " title ",
                                 Quoted(label)));
    ++g;
  }
  edge += "plot " + absl::StrJoin(items, ", \\\n     ") + "\n";
  return edge;
}

absl::StatusOr<Section> ApproxErrorSection(const json& doc, const Fields& f, size_t input) {
  absl::StatusOr<const json*> results = f.Array(doc, "", "results");
  if (!results.ok()) return results.status();
  if ((*results)->empty()) return f.Error("results", "empty; nothing to report");
  if (absl::Status s = f.Objects(**results, "results"); !s.ok()) return s;

  std::map<std::string, std::vector<ErrorPoint>> groups;  // by mode and prefix hit
  std::vector<std::string> order;
  std::vector<std::vector<std::string>> rows;
  std::optional<double> min_positive, max_value;
  std::map<std::string, std::vector<std::pair<double, double>>> edge_curves;
  std::optional<double> edge_min;
  std::string edge_mode;
  for (size_t i = 0; i < (*results)->size(); ++i) {
    const json& r = (**results)[i];
    const std::string where = absl::StrCat("results[", i, "].");
    absl::StatusOr<std::string> mode = f.String(r, where, "mode");
    if (!mode.ok()) return mode.status();
    absl::StatusOr<double> keep = f.Number(r, where, "keep"), kl = f.Number(r, where, "kl_mean"),
                           max_abs = f.Number(r, where, "max_abs_logit_diff");
    for (const absl::StatusOr<double>* field : {&keep, &kl, &max_abs}) {
      if (!field->ok()) return field->status();
    }
    for (double v : {*kl, *max_abs}) {
      if (v > 0) min_positive = std::min(min_positive.value_or(v), v);
      max_value = std::max(max_value.value_or(v), v);
    }
    const std::string label = absl::StrCat(
        *mode, " H=",
        Cell(r, "prefix_hit_tokens") == "-" ? std::string("0") : Cell(r, "prefix_hit_tokens"));
    if (groups.find(label) == groups.end()) order.push_back(label);
    groups[label].push_back({*keep, *kl, *max_abs});
    if (i == 0) edge_mode = *mode;  // the edge curves' (AddEdgeCurve)
    if (absl::Status st =
            AddEdgeCurve(r, *mode == edge_mode, label, *keep, f, where, edge_curves, edge_min);
        !st.ok()) {
      return st;
    }
    rows.push_back({*mode, Cell(r, "keep"), Cell(r, "prefix_hit_tokens"), Cell(r, "kl_mean"),
                    Cell(r, "kl_max"), Cell(r, "top1_agreement"), Cell(r, "max_abs_logit_diff")});
  }

  // A log axis when the positive values span two decades or more; it has no 0, so zeros are
  // drawn a decade below the smallest positive value (and the report says so).
  const bool log_y = min_positive && *max_value / *min_positive >= 100;
  const double zero_at = log_y ? *min_positive / 10 : 0;
  bool zeros = false;
  const std::string commands = ErrorVsKeepPlot(groups, order, log_y, zero_at, zeros);

  Section section;
  const std::string png = PlotName(input, "approx-error", "error-vs-keep");
  section.plots.push_back({png, commands});
  std::string edge_markdown;
  if (!edge_curves.empty()) {
    // Log y; exact steps (KL 0) are drawn a decade below the smallest positive KL.
    const double floor_at = edge_min.value_or(1e-12) / 10;
    const std::string edge_png = PlotName(input, "approx-error", "kl-vs-edge-distance");
    section.plots.push_back({edge_png, EdgePlot(edge_curves, floor_at)});
    edge_markdown = absl::StrFormat(
        "KL per teacher-forced step against the querying row's distance from the retained "
        "region's edge, %s without a prefix hit (log y; exact steps drawn at %.3g):\n\n"
        "![KL against edge distance](%s)\n\n",
        edge_mode, floor_at, edge_png);
  }
  section.markdown = absl::StrCat(
      "## Approximation error: `", f.file(), "`\n\n",
      "Error against K (one colour per mode and prefix hit H; solid: kl_mean, dashed: "
      "max_abs_logit_diff",
      log_y ? "; log y axis" : "",
      zeros ? absl::StrFormat("; zeros are drawn at %.3g, as a log axis has no 0", zero_at) : "",
      "):\n\n![Error against K](", png, ")\n\n",
      Table({"mode", "keep", "prefix_hit_tokens", "kl_mean", "kl_max", "top1_agreement",
             "max_abs_logit_diff"},
            rows),
      "\n", edge_markdown);
  return section;
}

// ---- inputs and gnuplot ----

absl::StatusOr<json> ReadJson(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot be read"));
  std::stringstream text;
  text << in.rdbuf();
  json doc = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON"));
  return doc;
}

absl::StatusOr<Section> SectionFor(const json& doc, const std::string& path, size_t input) {
  const Fields f(path);
  std::string kind;
  if (doc.is_object()) {
    if (auto it = doc.find("kind"); it != doc.end() && it->is_string()) {
      kind = it->get<std::string>();
    } else if (doc.contains("results") && !doc.contains("kind")) {
      kind = "simulate";
    }
  }
  if (kind == "simulate") return SimulateSection(doc, f, input);
  if (kind == "replay") return ReplaySection(doc, f, input);
  if (kind == "approx_error") return ApproxErrorSection(doc, f, input);
  return absl::InvalidArgumentError(absl::StrCat(
      path, ": unknown JSON shape", kind.empty() ? "" : absl::StrCat(" (kind '", kind, "')"),
      "; expected the output of batonctl simulate ({\"results\": [...]}, \"kind\": \"simulate\" "
      "optional), replay (\"kind\": \"replay\") or the approximation-error check (\"kind\": "
      "\"approx_error\")"));
}

// Runs `argv` with stdout and stderr into `log_path`; FAILED_PRECONDITION when it cannot start,
// INTERNAL when it exits non-zero.
absl::Status RunProcess(const std::vector<std::string>& argv, const std::string& log_path) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "gnuplot ('", argv[0], "') cannot be run: ", std::strerror(rc),
        "; install the Debian package gnuplot-nox (scripts/setup.sh does) or pass --gnuplot PATH"));
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  std::ifstream log(log_path);
  std::stringstream text;
  text << log.rdbuf();
  return absl::InternalError(absl::StrCat(absl::StrJoin(argv, " "), " failed: ", text.str()));
}

bool IsPng(const std::string& path) {
  static constexpr unsigned char kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  std::ifstream in(path, std::ios::binary);
  char head[8] = {};
  return in.read(head, 8) && std::memcmp(head, kSignature, 8) == 0;
}

absl::Status Draw(const std::string& gnuplot, const std::string& dir, const Plot& plot) {
  const std::string png = dir + "/" + plot.file;
  const std::string script = png.substr(0, png.size() - 4) + ".gp";
  {
    std::ofstream out(script);
    out << "set terminal pngcairo size 960,600 noenhanced\nset output " << Quoted(png) << "\n"
        << plot.commands << "set output\n";
    if (!out) return absl::InternalError(absl::StrCat(script, ": cannot be written"));
  }
  const std::string log = dir + "/gnuplot.log";
  if (absl::Status s = RunProcess({gnuplot, script}, log); !s.ok()) return s;
  std::filesystem::remove(log);
  if (!IsPng(png)) return absl::InternalError(absl::StrCat("gnuplot wrote no PNG at ", png));
  return absl::OkStatus();
}

int RunReport(const ReportOptions& o) {
  std::vector<Section> sections;
  std::vector<std::string> listed;
  for (size_t i = 0; i < o.inputs.size(); ++i) {
    absl::StatusOr<json> doc = ReadJson(o.inputs[i]);
    if (!doc.ok()) return ReportError("report", doc.status());
    absl::StatusOr<Section> section = SectionFor(*doc, o.inputs[i], i + 1);
    if (!section.ok()) return ReportError("report", section.status());
    sections.push_back(*std::move(section));
    listed.push_back(absl::StrCat("`", o.inputs[i], "`"));
  }
  std::error_code error;
  std::filesystem::create_directories(o.out, error);
  if (error) {
    return ReportError("report", absl::InvalidArgumentError(absl::StrCat(
                                     "--out: ", o.out, " cannot be created: ", error.message())));
  }
  if (absl::Status s = RunProcess({o.gnuplot, "--version"}, o.out + "/gnuplot.log"); !s.ok()) {
    return ReportError("report", s);
  }
  std::string markdown =
      absl::StrCat("# baton report\n\nInputs: ", absl::StrJoin(listed, ", "), ".\n\n");
  for (const Section& section : sections) {
    for (const Plot& plot : section.plots) {
      if (absl::Status s = Draw(o.gnuplot, o.out, plot); !s.ok()) return ReportError("report", s);
    }
    markdown += section.markdown;
  }
  std::filesystem::remove(o.out + "/gnuplot.log");
  const std::string path = o.out + "/report.md";
  std::ofstream out(path);
  out << markdown;
  if (!out) return ReportError("report", absl::InternalError(path + ": cannot be written"));
  std::cout << "wrote " << path << "\n";
  return kExitOk;
}

}  // namespace

Command AddReportCommand(CLI::App& app) {
  auto o = std::make_shared<ReportOptions>();
  CLI::App* command = app.add_subcommand(
      "report", "Turn simulate, replay and approx-error JSON into DIR/report.md with PNG plots");
  command->add_option("--out", o->out, "Folder for report.md and the plots")->required();
  command->add_option("inputs", o->inputs, "JSON outputs of simulate, replay, approx-error")
      ->required();
  command->add_option("--gnuplot", o->gnuplot, "The gnuplot program (default: gnuplot on PATH)");
  return {command, [o] { return RunReport(*o); }};
}

}  // namespace baton::tools
