// Interop: llm.c token shards (header validation, windows, the split by name, mutated
// headers), --init-from of Hugging Face GPT-2 files in both layouts and of remat runs
// (names, transposes, dtypes, every error), resident memory while loading, and the export.
// The Hugging Face files here are written by this test's own encoder with the names and
// [in, out] Conv1D shapes spelled out by hand; tests/interop/test_hf_gpt2.py checks the
// same paths against transformers itself.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "fuzz/harness.h"
#include "remat/bf16.h"
#include "remat/interop.h"
#include "remat/io.h"
#include "remat/token_shards.h"
#include "remat/train.h"
#include "support/expect_error.h"
#include "support/golden.h"

namespace fs = std::filesystem;
using remat::Shape;
using remat::Tensor;
using remat::TokenShards;

namespace {

class TempDir {
 public:
  explicit TempDir(const std::string& tag)
      : path_(fs::temp_directory_path() / ("remat_test_interop_" + std::to_string(::getpid()) + "_" + tag)) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// ---- llm.c shards, written here byte by byte ----------------------------------------------------

void put_i32(std::string& s, int32_t v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
}

std::string shard(const std::vector<int>& tokens, int32_t magic = 20240520, int32_t version = 1, int32_t count = -1,
                  int reserved_at = -1) {
  std::string s;
  put_i32(s, magic);
  put_i32(s, version);
  put_i32(s, count >= 0 || count < -1 ? count : static_cast<int32_t>(tokens.size()));
  for (int i = 3; i < 256; ++i) put_i32(s, i == reserved_at ? 7 : 0);
  for (int t : tokens) {
    s.push_back(static_cast<char>(t & 0xff));
    s.push_back(static_cast<char>((t >> 8) & 0xff));
  }
  return s;
}

std::vector<int> iota_tokens(int n, int start, int mod = 65536) {
  std::vector<int> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (start + i) % mod;
  return t;
}

}  // namespace

TEST(TokenShards, EveryHeaderFieldIsValidated) {
  auto bad = [](const std::string& bytes, const std::string& msg) {
    EXPECT_REMAT_ERROR(TokenShards::from_bytes(bytes, "d/x_train_000001.bin"),
                       "d/x_train_000001.bin: not a token shard: " + msg);
  };
  const std::vector<int> t = iota_tokens(10, 100);
  bad(shard(t).substr(0, 1000), "the file is 1000 bytes, shorter than the header of 256 int32 (1024 bytes)");
  bad("", "the file is 0 bytes");
  bad(shard(t, 20240521), "header field 0 (magic) is 20240521, expected 20240520");
  bad(shard(t, 20240801), "header field 0 (magic) is 20240801, llm.c's shards of uint32 tokens (LLaMA 3)");
  bad(shard(t, 20240520, 2), "header field 1 (version) is 2, expected 1");
  bad(shard({}, 20240520, 1, 0), "header field 2 (token count) is 0, expected a positive count");
  bad(shard(t, 20240520, 1, -3), "header field 2 (token count) is -3");
  bad(shard(t, 20240520, 1, -1, 3), "header field 3 (reserved) is 7, expected 0");
  bad(shard(t, 20240520, 1, -1, 255), "header field 255 (reserved) is 7, expected 0");
  bad(shard(t).substr(0, 1024 + 19),
      "the header says 10 tokens (1044 bytes with the header) but the file is 1043 bytes; truncated?");
  bad(shard(t, 20240520, 1, 0x7fffffff), "the header says 2147483647 tokens");
  bad(shard(t) + "xy",
      "the header says 10 tokens (1044 bytes with the header) but the file is 1046 bytes; 2 bytes follow");
  EXPECT_EQ(TokenShards::from_bytes(shard(t), "ok.bin").tokens(), 10);
  // Files: the path is named, and so is a missing one.
  TempDir d("hdr");
  write_bytes(d / "a_val.bin", shard(t, 1));
  EXPECT_REMAT_ERROR(TokenShards::open({d / "a_val.bin"}),
                     d / "a_val.bin" + ": not a token shard: header field 0 (magic) is 1");
  EXPECT_REMAT_ERROR(TokenShards::open({d / "none.bin"}), "cannot open " + d / "none.bin");
}

TEST(TokenShards, WindowsStayInsideAFileAndShiftTargetsByOne) {
  TempDir d("win");
  write_bytes(d / "s_train_000001.bin", shard(iota_tokens(11, 0)));    // 2 windows of 4 (+1 target), 2 tokens left
  write_bytes(d / "s_train_000002.bin", shard(iota_tokens(9, 1000)));  // 2 windows of 4
  write_bytes(d / "s_train_000003.bin", shard(iota_tokens(4, 2000)));  // none: 4 tokens leave no target
  const TokenShards s = TokenShards::open(remat::find_token_shards(d.path().string()));
  EXPECT_EQ(s.tokens(), 24);
  EXPECT_EQ(s.windows(4), 4);
  EXPECT_EQ(s.windows(1), 10 + 8 + 3);
  EXPECT_EQ(s.files().size(), 3u);
  const remat::Batch b = s.batch({3, 0, 2, 1}, 4, 65536, remat::Device::cpu());
  EXPECT_EQ(b.input().shape(), (Shape{4, 4}));
  EXPECT_EQ(b.targets().shape(), (Shape{4, 4}));
  EXPECT_EQ(b.input().to_ints(),
            (std::vector<int32_t>{1004, 1005, 1006, 1007, 0, 1, 2, 3, 1000, 1001, 1002, 1003, 4, 5, 6, 7}));
  EXPECT_EQ(b.targets().to_ints(),
            (std::vector<int32_t>{1005, 1006, 1007, 1008, 1, 2, 3, 4, 1001, 1002, 1003, 1004, 5, 6, 7, 8}));
  EXPECT_REMAT_ERROR(s.batch({4}, 4, 65536, remat::Device::cpu()), "window 4 at position 0 is outside [0, 4)");
  EXPECT_REMAT_ERROR(s.batch({-1}, 4, 65536, remat::Device::cpu()), "window -1");
  // The vocabulary: a token >= vocab names the file and the token's index in it.
  EXPECT_REMAT_ERROR(s.batch({0, 3}, 4, 1008, remat::Device::cpu()),
                     d / "s_train_000002.bin" + ": token 8 is 1008, outside the model's vocabulary of 1008");
  EXPECT_NO_THROW(s.batch({0, 3}, 4, 1009, remat::Device::cpu()));
  // Meta batches are shapes only.
  EXPECT_EQ(s.batch({0}, 4, 10, remat::Device::meta()).input().shape(), (Shape{1, 4}));
}

TEST(TokenShards, FindSplitAndHoldOut) {
  TempDir d("split");
  write_bytes(d / "fineweb_val_000000.bin", shard(iota_tokens(40, 0)));
  write_bytes(d / "fineweb_train_000001.bin", shard(iota_tokens(100, 500)));
  write_bytes(d / "fineweb_train_000002.bin", shard(iota_tokens(60, 900)));
  write_bytes(d / "notes.txt", "not a shard");
  EXPECT_EQ(remat::find_token_shards(d.path().string()).size(), 3u);  // *.bin only
  EXPECT_EQ(remat::find_token_shards(d / "*train*").size(), 2u);
  EXPECT_EQ(remat::find_token_shards(d / "fineweb_val_000000.bin").size(), 1u);
  EXPECT_REMAT_ERROR(remat::find_token_shards(d / "nothing_*.bin"),
                     "no such file, and no file matches it as a pattern");
  EXPECT_REMAT_ERROR(remat::find_token_shards(""), "no path given");
  {
    TempDir empty("split_empty");
    EXPECT_REMAT_ERROR(remat::find_token_shards(empty.path().string()), "holds no token shards (*.bin files)");
  }
  for (const char* v : {"fineweb_val_000000.bin", "tiny_shakespeare_val.bin", "val.bin", "x/VAL-1.bin", "a.val"})
    EXPECT_TRUE(remat::is_val_shard_name(v)) << v;
  for (const char* t : {"fineweb_train_000001.bin", "interval.bin", "valley_000.bin", "x_valid.bin", "val/x.bin"})
    EXPECT_FALSE(remat::is_val_shard_name(t)) << t;

  const remat::TokenShardData sd = remat::load_token_shard_data(d.path().string(), 0.5);
  EXPECT_EQ(sd.train.tokens(), 160);  // the val file evaluates; eval_fraction plays no part
  EXPECT_EQ(sd.eval.tokens(), 40);
  EXPECT_EQ(sd.eval.files(), (std::vector<std::string>{d / "fineweb_val_000000.bin"}));
  EXPECT_NE(sd.describe.find("eval: 40 tokens in 1 file"), std::string::npos) << sd.describe;
  // Without a val file the last eval_fraction of the tokens is held out, cutting a file.
  const remat::TokenShardData tail = remat::load_token_shard_data(d / "*train*", 0.25);
  EXPECT_EQ(tail.train.tokens(), 120);
  EXPECT_EQ(tail.eval.tokens(), 40);
  EXPECT_EQ(tail.train.files().size(), 2u);
  const remat::Batch e = tail.eval.batch({0}, 3, 65536, remat::Device::cpu());
  EXPECT_EQ(e.input().to_ints(), (std::vector<int32_t>{920, 921, 922}));  // token 20 of the second file
  EXPECT_REMAT_ERROR(tail.eval.batch({0}, 3, 920, remat::Device::cpu()), "fineweb_train_000002.bin: token 20 is 920");
  EXPECT_REMAT_ERROR(remat::load_token_shard_data(d / "*val*", 0.1), "are validation shards");
  // remat eval: one file whatever its name; of a set, its val shards.
  EXPECT_EQ(remat::load_eval_token_shards(d / "fineweb_train_000002.bin").tokens(), 60);
  EXPECT_EQ(remat::load_eval_token_shards(d.path().string()).tokens(), 40);
  EXPECT_EQ(remat::load_eval_token_shards(d / "*train*").tokens(), 160);
}

TEST(TokenShards, MutatedFilesAreErrorsNeverCrashes) {
  // A deterministic mutation fuzzer over a valid shard, through the fuzz target's code:
  // header words set to interesting values, bytes flipped, the file cut or extended.
  const std::string valid = shard(iota_tokens(37, 65500));
  std::mt19937 gen(1234);
  const int32_t words[] = {0, 1, -1, 2, 20240520, 20240801, 18, 37, 36, 38, 0x7fffffff, INT32_MIN, 65535};
  int parsed = 0;
  for (int it = 0; it < 4000; ++it) {
    std::string b = valid;
    const int kind = static_cast<int>(gen() % 4);
    if (kind == 0) {
      const size_t w = gen() % 4 < 3 ? gen() % 3 : gen() % 256;
      const int32_t v = words[gen() % (sizeof words / sizeof words[0])];
      std::string word;
      put_i32(word, v);
      b.replace(4 * w, 4, word);
    } else if (kind == 1) {
      for (int k = 0, n = 1 + static_cast<int>(gen() % 4); k < n; ++k)
        b[gen() % b.size()] ^= static_cast<char>(1 << (gen() % 8));
    } else if (kind == 2) {
      b.resize(gen() % (b.size() + 1));
    } else {
      b.append(gen() % 5, '\0');
    }
    try {
      parsed += remat::fuzz::run_token_shard_input(reinterpret_cast<const uint8_t*>(b.data()), b.size());
    } catch (const std::exception& e) {
      FAIL() << "mutation " << it << ": " << e.what();
    }
  }
  EXPECT_GT(parsed, 100);   // flips in the tokens keep the file valid
  EXPECT_LT(parsed, 3900);  // most header changes do not
}

// ---- Hugging Face GPT-2 files -------------------------------------------------------------------

namespace {

// A safetensors file from raw entries (dtype string, shape, bytes), independent of remat's writer.
struct RawTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

std::string encode_raw(const std::vector<RawTensor>& ts, const nlohmann::json& meta = {{"format", "pt"}}) {
  nlohmann::json h = nlohmann::json::object();
  if (!meta.is_null()) h["__metadata__"] = meta;
  std::string data;
  for (const RawTensor& t : ts) {
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  const std::string j = h.dump();
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((j.size() >> (8 * i)) & 0xff));
  return out + j + data;
}

std::string f32_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

// The tiny GPT-2 of tests/configs/gpt2_tiny.json: 2 blocks, 64 wide, 4 heads, 64 positions.
constexpr int64_t kL = 2, kC = 64, kV = 256, kP = 64;

remat::Config tiny_config() {
  return remat::load_config(std::string(REMAT_SOURCE_DIR) + "/tests/configs/gpt2_tiny.json");
}

remat::Graph tiny_graph(const remat::Config& c) { return remat::build_graph(c.model, 1, c.source, {{"vocab", kV}}); }

// A Hugging Face GPT-2 state: name -> (shape as Hugging Face stores it, values), as
// GPT2LMHeadModel's state_dict has them (Conv1D weights [in, out]).
struct HfState {
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> t;
  const std::vector<float>& v(const std::string& n) const { return t.at(n).second; }
};

// Adds tensor n of `shape`, uniform in [-1, 1) from gen.
void add_random(HfState& s, std::mt19937& gen, const std::string& n, const std::vector<int64_t>& shape) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  int64_t k = 1;
  for (int64_t d : shape) k *= d;
  std::vector<float> v(static_cast<size_t>(k));
  for (float& x : v) x = u(gen);
  s.t[n] = {shape, v};
}

HfState hf_state(uint32_t seed) {
  std::mt19937 gen(seed);
  HfState s;
  auto add = [&](const std::string& n, std::vector<int64_t> shape) { add_random(s, gen, n, shape); };
  add("wte.weight", {kV, kC});
  add("wpe.weight", {kP, kC});
  for (int64_t i = 0; i < kL; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    add(h + "ln_1.weight", {kC});
    add(h + "ln_1.bias", {kC});
    add(h + "attn.c_attn.weight", {kC, 3 * kC});
    add(h + "attn.c_attn.bias", {3 * kC});
    add(h + "attn.c_proj.weight", {kC, kC});
    add(h + "attn.c_proj.bias", {kC});
    add(h + "ln_2.weight", {kC});
    add(h + "ln_2.bias", {kC});
    add(h + "mlp.c_fc.weight", {kC, 4 * kC});
    add(h + "mlp.c_fc.bias", {4 * kC});
    add(h + "mlp.c_proj.weight", {4 * kC, kC});
    add(h + "mlp.c_proj.bias", {kC});
  }
  add("ln_f.weight", {kC});
  add("ln_f.bias", {kC});
  return s;
}

std::vector<RawTensor> raw(const HfState& s, const std::string& prefix) {
  std::vector<RawTensor> out;
  for (const auto& [n, sv] : s.t) out.push_back({prefix + n, "F32", sv.first, f32_bytes(sv.second)});
  return out;
}

std::vector<float> transpose(const std::vector<float>& v, int64_t rows, int64_t cols) {
  std::vector<float> o(v.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) o[static_cast<size_t>(c * rows + r)] = v[static_cast<size_t>(r * cols + c)];
  return o;
}

// remat's parameter for each Hugging Face tensor, written out by hand.
std::map<std::string, std::vector<float>> expected_remat(const HfState& s) {
  std::map<std::string, std::vector<float>> e;
  e["embed.weight"] = s.v("wte.weight");
  e["embed.pos_weight"] = s.v("wpe.weight");
  for (int64_t i = 0; i < kL; ++i) {
    const std::string h = "h." + std::to_string(i) + ".", r = "h" + std::to_string(i) + ".";
    e[r + "ln1.weight"] = s.v(h + "ln_1.weight");
    e[r + "ln1.bias"] = s.v(h + "ln_1.bias");
    e[r + "qkv.weight"] = transpose(s.v(h + "attn.c_attn.weight"), kC, 3 * kC);
    e[r + "qkv.bias"] = s.v(h + "attn.c_attn.bias");
    e[r + "proj.weight"] = transpose(s.v(h + "attn.c_proj.weight"), kC, kC);
    e[r + "proj.bias"] = s.v(h + "attn.c_proj.bias");
    e[r + "ln2.weight"] = s.v(h + "ln_2.weight");
    e[r + "ln2.bias"] = s.v(h + "ln_2.bias");
    e[r + "fc.weight"] = transpose(s.v(h + "mlp.c_fc.weight"), kC, 4 * kC);
    e[r + "fc.bias"] = s.v(h + "mlp.c_fc.bias");
    e[r + "fc2.weight"] = transpose(s.v(h + "mlp.c_proj.weight"), 4 * kC, kC);
    e[r + "fc2.bias"] = s.v(h + "mlp.c_proj.bias");
  }
  e["ln_f.weight"] = s.v("ln_f.weight");
  e["ln_f.bias"] = s.v("ln_f.bias");
  return e;
}

void expect_params(const remat::ParamStore& ps, const std::map<std::string, std::vector<float>>& want) {
  ASSERT_EQ(ps.values.size(), want.size());
  for (size_t p = 0; p < ps.values.size(); ++p) {
    const std::string& n = ps.graph().params[p].name;
    ASSERT_TRUE(want.count(n)) << n;
    const std::vector<float> got = ps.values[p].to_vector();
    EXPECT_EQ(std::memcmp(got.data(), want.at(n).data(), got.size() * 4), 0) << n << " differs";
  }
}

nlohmann::json hf_config_json() {
  return {{"model_type", "gpt2"},
          {"n_layer", kL},
          {"n_head", 4},
          {"n_embd", kC},
          {"vocab_size", kV},
          {"n_positions", kP},
          {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", 1e-5},
          {"tie_word_embeddings", true}};
}

}  // namespace

TEST(InitFrom, PublishedLayoutWithMaskBuffers) {
  TempDir d("published");
  const HfState s = hf_state(1);
  std::vector<RawTensor> r = raw(s, "");
  for (int64_t i = 0; i < kL; ++i)
    r.push_back(
        {"h." + std::to_string(i) + ".attn.bias", "F32", {1, 1, kP, kP}, f32_bytes(std::vector<float>(kP * kP, 1.0f))});
  r.push_back({"h.0.attn.masked_bias", "F32", {}, f32_bytes({-1e4f})});
  write_bytes(d / "model.safetensors", encode_raw(r));
  const remat::Config c = tiny_config();
  const remat::Graph g = tiny_graph(c);
  remat::ParamStore ps(g, remat::Device::cpu(), 7);
  const remat::InitFromReport rep = remat::init_from(d / "model.safetensors", c, ps, false);
  EXPECT_EQ(rep.format, "hf-gpt2");
  EXPECT_EQ(rep.tensors, static_cast<int64_t>(g.params.size()));
  EXPECT_EQ(rep.ignored_buffers, kL + 1);
  EXPECT_TRUE(rep.missing.empty() && rep.unexpected.empty());
  expect_params(ps, expected_remat(s));
  EXPECT_NE(rep.describe().find("Hugging Face GPT-2"), std::string::npos);
}

TEST(InitFrom, SavePretrainedLayoutAndItsConfig) {
  TempDir d("pretrained");
  const HfState s = hf_state(2);
  write_bytes(d / "model.safetensors", encode_raw(raw(s, "transformer.")));
  write_bytes(d / "config.json", hf_config_json().dump());
  const remat::Config c = tiny_config();
  const remat::Graph g = tiny_graph(c);
  remat::ParamStore ps(g, remat::Device::cpu(), 7);
  remat::init_from(d.path().string(), c, ps, false);
  expect_params(ps, expected_remat(s));

  // config.json says what shapes cannot: each difference is an error naming the key.
  auto with = [&](const char* key, const nlohmann::json& v) {
    nlohmann::json j = hf_config_json();
    j[key] = v;
    write_bytes(d / "config.json", j.dump());
  };
  const std::string cj = d / "config.json";
  with("n_head", 8);
  EXPECT_REMAT_ERROR(remat::init_from(d.path().string(), c, ps, false),
                     cj + ": n_head is 8, the config's attention layers have 4 heads");
  with("activation_function", "gelu");
  EXPECT_REMAT_ERROR(remat::init_from(d.path().string(), c, ps, false), "activation_function is \"gelu\"");
  with("activation_function", "gelu_pytorch_tanh");  // the same function as gelu_new
  EXPECT_NO_THROW(remat::init_from(d.path().string(), c, ps, false));
  with("layer_norm_epsilon", 1e-6);
  EXPECT_REMAT_ERROR(remat::init_from(d.path().string(), c, ps, false), "layer_norm_epsilon is 1e-06");
  with("n_layer", 3);
  EXPECT_REMAT_ERROR(remat::init_from(d.path().string(), c, ps, false), "n_layer is 3, the config has 2 blocks");
  with("model_type", "gpt_neo");
  EXPECT_REMAT_ERROR(remat::init_from(d.path().string(), c, ps, false), "model_type is \"gpt_neo\", not gpt2");
  with("scale_attn_by_inverse_layer_idx", true);
  EXPECT_REMAT_ERROR(remat::init_from(d.path().string(), c, ps, false), "scale_attn_by_inverse_layer_idx is true");
}

TEST(InitFrom, ShapesMissingAndUnexpectedTensors) {
  TempDir d("errors");
  const remat::Config c = tiny_config();
  const remat::Graph g = tiny_graph(c);
  remat::ParamStore ps(g, remat::Device::cpu(), 7);
  const std::string f = d / "model.safetensors";
  auto write_state = [&](const HfState& s) { write_bytes(f, encode_raw(raw(s, "transformer."))); };

  HfState s = hf_state(3);
  s.t["wte.weight"].first = {kV - 1, kC};
  s.t["wte.weight"].second.resize((kV - 1) * kC);
  write_state(s);
  EXPECT_REMAT_ERROR(remat::init_from(f, c, ps, true),
                     f +
                         ": tensor \"transformer.wte.weight\" (remat's \"embed.weight\") "
                         "has shape [255, 64], the config (" +
                         c.source + ") expects [256, 64]");
  s = hf_state(3);
  s.t["h.1.attn.c_attn.weight"].first = {3 * kC, kC};  // remat's orientation: not what Hugging Face stores
  write_state(s);
  EXPECT_REMAT_ERROR(
      remat::init_from(f, c, ps, false),
      "has shape [192, 64], the config (" + c.source + ") expects [64, 192] (Conv1D [in, out] of remat's [192, 64])");

  s = hf_state(3);
  s.t.erase("h.1.mlp.c_fc.bias");
  write_state(s);
  EXPECT_REMAT_ERROR(remat::init_from(f, c, ps, false), "no tensor \"h.1.mlp.c_fc.bias\" (remat's \"h1.fc.bias\")");
  remat::ParamStore fresh(g, remat::Device::cpu(), 7, /*initialise=*/false);
  remat::InitFromReport rep = remat::init_from(f, c, fresh, true);
  EXPECT_EQ(rep.missing, (std::vector<std::string>{"h1.fc.bias"}));
  const remat::ParamStore seeded(g, remat::Device::cpu(), 7);
  for (size_t p = 0; p < g.params.size(); ++p)
    if (g.params[p].name == "h1.fc.bias") {
      EXPECT_EQ(fresh.values[p].to_vector(), seeded.values[p].to_vector());
    }
  EXPECT_EQ(rep.tensors, static_cast<int64_t>(g.params.size()) - 1);
  EXPECT_NE(rep.describe().find("left as initialised: h1.fc.bias"), std::string::npos);

  s = hf_state(3);
  s.t["h.2.ln_1.weight"] = {{kC}, std::vector<float>(kC, 1.0f)};
  s.t["score.weight"] = {{2, kC}, std::vector<float>(2 * kC, 1.0f)};
  write_state(s);
  EXPECT_REMAT_ERROR(remat::init_from(f, c, ps, false),
                     "tensors the config (" + c.source +
                         ") has no parameter for: transformer.h.2.ln_1.weight, transformer.score.weight");
  rep = remat::init_from(f, c, ps, true);
  EXPECT_EQ(rep.unexpected.size(), 2u);
  EXPECT_TRUE(rep.missing.empty());

  // A tied head: a stored lm_head.weight must be the embedding.
  s = hf_state(3);
  std::vector<RawTensor> r = raw(s, "transformer.");
  r.push_back({"lm_head.weight", "F32", {kV, kC}, f32_bytes(s.v("wte.weight"))});
  write_bytes(f, encode_raw(r));
  EXPECT_NO_THROW(remat::init_from(f, c, ps, false));
  std::vector<float> other = s.v("wte.weight");
  other[5] += 1.0f;
  r.back().bytes = f32_bytes(other);
  write_bytes(f, encode_raw(r));
  EXPECT_REMAT_ERROR(remat::init_from(f, c, ps, false), "lm_head.weight differs from wte.weight, but the config");

  // Integer weights are refused; so is a name appearing twice.
  s = hf_state(3);
  r = raw(s, "transformer.");
  r[0].dtype = "I32";
  write_bytes(f, encode_raw(r));
  EXPECT_REMAT_ERROR(remat::init_from(f, c, ps, false), "is i32; weights must be F32, F16 or BF16");
  r = raw(s, "transformer.");
  r.push_back(raw(s, "")[0]);
  write_bytes(f, encode_raw(r));
  EXPECT_REMAT_ERROR(remat::init_from(f, c, ps, false), "appears twice");
}

TEST(InitFrom, PickledCheckpointsAreRefusedWithTheConversion) {
  TempDir d("pickle");
  write_bytes(d / "pytorch_model.bin", std::string("PK\x03\x04", 4) + "archive");
  write_bytes(d / "config.json", hf_config_json().dump());
  const remat::Config c = tiny_config();
  const remat::Graph g = tiny_graph(c);
  remat::ParamStore ps(g, remat::Device::cpu(), 7);
  EXPECT_REMAT_ERROR(remat::init_from(d.path().string(), c, ps, false),
                     d / "pytorch_model.bin" + " is a pickled PyTorch checkpoint, which remat does not read");
  EXPECT_REMAT_ERROR(remat::init_from(d.path().string(), c, ps, false),
                     "save_pretrained('" + d.path().string() + "-safetensors', safe_serialization=True)");
  EXPECT_REMAT_ERROR(remat::init_from(d / "pytorch_model.bin", c, ps, false), "is a pickled PyTorch checkpoint");
  write_bytes(d / "weights.pt2", std::string("\x80\x02}q\x00.", 6));  // a bare pickle under another name
  EXPECT_REMAT_ERROR(remat::init_from(d / "weights.pt2", c, ps, false), "is a pickled PyTorch checkpoint");
  fs::remove(d / "pytorch_model.bin");
  EXPECT_REMAT_ERROR(remat::init_from(d.path().string(), c, ps, false), "no weights found");
  EXPECT_REMAT_ERROR(remat::init_from(d / "absent", c, ps, false), "no such file or folder");
}

TEST(InitFrom, HalfAndBfloatWeightsAreWidened) {
  TempDir d("half");
  HfState s = hf_state(4);
  std::vector<RawTensor> r = raw(s, "");
  // ln_f.weight in F16 and ln_f.bias in BF16, cycling through values with known floats.
  const std::vector<std::pair<uint16_t, float>> f16{{0x3c00, 1.0f},          {0xc100, -2.5f},   {0x7bff, 65504.0f},
                                                    {0x0001, 5.9604645e-8f}, {0x8000, -0.0f},   {0x3555, 0.33325195f},
                                                    {0x0400, 6.1035156e-5f}, {0x7c00, INFINITY}};
  const std::vector<std::pair<uint16_t, float>> bf16{
      {0x3f80, 1.0f}, {0xc000, -2.0f}, {0x4049, 3.140625f}, {0x0001, 9.1835496e-41f}};
  std::map<std::string, std::vector<float>> want = expected_remat(s);
  for (auto& t : r) {
    const bool is_w = t.name == "ln_f.weight", is_b = t.name == "ln_f.bias";
    if (!is_w && !is_b) continue;
    const auto& table = is_w ? f16 : bf16;
    t.dtype = is_w ? "F16" : "BF16";
    t.bytes.clear();
    std::vector<float>& w = want[is_w ? "ln_f.weight" : "ln_f.bias"];
    for (int64_t k = 0; k < kC; ++k) {
      const auto& [bits, value] = table[static_cast<size_t>(k) % table.size()];
      t.bytes.push_back(static_cast<char>(bits & 0xff));
      t.bytes.push_back(static_cast<char>(bits >> 8));
      w[static_cast<size_t>(k)] = value;
    }
  }
  write_bytes(d / "model.safetensors", encode_raw(r));
  const remat::Config c = tiny_config();
  const remat::Graph g = tiny_graph(c);
  remat::ParamStore ps(g, remat::Device::cpu(), 7);
  remat::init_from(d / "model.safetensors", c, ps, false);
  expect_params(ps, want);
}

TEST(InitFrom, ShardedIndex) {
  TempDir d("sharded");
  const HfState s = hf_state(5);
  std::vector<RawTensor> r = raw(s, "transformer."), a, b;
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  for (size_t i = 0; i < r.size(); ++i) {
    (i % 2 ? a : b).push_back(r[i]);
    index["weight_map"][r[i].name] = i % 2 ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  write_bytes(d / "model-00001-of-00002.safetensors", encode_raw(a));
  write_bytes(d / "model-00002-of-00002.safetensors", encode_raw(b));
  write_bytes(d / "model.safetensors.index.json", index.dump());
  const remat::Config c = tiny_config();
  const remat::Graph g = tiny_graph(c);
  remat::ParamStore ps(g, remat::Device::cpu(), 7);
  const remat::InitFromReport rep = remat::init_from(d.path().string(), c, ps, false);
  EXPECT_EQ(rep.files.size(), 2u);
  expect_params(ps, expected_remat(s));
  const std::string other = index["weight_map"]["transformer.wte.weight"] == "model-00001-of-00002.safetensors"
                                ? "model-00002-of-00002.safetensors"
                                : "model-00001-of-00002.safetensors";
  index["weight_map"]["transformer.wte.weight"] = other;
  write_bytes(d / "model.safetensors.index.json", index.dump());
  EXPECT_REMAT_ERROR(remat::init_from(d.path().string(), c, ps, false),
                     "weight_map puts \"transformer.wte.weight\" in " + other + ", which has no such tensor");
  index["weight_map"]["transformer.wte.weight"] = "../elsewhere.safetensors";
  write_bytes(d / "model.safetensors.index.json", index.dump());
  EXPECT_REMAT_ERROR(remat::init_from(d.path().string(), c, ps, false), "not a file beside the index");
}

TEST(InitFrom, RematRunsAndFiles) {
  TempDir d("remat");
  const remat::Config c = tiny_config();
  const remat::Graph g = tiny_graph(c);
  remat::ParamStore a(g, remat::Device::cpu(), 1);
  fs::create_directories(d.path() / "run" / "checkpoint");
  remat::save_safetensors(d / "run/checkpoint/model.safetensors", a.named_values());
  write_bytes(d / "run/checkpoint/state.json", "{}");
  remat::save_safetensors(d / "init.safetensors", a.named_values());
  std::map<std::string, std::vector<float>> want;
  for (size_t p = 0; p < a.values.size(); ++p) want[g.params[p].name] = a.values[p].to_vector();
  for (const std::string& path : {d / "run", d / "run/checkpoint", d / "init.safetensors"}) {
    remat::ParamStore b(g, remat::Device::cpu(), 2);
    const remat::InitFromReport r = remat::init_from(path, c, b, false);
    EXPECT_EQ(r.format, "remat") << path;
    expect_params(b, want);
  }
  // remat names are checked like Hugging Face's.
  auto named = a.named_values();
  named.erase(named.begin());
  remat::save_safetensors(d / "part.safetensors", named);
  remat::ParamStore b(g, remat::Device::cpu(), 2);
  EXPECT_REMAT_ERROR(remat::init_from(d / "part.safetensors", c, b, false), "no tensor \"embed.weight\"");
}

TEST(InitFrom, TrainStartsFromTheWeightsAndWritesThemAsInit) {
  TempDir d("train");
  const HfState s = hf_state(6);
  write_bytes(d / "hf_model.safetensors", encode_raw(raw(s, "transformer.")));
  fs::create_directories(d.path() / "shards");
  write_bytes(d / "shards/t_val_000000.bin", shard(iota_tokens(400, 3, 256)));
  write_bytes(d / "shards/t_train_000001.bin", shard(iota_tokens(2000, 11, 256)));
  remat::TrainOptions o;
  o.config = std::string(REMAT_SOURCE_DIR) + "/tests/configs/gpt2_tiny.json";
  o.data_path = d / "shards";
  o.init_from = d / "hf_model.safetensors";
  o.steps = 2;
  o.device = "cpu";
  o.out = d / "run";
  o.quiet = true;
  const remat::TrainResult r = remat::train(o);
  EXPECT_EQ(r.steps, 2);
  EXPECT_TRUE(std::isfinite(r.eval_loss));
  // init.safetensors holds the loaded weights, before any step.
  const remat::Config c = tiny_config();
  const remat::Graph g = tiny_graph(c);
  remat::ParamStore ps(g, remat::Device::cpu(), 9);
  remat::init_from(d / "run/init.safetensors", c, ps, false);
  expect_params(ps, expected_remat(s));
  o.resume = d / "run";
  EXPECT_REMAT_ERROR(remat::train(o), "--init-from and --resume exclude each other");
}

// Resident memory while loading: the file is mapped and copied piece by piece, each piece
// released, so the peak grows by little more than a piece beyond the parameters.
TEST(InitFrom, ResidentMemoryStaysNearTheWeights) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's shadow memory makes resident sizes meaningless";
#else
  {
    std::ofstream probe("/proc/self/clear_refs");
    if (!probe.good()) GTEST_SKIP() << "/proc/self/clear_refs cannot be written here: the peak cannot be reset";
  }
  TempDir d("rss");
  // gpt2_tiny at width 512 and 4 blocks with GPT-2's vocabulary: 37.6M parameters, 150 MB.
  remat::Config c = tiny_config();
  auto& layers = c.model["layers"];
  layers[0]["dim"] = 512;
  layers[2]["count"] = 4;
  for (auto& l : layers[2]["layers"]) {
    if (l["type"] == "linear") l["out_features"] = l["out_features"].get<int64_t>() * 8;
    if (l["type"] == "attention") l["heads"] = 8;
  }
  const remat::Graph g = remat::build_graph(c.model, 1, c.source, {{"vocab", remat::kGpt2Vocab}});
  remat::ParamStore ps(g, remat::Device::cpu(), 3);
  // A Hugging Face file of it (Conv1D weights [in, out]: the transposing path).
  auto hf_name = [](const std::string& n, bool* conv1d) {
    static const std::vector<std::pair<std::string, std::string>> block{{"ln1", "ln_1"},         {"qkv", "attn.c_attn"},
                                                                        {"proj", "attn.c_proj"}, {"ln2", "ln_2"},
                                                                        {"fc", "mlp.c_fc"},      {"fc2", "mlp.c_proj"}};
    *conv1d = false;
    if (n == "embed.weight") return std::string("wte.weight");
    if (n == "embed.pos_weight") return std::string("wpe.weight");
    if (n[0] != 'h') return n;  // ln_f
    const size_t dot = n.find('.'), dot2 = n.find('.', dot + 1);
    const std::string layer = n.substr(dot + 1, dot2 - dot - 1), what = n.substr(dot2 + 1);
    for (const auto& [r, h] : block)
      if (r == layer) {
        *conv1d = what == "weight" && layer != "ln1" && layer != "ln2";
        return "h." + n.substr(1, dot - 1) + "." + h + "." + what;
      }
    return n;
  };
  int64_t weight_bytes = 0;
  {
    nlohmann::json h = nlohmann::json::object();
    size_t off = 0;
    for (const auto& p : g.params) {
      bool conv1d = false;
      const std::string name = hf_name(p.name, &conv1d);
      const auto& sh = p.spec.shape;
      const size_t n = static_cast<size_t>(sh.numel()) * 4;
      h[name] = {{"dtype", "F32"},
                 {"shape", conv1d ? std::vector<int64_t>{sh[1], sh[0]} : sh.dims()},
                 {"data_offsets", {off, off + n}}};
      off += n;
    }
    weight_bytes = static_cast<int64_t>(off);
    const std::string j = h.dump();
    remat::AtomicFileWriter w(d / "big.safetensors");
    std::string size8;
    for (int i = 0; i < 8; ++i) size8.push_back(static_cast<char>((j.size() >> (8 * i)) & 0xff));
    w.write(size8.data(), 8);
    w.write(j.data(), j.size());
    const std::vector<float> chunk(1 << 20, 0.25f);
    for (size_t done = 0; done < off; done += chunk.size() * 4)
      w.write(chunk.data(), std::min(off - done, chunk.size() * 4));
    w.commit();
  }
  auto status_kib = [](const char* key) {
    std::ifstream in("/proc/self/status");
    for (std::string line; std::getline(in, line);)
      if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::strlen(key)));
    return -1LL;
  };
  { std::ofstream("/proc/self/clear_refs") << "5"; }  // reset the peak (VmHWM) to the current size
  const long long before = status_kib("VmRSS:");
  remat::init_from(d / "big.safetensors", c, ps, false);
  const long long peak = status_kib("VmHWM:");
  ASSERT_GT(before, 0);
  const double growth = static_cast<double>(peak - before) * 1024.0;
  EXPECT_LT(growth, 0.1 * static_cast<double>(weight_bytes))
      << "resident memory grew by " << growth / (1 << 20) << " MiB loading " << weight_bytes / (1 << 20) << " MiB";
  EXPECT_EQ(ps.values[0].to_vector()[12345], 0.25f);
