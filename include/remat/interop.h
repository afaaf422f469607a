// Weights from and to other tools' files: Hugging Face GPT-2 and Llama checkpoints
// (safetensors, one file or sharded with an index, in the layout of the published
// checkpoints and in the one save_pretrained writes) and remat's own run folders, for
// `remat train/eval --init-from` and `remat export`.
//
// The names of a GPT-2 in remat are those of models/gpt2_124m.json (embed, h{i}.ln1,
// h{i}.qkv, ...), of a Llama those of models/llama_tiny.json (embed, h{i}.attn_norm,
// h{i}.qkv, h{i}.o_proj, ...); hf_tensor_names() is the one table per architecture that
// maps them to Hugging Face's, and both directions read it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "remat/config.h"
#include "remat/params.h"

namespace remat {

enum class HfArch { gpt2, llama };

// One row of a name table. "{}" stands for the block index (h{}.qkv.weight is
// h0.qkv.weight, h1.qkv.weight, ...). Hugging Face names are given without the
// "transformer." prefix that GPT-2's save_pretrained adds (lm_head.weight never has it);
// Llama's always have their "model.".
struct HfTensorName {
  const char* remat;
  // One tensor, or several stacked along the first dimension into remat's one parameter
  // (Llama's q_proj, k_proj and v_proj are the rows of remat's qkv, in that order).
  std::vector<const char*> hf;
  // A Conv1D weight: stored [in, out] by Hugging Face, [out, in] by remat's linear.
  bool conv1d;
};
const std::vector<HfTensorName>& hf_tensor_names(HfArch arch);
// Tensors of Hugging Face files that are not weights, ignored when loading: GPT-2's
// causal-mask buffers h.N.attn.bias and h.N.attn.masked_bias, Llama's
// model.layers.N.self_attn.rotary_emb.inv_freq of older files.
bool is_hf_buffer(HfArch arch, const std::string& hf_name);
// `--format` of remat export and InitFromReport::format: "hf-gpt2", "hf-llama".
const char* hf_format_name(HfArch arch);

// What init_from loaded.
struct InitFromReport {
  std::string path;
  std::string format;  // "hf-gpt2", "hf-llama" or "remat"
  std::vector<std::string> files;
  int64_t tensors = 0;  // parameters set from the files
  int64_t bytes = 0;    // bytes of those tensors in the files
  double seconds = 0;
  std::vector<std::string> missing;     // parameters not in the files, left as initialised (partial only)
  std::vector<std::string> unexpected;  // tensors of the files not used (partial only)
  int64_t ignored_buffers = 0;          // attention mask buffers skipped
  std::string describe() const;         // a line (two with partial) for the progress output
};

// Sets the parameters of `params` (built from cfg's model) from `path`:
//  - a Hugging Face GPT-2 or Llama folder (model.safetensors or a sharded
//    model.safetensors.index.json, with config.json, which is checked against cfg's
//    model), or such a .safetensors file or index; the architecture is told by the
//    tensors' names. GPT-2's published names (h.0.attn.c_attn.weight, wte.weight) and
//    save_pretrained's (transformer.h.0..., lm_head.weight left out when tied) are both
//    read, Conv1D weights transposed; Llama's q_proj, k_proj and v_proj are stacked into
//    remat's qkv;
//  - a remat run folder (its checkpoint/model.safetensors), checkpoint folder or
//    .safetensors file with remat's parameter names (init.safetensors).
// Every shape is checked against the config (the error names the tensor, the expected
// and the found shape); a missing parameter or an unexpected tensor is an error unless
// `partial`, which initialises the missing ones from the seed (ParamStore::initialise: the
// store may be made without initialisation, which saves drawing values that are replaced). F32, F16 and BF16 tensors
// are read (converted to f32). A pickled pytorch_model.bin is refused with the command that converts it. Files are
// memory-mapped and copied once into the parameters, piece by piece, releasing each piece of the map, so the resident
// memory grows by little more than the parameters.
InitFromReport init_from(const std::string& path, const Config& cfg, ParamStore& params, bool partial);

// Hugging Face's default largest shard (save_pretrained's max_shard_size "5GB").
inline constexpr int64_t kHfShardBytes = 5'000'000'000;

// `remat export RUN_DIR --format hf-gpt2|hf-llama OUT`: RUN_DIR's checkpoint (and
// config.json) as a Hugging Face checkpoint that GPT2LMHeadModel / LlamaForCausalLM
// .from_pretrained(OUT) loads: OUT/config.json and the weights with save_pretrained's
// names (lm_head.weight left out when tied, metadata format "pt"), in `dtype` (f32, or bf16
// rounded to nearest even as torch's .to(torch.bfloat16); torch_dtype says which): OUT/model.safetensors
// when they fit in `max_shard_bytes`, else shards model-0000i-of-0000n.safetensors (each at
// most that, unless one tensor is larger) and model.safetensors.index.json. Each file is
// written to a temporary file and renamed, the weights first, the index and config.json
// last; the files of the other layout left in OUT by an earlier export are removed. Returns
// a line describing what was written.
std::string export_hf(const std::string& run_dir, const std::string& out_dir, HfArch arch,
                      int64_t max_shard_bytes = kHfShardBytes, DType dtype = DType::f32);

}  // namespace remat
