#include "remat/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>

#include "remat/error.h"
#include "remat/io.h"

namespace remat {

namespace {
// A key as a JSON-pointer reference token (RFC 6901): ~ -> ~0, / -> ~1.
std::string escape(const std::string& key) {
  std::string o;
  for (char c : key) o += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
  return o;
}

}  // namespace

// Levenshtein distance (small strings: config keys, option names).
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string nearest_name(const std::string& typo, const std::vector<std::string>& names) {
  std::string best;
  size_t best_d = std::max<size_t>(2, typo.size() / 3) + 1;
  bool unique = false;
  for (const std::string& k : names) {
    if (k == typo) continue;
    const size_t d = edit_distance(typo, k);
    if (d < best_d) {
      best_d = d, best = k, unique = true;
    } else if (d == best_d && k != best) {
      unique = false;
    }
  }
  return unique ? best : std::string();
}

namespace {

std::string show(const nlohmann::json& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}
}  // namespace

ConfigReader::ConfigReader(const nlohmann::json& obj, std::string pointer, std::string source,
                           const std::map<std::string, int64_t>* vars)
    : obj_(obj), pointer_(std::move(pointer)), source_(std::move(source)), vars_(vars) {
  if (!obj_.is_object())
    REMAT_THROW(source_, ": ", pointer_.empty() ? "/" : pointer_, ": expected an object, got ", show(obj_));
}

void ConfigReader::fail(const std::string& key, const std::string& message) const {
  REMAT_THROW(source_, ": ", pointer_, "/", escape(key), ": ", message);
}

bool ConfigReader::has(const std::string& key) const {
  asked_.insert(key);
  return obj_.contains(key);
}

const nlohmann::json& ConfigReader::get(const std::string& key) {
  asked_.insert(key);
  if (!obj_.contains(key)) {
    std::vector<std::string> present;  // a near key the object has is likely this one mistyped
    for (auto it = obj_.begin(); it != obj_.end(); ++it) present.push_back(it.key());
    const std::string near = nearest_name(key, present);
    fail(key, near.empty() ? "missing (required)" : "missing (required; the object has \"" + near + "\": a typo?)");
  }
  used_.insert(key);
  return obj_.at(key);
}

int64_t ConfigReader::as_int(const std::string& key, const nlohmann::json& v, int64_t min, int64_t max,
                             const char* what) {
  int64_t x = 0;
  if (v.is_string() && vars_ && !v.get<std::string>().empty() && v.get<std::string>()[0] == '$') {
    const std::string name = v.get<std::string>().substr(1);
    auto it = vars_->find(name);
    if (it == vars_->end()) fail(key, "unknown variable " + show(v));
    x = it->second;
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>() &&
             std::fabs(v.get<double>()) < 9e15) {
    x = static_cast<int64_t>(v.get<double>());
  } else {
    fail(key, std::string("expected ") + what + ", got " + show(v));
  }
  if (x < min || x > max) fail(key, std::string("expected ") + what + ", got " + std::to_string(x));
  return x;
}

int64_t ConfigReader::positive_int(const std::string& key) {
  return as_int(key, get(key), 1, std::numeric_limits<int64_t>::max(), "a positive integer");
}

int64_t ConfigReader::positive_int_or(const std::string& key, int64_t def) {
  return has(key) ? positive_int(key) : def;
}

int64_t ConfigReader::int_or(const std::string& key, int64_t def, int64_t min, int64_t max) {
  if (!has(key)) return def;
  const std::string what = "an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
  return as_int(key, get(key), min, max, what.c_str());
}

double ConfigReader::number(const std::string& key) {
  const auto& v = get(key);
  if (!v.is_number()) fail(key, "expected a number, got " + show(v));
  return v.get<double>();
}

double ConfigReader::number_or(const std::string& key, double def, double min, double max) {
  if (!has(key)) return def;
  const double x = number(key);
  if (!(x >= min && x <= max) || !std::isfinite(x)) {
    std::ostringstream os;
    os << "expected a number in [" << min << ", " << max << "], got " << x;
    fail(key, os.str());
  }
  return x;
}

bool ConfigReader::bool_or(const std::string& key, bool def) {
  if (!has(key)) return def;
  const auto& v = get(key);
  if (!v.is_boolean()) fail(key, "expected true or false, got " + show(v));
  return v.get<bool>();
}

std::string ConfigReader::string(const std::string& key) {
  const auto& v = get(key);
  if (!v.is_string()) fail(key, "expected a string, got " + show(v));
  return v.get<std::string>();
}

std::string ConfigReader::string_or(const std::string& key, const std::string& def) {
  return has(key) ? string(key) : def;
}

std::string ConfigReader::one_of(const std::string& key, const std::vector<std::string>& choices,
                                 const std::string& def) {
  if (!has(key)) return def;
  const std::string s = string(key);
  for (const auto& c : choices)
    if (s == c) return s;
  std::string list;
  for (const auto& c : choices) list += (list.empty() ? "" : ", ") + c;
  fail(key, "expected one of " + list + ", got \"" + s + "\"");
}

std::vector<std::string> ConfigReader::string_list_or(const std::string& key, const std::vector<std::string>& def) {
  if (!has(key)) return def;
  const auto& v = get(key);
  if (!v.is_array()) fail(key, "expected a list of strings, got " + show(v));
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string()) fail(key + "/" + std::to_string(i), "expected a string, got " + show(v[i]));
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

std::vector<int64_t> ConfigReader::shape(const std::string& key) {
  const auto& v = get(key);
  if (!v.is_array() || v.empty()) fail(key, "expected a non-empty list of positive integers, got " + show(v));
  std::vector<int64_t> out;
  for (size_t i = 0; i < v.size(); ++i)
    out.push_back(
        as_int(key + "/" + std::to_string(i), v[i], 1, std::numeric_limits<int32_t>::max(), "a positive integer"));
  return out;
}

const nlohmann::json& ConfigReader::raw(const std::string& key) { return get(key); }

ConfigReader ConfigReader::child(const std::string& key) {
  const auto& v = get(key);
  if (!v.is_object()) fail(key, "expected an object, got " + show(v));
  return ConfigReader(v, pointer_ + "/" + escape(key), source_, vars_);
}

ConfigReader ConfigReader::child(const std::string& key, size_t index) {
  const auto& arr = get(key);
  const auto& v = arr.at(index);
  if (!v.is_object()) fail(key + "/" + std::to_string(index), "expected an object, got " + show(v));
  return ConfigReader(v, pointer_ + "/" + escape(key) + "/" + std::to_string(index), source_, vars_);
}

size_t ConfigReader::array_size(const std::string& key) {
  const auto& v = get(key);
  if (!v.is_array()) fail(key, "expected a list, got " + show(v));
  return v.size();
}

void ConfigReader::finish() const {
  for (auto it = obj_.begin(); it != obj_.end(); ++it) {
    if (used_.count(it.key())) continue;
    // The nearest key this object was asked for, when it is near (a typo) and unique.
    const std::string best = nearest_name(it.key(), std::vector<std::string>(asked_.begin(), asked_.end()));
    fail(it.key(), best.empty() ? "unknown key" : "unknown key (did you mean \"" + best + "\"?)");
  }
}

// ---------------------------------------------------------------------------

Config parse_config(const nlohmann::json& j, const std::string& source) {
  Config c;
  c.source = source;
  ConfigReader root(j, "", source);
  c.name = root.string_or("name", "");
  c.description = root.string_or("description", "");
  {
    const auto& m = root.raw("model");
    if (!m.is_object()) root.fail("model", "expected an object");
    c.model = m;
  }
  if (root.has("data")) {
    ConfigReader d = root.child("data");
    c.data.dataset = d.one_of("dataset", known_datasets(), c.data.dataset);
    c.data.path = d.string_or("path", "");
    c.data.synthetic_size = d.positive_int_or("synthetic_size", c.data.synthetic_size);
    // Token shards hold uint16 ids of some tokenizer; by default GPT-2's vocabulary.
    // Translation: the tokenizer's pieces (the corpus is built with this many).
    c.data.vocab = d.positive_int_or("vocab", c.data.dataset == "token_shards"  ? kGpt2Vocab
                                              : c.data.dataset == "translation" ? kTranslationVocab
                                                                                : c.data.vocab);
    if (d.has("image_shape")) c.data.image_shape = d.shape("image_shape");
    c.data.classes = d.positive_int_or("classes", c.data.classes);
    c.data.eval_fraction = d.number_or("eval_fraction", c.data.eval_fraction, 0.0, 0.9);
    c.data.shuffle = d.bool_or("shuffle", c.data.shuffle);
    // An empty list: none (what a run's config.json records without buckets).
    if (d.has("length_buckets") && !(d.raw("length_buckets").is_array() && d.raw("length_buckets").empty())) {
      c.data.length_buckets = d.shape("length_buckets");
      if (c.data.dataset != "translation")
        d.fail("length_buckets",
               "cuts translation batches short, but the data set " + c.data.dataset + " is not translation");
      for (size_t i = 0; i < c.data.length_buckets.size(); ++i)
        if (c.data.length_buckets[i] < 2 || (i > 0 && c.data.length_buckets[i] <= c.data.length_buckets[i - 1]))
          d.fail("length_buckets", "expected ascending lengths of at least 2, got " +
                                       std::to_string(c.data.length_buckets[i]) +
                                       (i > 0 ? " after " + std::to_string(c.data.length_buckets[i - 1]) : ""));
    }
    if (d.has("augment")) {
      ConfigReader a = d.child("augment");
      c.data.augment.hflip = a.number_or("hflip", c.data.augment.hflip, 0.0, 1.0);
      const bool text = c.data.dataset == "text" || c.data.dataset == "synthetic_text" ||
                        c.data.dataset == "token_shards" || c.data.dataset == "translation";
      if (text && c.data.augment.hflip > 0)
        a.fail("hflip", "mirrors images, but the data set " + c.data.dataset + " is text");
      a.finish();
    }
    d.finish();
  }
  if (root.has("optimizer")) {
    ConfigReader o = root.child("optimizer");
    c.optimizer.type = o.one_of("type", {"adamw", "sgd"}, c.optimizer.type);
    c.optimizer.lr = o.number_or("lr", c.optimizer.lr, 0.0, 1e3);
    c.optimizer.weight_decay = o.number_or("weight_decay", c.optimizer.weight_decay, 0.0, 1e3);
    c.optimizer.momentum = o.number_or("momentum", c.optimizer.momentum, 0.0, 1.0);
    c.optimizer.dampening = o.number_or("dampening", c.optimizer.dampening, 0.0, 1.0);
    c.optimizer.nesterov = o.bool_or("nesterov", c.optimizer.nesterov);
    c.optimizer.beta1 = o.number_or("beta1", c.optimizer.beta1, 0.0, 0.999999);
    c.optimizer.beta2 = o.number_or("beta2", c.optimizer.beta2, 0.0, 0.999999);
    c.optimizer.eps = o.number_or("eps", c.optimizer.eps, 0.0, 1.0);
    c.optimizer.grad_clip = o.number_or("grad_clip", c.optimizer.grad_clip, 0.0, 1e9);
    o.finish();
  }
  if (root.has("schedule")) {
    ConfigReader s = root.child("schedule");
    c.schedule.type = s.one_of("type", {"constant", "cosine", "step"}, c.schedule.type);
    c.schedule.warmup_steps = s.int_or("warmup_steps", c.schedule.warmup_steps, 0, int64_t{1} << 40);
    c.schedule.min_lr_ratio = s.number_or("min_lr_ratio", c.schedule.min_lr_ratio, 0.0, 1.0);
    c.schedule.step_size = s.positive_int_or("step_size", c.schedule.step_size);
    c.schedule.gamma = s.number_or("gamma", c.schedule.gamma, 0.0, 1.0);
    s.finish();
  }
  if (root.has("training")) {
    ConfigReader t = root.child("training");
    c.training.batch = t.positive_int_or("batch", c.training.batch);
    c.training.micro_batch = t.int_or("micro_batch", c.training.micro_batch, 0, int64_t{1} << 40);
    c.training.shard_optimizer = t.bool_or("shard_optimizer", c.training.shard_optimizer);
    c.training.epochs = t.int_or("epochs", c.training.epochs, 0, 1 << 20);
    c.training.steps = t.int_or("steps", c.training.steps, 0, int64_t{1} << 40);
    c.training.seed = static_cast<uint64_t>(t.int_or("seed", 0, 0, std::numeric_limits<int64_t>::max()));
    c.training.policy = t.string_or("policy", c.training.policy);
    c.training.precision = t.string_or("precision", c.training.precision);
    if (const std::string e = precision_error(c.training.precision); !e.empty()) t.fail("precision", e);
    c.training.log_every = t.positive_int_or("log_every", c.training.log_every);
    c.training.eval_every = t.int_or("eval_every", c.training.eval_every, 0, int64_t{1} << 40);
    c.training.eval_batches = t.int_or("eval_batches", c.training.eval_batches, 0, int64_t{1} << 40);
    c.training.checkpoint_every = t.int_or("checkpoint_every", c.training.checkpoint_every, 0, int64_t{1} << 40);
    c.training.sample_every = t.int_or("sample_every", c.training.sample_every, 0, int64_t{1} << 40);
    c.training.sample_length = t.int_or("sample_length", c.training.sample_length, 0, 1 << 20);
    t.finish();
  }
  root.finish();
  check_micro_batch(c);
  return c;
}

void check_micro_batch(const Config& c) {
  const TrainingConfig& t = c.training;
  REMAT_CHECK(t.micro_batch >= 0 && t.micro() <= t.batch && t.batch % t.micro() == 0, c.source,
              ": /training/micro_batch: ", t.micro_batch, " does not divide /training/batch ", t.batch,
              " (a step of batch B runs B / micro_batch micro-batches)");
}

const std::vector<std::string>& known_datasets() {
  static const std::vector<std::string> names{
      "fashion_mnist", "text", "synthetic_images", "synthetic_text", "token_shards", "translation", "npy"};
  return names;
}

Config load_config(const std::string& path, const std::string& dataset) {
  const std::string text = read_file(path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    REMAT_THROW(path, ": not valid JSON: ", e.what());
  }
  if (!dataset.empty() && j.is_object()) {
    if (!j.contains("data")) j["data"] = nlohmann::json::object();
    if (j["data"].is_object()) j["data"]["dataset"] = dataset;
  }
  return parse_config(j, path);
}

nlohmann::json Config::resolved() const {
  nlohmann::json j;
  j["name"] = name;
  j["description"] = description;
  j["model"] = model;
  j["data"] = {{"dataset", data.dataset},
               {"path", data.path},
               {"synthetic_size", data.synthetic_size},
               {"vocab", data.vocab},
               {"image_shape", data.image_shape},
               {"classes", data.classes},
               {"eval_fraction", data.eval_fraction},
               {"shuffle", data.shuffle},
               {"length_buckets", data.length_buckets},
               {"augment", {{"hflip", data.augment.hflip}}}};
  j["optimizer"] = {{"type", optimizer.type},
                    {"lr", optimizer.lr},
                    {"weight_decay", optimizer.weight_decay},
                    {"momentum", optimizer.momentum},
                    {"dampening", optimizer.dampening},
                    {"nesterov", optimizer.nesterov},
                    {"beta1", optimizer.beta1},
                    {"beta2", optimizer.beta2},
                    {"eps", optimizer.eps},
                    {"grad_clip", optimizer.grad_clip}};
  j["schedule"] = {{"type", schedule.type},
                   {"warmup_steps", schedule.warmup_steps},
                   {"min_lr_ratio", schedule.min_lr_ratio},
                   {"step_size", schedule.step_size},
                   {"gamma", schedule.gamma}};
  j["training"] = {{"batch", training.batch},
                   {"micro_batch", training.micro_batch},
                   {"shard_optimizer", training.shard_optimizer},
                   {"epochs", training.epochs},
                   {"steps", training.steps},
                   {"seed", training.seed},
                   {"policy", training.policy},
                   {"precision", training.precision},
                   {"log_every", training.log_every},
                   {"eval_every", training.eval_every},
                   {"eval_batches", training.eval_batches},
                   {"checkpoint_every", training.checkpoint_every},
                   {"sample_every", training.sample_every},
                   {"sample_length", training.sample_length}};
  return j;
}

const std::vector<std::string>& precisions() {
  static const std::vector<std::string> p{"fp32", "bf16"};
  return p;
}

std::string precision_error(const std::string& p) {
  if (p == "fp32" || p == "bf16") return "";
  if (p == "fp16")
    return "fp16 is not supported (it needs loss scaling for its narrow range); use bf16, which keeps fp32's range, "
           "or fp32";
  return "unknown precision \"" + p + "\" (expected fp32 or bf16)";
}

DType precision_dtype(const std::string& p) {
  if (const std::string e = precision_error(p); !e.empty()) REMAT_THROW("training.precision: ", e);
  return p == "bf16" ? DType::bf16 : DType::f32;
}

}  // namespace remat