#endif
}

// ---- export --------------------------------------------------------------------------------------

TEST(Export, HfGpt2FilesAndBackAgain) {
  TempDir d("export");
  const remat::Config c = tiny_config();
  const remat::Graph g = tiny_graph(c);
  remat::ParamStore a(g, remat::Device::cpu(), 11);
  fs::create_directories(d.path() / "run" / "checkpoint");
  remat::save_safetensors(d / "run/checkpoint/model.safetensors", a.named_values());
  write_bytes(d / "run/checkpoint/state.json", "{}");
  write_bytes(d / "run/config.json", c.resolved().dump(2));
  const std::string msg = remat::export_hf(d / "run", d / "hf", remat::HfArch::gpt2);
  EXPECT_NE(msg.find("28 tensors, 2 blocks"), std::string::npos) << msg;
  for (const auto& e : fs::directory_iterator(d.path() / "hf"))
    EXPECT_TRUE(e.path().filename() == "model.safetensors" || e.path().filename() == "config.json") << e.path();

  const remat::SafetensorsFile f = remat::SafetensorsFile::load(d / "hf/model.safetensors");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.entries().size(), g.params.size());
  EXPECT_FALSE(f.has("lm_head.weight"));  // tied: save_pretrained leaves it out too
  auto values = [&](const std::string& n) { return f.tensor(n).to_vector(); };
  std::map<std::string, std::vector<float>> by;
  for (size_t p = 0; p < a.values.size(); ++p) by[g.params[p].name] = a.values[p].to_vector();
  EXPECT_EQ(f.entry("transformer.h.1.attn.c_attn.weight").shape, (Shape{kC, 3 * kC}));
  EXPECT_EQ(values("transformer.h.1.attn.c_attn.weight"), transpose(by["h1.qkv.weight"], 3 * kC, kC));
  EXPECT_EQ(values("transformer.h.0.mlp.c_proj.weight"), transpose(by["h0.fc2.weight"], kC, 4 * kC));
  EXPECT_EQ(values("transformer.wte.weight"), by["embed.weight"]);
  EXPECT_EQ(values("transformer.ln_f.bias"), by["ln_f.bias"]);

  const nlohmann::json j = nlohmann::json::parse(remat::read_file(d / "hf/config.json"));
  EXPECT_EQ(j["model_type"], "gpt2");
  EXPECT_EQ(j["architectures"], nlohmann::json({"GPT2LMHeadModel"}));
  EXPECT_EQ(j["n_layer"], kL);
  EXPECT_EQ(j["n_head"], 4);
  EXPECT_EQ(j["n_embd"], kC);
  EXPECT_EQ(j["vocab_size"], kV);
  EXPECT_EQ(j["n_positions"], kP);
  EXPECT_EQ(j["activation_function"], "gelu_new");
  EXPECT_EQ(j["tie_word_embeddings"], true);
  EXPECT_TRUE(j["n_inner"].is_null());
  EXPECT_DOUBLE_EQ(j["resid_pdrop"].get<double>(), 0.1);

  // And back: the exported folder loads into the same parameters, bit for bit.
  remat::ParamStore b(g, remat::Device::cpu(), 12);
  remat::init_from(d / "hf", c, b, false);
  expect_params(b, by);

  EXPECT_REMAT_ERROR(remat::export_hf(d / "hf", d / "x", remat::HfArch::gpt2), "hf: no complete checkpoint");
  EXPECT_REMAT_ERROR(remat::export_hf(d / "run/checkpoint", d / "x", remat::HfArch::gpt2), "no config.json");
  fs::remove(d / "run/checkpoint/state.json");
  EXPECT_REMAT_ERROR(remat::export_hf(d / "run", d / "x", remat::HfArch::gpt2), "no complete checkpoint");
}

// ---- Hugging Face Llama -------------------------------------------------------------------------

namespace {

// tests/configs/llama_tiny.json: 2 blocks 16 wide, 4 query and 2 key/value heads of 4
// channels, SwiGLU 40 wide, context 8, an untied head.
constexpr int64_t kLlamaL = 2, kLlamaC = 16, kLlamaD = 4, kLlamaF = 40, kLlamaV = 64;

remat::Config llama_config() {
  return remat::load_config(std::string(REMAT_SOURCE_DIR) + "/tests/configs/llama_tiny.json");
}

remat::Graph llama_graph(const remat::Config& c) {
  return remat::build_graph(c.model, 1, c.source, {{"vocab", kLlamaV}});
}

// LlamaForCausalLM's state dict at those sizes, by hand: name -> ([rows, cols], values).
HfState llama_state(uint32_t seed) {
  std::mt19937 gen(seed);
  HfState s;
  auto add = [&](const std::string& n, std::vector<int64_t> shape) { add_random(s, gen, n, shape); };
  add("model.embed_tokens.weight", {kLlamaV, kLlamaC});
  for (int64_t i = 0; i < kLlamaL; ++i) {
    const std::string l = "model.layers." + std::to_string(i) + ".";
    add(l + "input_layernorm.weight", {kLlamaC});
    add(l + "self_attn.q_proj.weight", {4 * kLlamaD, kLlamaC});
    add(l + "self_attn.k_proj.weight", {2 * kLlamaD, kLlamaC});
    add(l + "self_attn.v_proj.weight", {2 * kLlamaD, kLlamaC});
    add(l + "self_attn.o_proj.weight", {kLlamaC, 4 * kLlamaD});
    add(l + "post_attention_layernorm.weight", {kLlamaC});
    add(l + "mlp.gate_proj.weight", {kLlamaF, kLlamaC});
    add(l + "mlp.up_proj.weight", {kLlamaF, kLlamaC});
    add(l + "mlp.down_proj.weight", {kLlamaC, kLlamaF});
  }
  add("model.norm.weight", {kLlamaC});
  add("lm_head.weight", {kLlamaV, kLlamaC});
  return s;
}

std::map<std::string, std::vector<float>> llama_expected(const HfState& s) {
  std::map<std::string, std::vector<float>> e;
  e["embed.weight"] = s.v("model.embed_tokens.weight");
  for (int64_t i = 0; i < kLlamaL; ++i) {
    const std::string l = "model.layers." + std::to_string(i) + ".", r = "h" + std::to_string(i) + ".";
    e[r + "attn_norm.weight"] = s.v(l + "input_layernorm.weight");
    std::vector<float> qkv = s.v(l + "self_attn.q_proj.weight");  // rows: q's, then k's, then v's
    for (const char* x : {"self_attn.k_proj.weight", "self_attn.v_proj.weight"})
      qkv.insert(qkv.end(), s.v(l + x).begin(), s.v(l + x).end());
    e[r + "qkv.weight"] = qkv;
    e[r + "o_proj.weight"] = s.v(l + "self_attn.o_proj.weight");
    e[r + "mlp_norm.weight"] = s.v(l + "post_attention_layernorm.weight");
    e[r + "gate.weight"] = s.v(l + "mlp.gate_proj.weight");
    e[r + "up.weight"] = s.v(l + "mlp.up_proj.weight");
    e[r + "down.weight"] = s.v(l + "mlp.down_proj.weight");
  }
  e["norm_f.weight"] = s.v("model.norm.weight");
  e["head.weight"] = s.v("lm_head.weight");
  return e;
}

nlohmann::json llama_config_json() {
  return {{"model_type", "llama"},    {"num_hidden_layers", kLlamaL}, {"num_attention_heads", 4},
          {"num_key_value_heads", 2}, {"hidden_size", kLlamaC},       {"intermediate_size", kLlamaF},
          {"hidden_act", "silu"},     {"rms_norm_eps", 1e-6},         {"rope_theta", 10000.0},
          {"rope_scaling", nullptr},  {"tie_word_embeddings", false}};
}

}  // namespace

TEST(InitFrom, HfLlamaStacksQkvAndChecksItsConfig) {
  TempDir d("llama");
  const HfState s = llama_state(21);
  std::vector<RawTensor> r = raw(s, "");
  r.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", "F32", {2}, f32_bytes({1.0f, 0.01f})});
  write_bytes(d / "model.safetensors", encode_raw(r));
  write_bytes(d / "config.json", llama_config_json().dump());
  const remat::Config c = llama_config();
  const remat::Graph g = llama_graph(c);
  remat::ParamStore ps(g, remat::Device::cpu(), 7);
  const remat::InitFromReport rep = remat::init_from(d.path().string(), c, ps, false);
  EXPECT_EQ(rep.format, "hf-llama");
  EXPECT_EQ(rep.tensors, static_cast<int64_t>(g.params.size()));
  EXPECT_EQ(rep.ignored_buffers, 1);
  expect_params(ps, llama_expected(s));
  EXPECT_NE(rep.describe().find("(Hugging Face Llama): 17 tensors"), std::string::npos) << rep.describe();

  // What shapes cannot show: each difference is an error naming the key.
  const std::string cj = d / "config.json";
  auto with = [&](const char* key, const nlohmann::json& v) {
    nlohmann::json j = llama_config_json();
    j[key] = v;
    write_bytes(cj, j.dump());
  };
  with("num_key_value_heads", 4);
  EXPECT_REMAT_ERROR(remat::init_from(d.path().string(), c, ps, false),
                     cj + ": num_key_value_heads is 4, the config's attention layers have kv_heads 2");
  with("num_key_value_heads", nullptr);  // absent: as many as the query heads
  EXPECT_REMAT_ERROR(remat::init_from(d.path().string(), c, ps, false), "num_key_value_heads is 4");
  with("rope_theta", 500000.0);
  EXPECT_REMAT_ERROR(remat::init_from(d.path().string(), c, ps, false), "rope_theta is 500000.0, the config's rope");
  with("rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}});
  EXPECT_REMAT_ERROR(remat::init_from(d.path().string(), c, ps, false), "rope_scaling is {");
  with("hidden_act", "gelu");
  EXPECT_REMAT_ERROR(remat::init_from(d.path().string(), c, ps, false), "hidden_act is \"gelu\"");
  with("rms_norm_eps", 1e-5);
  EXPECT_REMAT_ERROR(remat::init_from(d.path().string(), c, ps, false), "rms_norm_eps is 1e-05");
  with("num_hidden_layers", 3);
  EXPECT_REMAT_ERROR(remat::init_from(d.path().string(), c, ps, false), "num_hidden_layers is 3, the config has 2");
  with("head_dim", 8);
  EXPECT_REMAT_ERROR(remat::init_from(d.path().string(), c, ps, false), "head_dim is 8");
  with("head_dim", kLlamaD);
  EXPECT_NO_THROW(remat::init_from(d.path().string(), c, ps, false));

  // A part of a stacked parameter of the wrong shape names the part and its place.
  HfState bad = s;
  bad.t["model.layers.1.self_attn.k_proj.weight"] = {{4 * kLlamaD, kLlamaC},
                                                     std::vector<float>(4 * kLlamaD * kLlamaC, 0.5f)};
  write_bytes(d / "model.safetensors", encode_raw(raw(bad, "")));
  EXPECT_REMAT_ERROR(remat::init_from(d.path().string(), c, ps, false),
                     "tensor \"model.layers.1.self_attn.k_proj.weight\" (remat's \"h1.qkv.weight\") has shape [16, "
                     "16], the config (" +
                         c.source + ") expects [8, 16] (part 2 of 3: rows 16..23 of remat's [32, 16])");
  // --init-from-partial without one part: the whole parameter stays initialised, and the
  // parts that are there are listed as not used.
  HfState partial = s;
  partial.t.erase("model.layers.0.self_attn.k_proj.weight");
  write_bytes(d / "model.safetensors", encode_raw(raw(partial, "")));
  const remat::InitFromReport pr = remat::init_from(d.path().string(), c, ps, true);
  EXPECT_EQ(pr.missing, std::vector<std::string>{"h0.qkv.weight"});
  EXPECT_EQ(pr.unexpected, (std::vector<std::string>{"model.layers.0.self_attn.q_proj.weight",
                                                     "model.layers.0.self_attn.v_proj.weight"}));
  EXPECT_EQ(pr.tensors, static_cast<int64_t>(g.params.size()) - 1);
  // A GPT-2 config does not take Llama weights: the first parameter both name differs.
  write_bytes(d / "model.safetensors", encode_raw(raw(s, "")));
  fs::remove(cj);
  const remat::Config gpt = tiny_config();
  const remat::Graph gg = tiny_graph(gpt);
  remat::ParamStore gp(gg, remat::Device::cpu(), 7);
  EXPECT_REMAT_ERROR(remat::init_from(d.path().string(), gpt, gp, false),
                     "tensor \"model.embed_tokens.weight\" (remat's \"embed.weight\") has shape [64, 16]");
}

// Llama 3.1's rope_scaling ("llama3") against a config whose rope layers scale so: equal
// values load, a different one is refused naming both, and the export writes it back.
TEST(InitFrom, HfLlamaRopeScalingMustMatchTheConfigs) {
  TempDir d("llama3");
  nlohmann::json cj =
      nlohmann::json::parse(remat::read_file(std::string(REMAT_SOURCE_DIR) + "/tests/configs/llama_tiny.json"));
  for (auto& l : cj["model"]["layers"])
    if (l["type"] == "repeat")
      for (auto& b : l["layers"])
        if (b["type"] == "rope")
          b["scaling"] = {{"type", "llama3"},
                          {"factor", 32},
                          {"low_freq_factor", 1},
                          {"high_freq_factor", 4},
                          {"original_max_position", 8192}};
  const remat::Config c = remat::parse_config(cj, "scaled.json");
  const remat::Graph g = llama_graph(c);
  remat::ParamStore ps(g, remat::Device::cpu(), 7);
  write_bytes(d / "model.safetensors", encode_raw(raw(llama_state(4), "")));
  const nlohmann::json hf_scaling = {{"rope_type", "llama3"},
                                     {"factor", 32.0},
                                     {"low_freq_factor", 1.0},
                                     {"high_freq_factor", 4.0},
                                     {"original_max_position_embeddings", 8192}};
  nlohmann::json j = llama_config_json();
  j["rope_scaling"] = hf_scaling;
  write_bytes(d / "config.json", j.dump());
  EXPECT_NO_THROW(remat::init_from(d.path().string(), c, ps, false));
  j["rope_scaling"]["factor"] = 8.0;
  write_bytes(d / "config.json", j.dump());
  EXPECT_REMAT_ERROR(
      remat::init_from(d.path().string(), c, ps, false),
      "rope_scaling is {\"factor\":8.0,\"high_freq_factor\":4.0,\"low_freq_factor\":1.0,\"original_max_"
      "position_embeddings\":8192,\"rope_type\":\"llama3\"}, the config's rope scaling is llama3, factor "
      "32.0, low_freq_factor 1.0, high_freq_factor 4.0, original_max_position 8192.0");
  j.erase("rope_scaling");
  write_bytes(d / "config.json", j.dump());
  EXPECT_REMAT_ERROR(remat::init_from(d.path().string(), c, ps, false),
                     "no rope_scaling, but the config's rope scaling is llama3");
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  write_bytes(d / "config.json", j.dump());
  EXPECT_REMAT_ERROR(remat::init_from(d.path().string(), c, ps, false),
                     "rope_scaling is {\"factor\":4.0,\"rope_type\":\"yarn\"}, a kind remat's rope does not compute");

  fs::create_directories(d.path() / "run" / "checkpoint");
  remat::save_safetensors(d / "run/checkpoint/model.safetensors", ps.named_values());
  write_bytes(d / "run/checkpoint/state.json", "{}");
  write_bytes(d / "run/config.json", c.resolved().dump(2));
  remat::export_hf(d / "run", d / "hf", remat::HfArch::llama);
  const nlohmann::json out = nlohmann::json::parse(remat::read_file(d / "hf/config.json"));
  EXPECT_EQ(out["rope_scaling"], hf_scaling);
}

TEST(Export, HfLlamaShardedAndBackAgain) {
  TempDir d("export_llama");
  const remat::Config c = llama_config();
  const remat::Graph g = llama_graph(c);
  remat::ParamStore a(g, remat::Device::cpu(), 11);
  fs::create_directories(d.path() / "run" / "checkpoint");
  remat::save_safetensors(d / "run/checkpoint/model.safetensors", a.named_values());
  write_bytes(d / "run/checkpoint/state.json", "{}");
  write_bytes(d / "run/config.json", c.resolved().dump(2));
  std::map<std::string, std::vector<float>> by;
  for (size_t p = 0; p < a.values.size(); ++p) by[g.params[p].name] = a.values[p].to_vector();

  // One file: q, k and v are bands of qkv's rows.
  std::string msg = remat::export_hf(d / "run", d / "hf", remat::HfArch::llama);
  EXPECT_NE(msg.find("21 tensors, 2 blocks) to " + (d / "hf") + "/model.safetensors"), std::string::npos) << msg;
  const remat::SafetensorsFile f = remat::SafetensorsFile::load(d / "hf/model.safetensors");
  EXPECT_EQ(f.entry("model.layers.1.self_attn.k_proj.weight").shape, (Shape{2 * kLlamaD, kLlamaC}));
  const std::vector<float>& qkv = by["h1.qkv.weight"];
  const auto band = [&](int64_t r0, int64_t r1) {
    return std::vector<float>(qkv.begin() + r0 * kLlamaC, qkv.begin() + r1 * kLlamaC);
  };
  EXPECT_EQ(f.tensor("model.layers.1.self_attn.q_proj.weight").to_vector(), band(0, 16));
  EXPECT_EQ(f.tensor("model.layers.1.self_attn.k_proj.weight").to_vector(), band(16, 24));
  EXPECT_EQ(f.tensor("model.layers.1.self_attn.v_proj.weight").to_vector(), band(24, 32));
  EXPECT_EQ(f.tensor("lm_head.weight").to_vector(), by["head.weight"]);
  const nlohmann::json j = nlohmann::json::parse(remat::read_file(d / "hf/config.json"));
  EXPECT_EQ(j["architectures"], nlohmann::json({"LlamaForCausalLM"}));
  EXPECT_EQ(j["num_key_value_heads"], 2);
  EXPECT_EQ(j["num_attention_heads"], 4);
  EXPECT_EQ(j["head_dim"], kLlamaD);
  EXPECT_EQ(j["intermediate_size"], kLlamaF);
  EXPECT_EQ(j["max_position_embeddings"], 8);
  EXPECT_EQ(j["tie_word_embeddings"], false);
  EXPECT_EQ(j["attention_bias"], false);
  EXPECT_DOUBLE_EQ(j["rope_theta"].get<double>(), 10000.0);
  EXPECT_DOUBLE_EQ(j["rms_norm_eps"].get<double>(), 1e-6);

  // Shards of at most 4 KiB (a tensor larger than that alone in its shard), with the index.
  msg = remat::export_hf(d / "run", d / "hf", remat::HfArch::llama, 4096);
  EXPECT_FALSE(fs::exists(d.path() / "hf" / "model.safetensors"));  // the earlier layout is gone
  const nlohmann::json index = nlohmann::json::parse(remat::read_file(d / "hf/model.safetensors.index.json"));
  std::set<std::string> files;
  int64_t total = 0;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    files.insert(it.value().get<std::string>());
    const remat::SafetensorsFile s = remat::SafetensorsFile::load(d / ("hf/" + it.value().get<std::string>()));
    const remat::SafetensorsEntry& e = s.entry(it.key());
    total += static_cast<int64_t>(e.end - e.begin);
  }
  EXPECT_EQ(index["metadata"]["total_size"], total);
  EXPECT_EQ(index["weight_map"].size(), 21u);
  EXPECT_GT(files.size(), 3u);
  EXPECT_NE(msg.find(std::to_string(files.size()) + " shards"), std::string::npos) << msg;
  for (const std::string& n : files) {
    char tail[32];
    std::snprintf(tail, sizeof tail, "-of-%05zu.safetensors", files.size());
    EXPECT_EQ(n.substr(n.size() - 21), tail) << n;
    const auto bytes = fs::file_size(d.path() / "hf" / n);
    const remat::SafetensorsFile s = remat::SafetensorsFile::load(d / ("hf/" + n));
    EXPECT_TRUE(s.entries().size() == 1 || bytes < 4096 + 2048) << n << ": " << bytes << " bytes";
  }
  remat::ParamStore b(g, remat::Device::cpu(), 12);
  const remat::InitFromReport rep = remat::init_from(d / "hf", c, b, false);
  EXPECT_EQ(rep.files.size(), files.size());
  expect_params(b, by);

  // An export that fails half-way (here: its second shard cannot be written) leaves no
  // index, so the folder is never read as the earlier export's shards mixed with the new.
  const fs::path second = d.path() / "hf" / *std::next(files.begin());
  fs::remove(second);
  fs::create_directories(second / "in_the_way");
  EXPECT_THROW(remat::export_hf(d / "run", d / "hf", remat::HfArch::llama, 4096), remat::Error);
  EXPECT_FALSE(fs::exists(d.path() / "hf" / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(d.path() / "hf" / "model.safetensors"));
  fs::remove_all(second);
  remat::export_hf(d / "run", d / "hf", remat::HfArch::llama, 4096);  // and again, whole
  remat::ParamStore again(g, remat::Device::cpu(), 13);
  remat::init_from(d / "hf", c, again, false);
  expect_params(again, by);

  // bf16: every value rounded to nearest even, half the bytes, torch_dtype bfloat16; loading
  // it back widens the same values.
  msg = remat::export_hf(d / "run", d / "hf16", remat::HfArch::llama, remat::kHfShardBytes, remat::DType::bf16);
  EXPECT_NE(msg.find("(Hugging Face Llama, bf16)"), std::string::npos) << msg;
  const remat::SafetensorsFile h = remat::SafetensorsFile::load(d / "hf16/model.safetensors");
  const remat::SafetensorsEntry& gate = h.entry("model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(gate.dtype, remat::DType::bf16);
  ASSERT_EQ(gate.end - gate.begin, by["h0.gate.weight"].size() * 2);
  for (size_t i = 0; i < by["h0.gate.weight"].size(); ++i) {
    uint16_t got;
    std::memcpy(&got, h.data(gate) + 2 * i, 2);
    ASSERT_EQ(got, remat::bf16_from_float(by["h0.gate.weight"][i])) << i;
  }
  EXPECT_EQ(nlohmann::json::parse(remat::read_file(d / "hf16/config.json"))["torch_dtype"], "bfloat16");
  remat::ParamStore b16(g, remat::Device::cpu(), 12);
  remat::init_from(d / "hf16", c, b16, false);
  std::map<std::string, std::vector<float>> rounded = by;
  for (auto& [n, v] : rounded)
    for (float& x : v) x = remat::round_to_bf16(x);
  expect_params(b16, rounded);

  // A GPT-2 run is not a Llama.
  const remat::Config gpt = tiny_config();
  write_bytes(d / "run/config.json", gpt.resolved().dump(2));
  const remat::Graph gg = tiny_graph(gpt);
  remat::ParamStore ga(gg, remat::Device::cpu(), 11);
  remat::save_safetensors(d / "run/checkpoint/model.safetensors", ga.named_values());
  EXPECT_REMAT_ERROR(remat::export_hf(d / "run", d / "x", remat::HfArch::llama),
                     "parameter \"embed.pos_weight\" has no Hugging Face Llama name");
}

TEST(InitFrom, ParamsInitialisedInAnyOrderAreTheConstructorsValues) {
  const remat::Config c = tiny_config();
  const remat::Graph g = tiny_graph(c);
  const remat::ParamStore a(g, remat::Device::cpu(), 5);
  remat::ParamStore b(g, remat::Device::cpu(), 5, /*initialise=*/false);
  for (size_t p = g.params.size(); p-- > 0;) b.initialise(p);
  for (size_t p = 0; p < g.params.size(); ++p)
    EXPECT_TRUE(remat::test::bitwise_equal(a.values[p], b.values[p])) << g.params[p].name;
  EXPECT_REMAT_ERROR(b.initialise(g.params.size()), "ParamStore::initialise: parameter 28 of 28");
}

TEST(InitFrom, DatasetOverrideTrainsASyntheticConfigOnShards) {
  TempDir d("dataset");
  nlohmann::json j =
      nlohmann::json::parse(remat::read_file(std::string(REMAT_SOURCE_DIR) + "/tests/configs/gpt2_tiny.json"));
  j["data"] = {{"dataset", "synthetic_text"}, {"synthetic_size", 5000}};
  j["model"]["layers"][0]["vocab"] = kV;  // no $vocab: synthetic_text's default vocabulary is 32
  j["model"]["layers"].back()["out_features"] = kV;
  write_bytes(d / "synthetic.json", j.dump());
  EXPECT_EQ(remat::load_config(d / "synthetic.json").data.vocab, 32);
  const remat::Config c = remat::load_config(d / "synthetic.json", "token_shards");
  EXPECT_EQ(c.data.dataset, "token_shards");
  EXPECT_EQ(c.data.vocab, remat::kGpt2Vocab);  // the default of the data set it now is
  write_bytes(d / "s_train_000001.bin", shard(iota_tokens(1000, 0, 256)));
  remat::TrainOptions o;
  o.config = d / "synthetic.json";
  o.data_path = d / "s_train_000001.bin";
  o.steps = 1;
  o.device = "cpu";
  o.quiet = true;
  EXPECT_REMAT_ERROR(remat::train(o), "is synthetic_text, which reads no files; pass --dataset too");
  o.dataset = "token_shards";
  EXPECT_EQ(remat::train(o).steps, 1);
}
