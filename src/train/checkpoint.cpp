// Checkpoints: a folder swapped in whole (checkpoint.new -> checkpoint), so readers find
// the previous complete checkpoint or the new one.
#include <filesystem>

#include <nlohmann/json.hpp>

#include "remat/error.h"
#include "remat/io.h"
#include "remat/train.h"

namespace fs = std::filesystem;

namespace remat {

void save_checkpoint(const std::string& dir, const ParamStore& params, const NamedTensors& optimizer_state,
                     const CheckpointState& s) {
  const fs::path final_dir(dir), tmp = fs::path(dir + ".new"), old = fs::path(dir + ".old");
  std::error_code ec;
  // A crash between the two renames below leaves only the previous checkpoint in .old:
  // put it back before anything else, so there is always one complete checkpoint.
  if (!fs::exists(final_dir) && fs::exists(old / "state.json")) {
    fs::rename(old, final_dir, ec);
    if (ec) REMAT_THROW("cannot restore the previous checkpoint ", old.string(), ": ", ec.message());
  }
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) REMAT_THROW("cannot create ", tmp.string(), ": ", ec.message());
  std::map<std::string, std::string> meta{{"format", "remat"}, {"step", std::to_string(s.step)}};
  save_safetensors((tmp / "model.safetensors").string(), params.named_values(), meta);
  save_safetensors((tmp / "optimizer.safetensors").string(), optimizer_state, meta);
  nlohmann::json j{{"step", s.step},
                   {"seed", s.seed},
                   {"rng_offset", s.rng_offset},
                   {"epoch", s.epoch},
                   {"position", s.position},
                   {"optimizer_steps", s.optimizer_steps},
                   {"policy", s.policy},
                   {"config_name", s.config_name},
                   {"batch", s.batch},
                   {"train_size", s.train_size},
                   {"schedule_steps", s.schedule_steps}};
  write_file_atomic((tmp / "state.json").string(), j.dump(2) + "\n");
  fs::remove_all(old, ec);
  if (fs::exists(final_dir)) {
    fs::rename(final_dir, old, ec);
    if (ec) REMAT_THROW("cannot move the previous checkpoint ", final_dir.string(), " aside: ", ec.message());
  }
  fs::rename(tmp, final_dir, ec);
  if (ec) REMAT_THROW("cannot install checkpoint ", final_dir.string(), ": ", ec.message());
  fs::remove_all(old, ec);
}

namespace {

void load_into(const SafetensorsFile& f, const std::vector<std::pair<std::string, Tensor>>& targets,
               const std::string& path) {
  for (const auto& [name, t] : targets) {
    if (!f.has(name)) REMAT_THROW(path, ": missing tensor \"", name, "\" (is this checkpoint from another model?)");
    const SafetensorsEntry& e = f.entry(name);
    if (e.shape != t.shape() || e.dtype != t.dtype())
      REMAT_THROW(path, ": tensor \"", name, "\" is ", dtype_name(e.dtype), e.shape.str(), ", the model has ", t.str());
    Tensor src = f.tensor(name);
    Tensor dst = t;
    dst.copy_from(src);
  }
}

}  // namespace

CheckpointState load_checkpoint(const std::string& dir, ParamStore& params, const NamedTensors& optimizer_state) {
  // The complete checkpoint: the folder itself, or after a crash mid-swap the previous
  // one (.old) or the new one (.new: state.json is written last, so it is complete).
  std::string d = dir;
  if (!fs::exists(fs::path(d) / "state.json")) {
    if (fs::exists(fs::path(d + ".new") / "state.json"))
      d += ".new";
    else if (fs::exists(fs::path(d + ".old") / "state.json"))
      d += ".old";
    else
      REMAT_THROW("no checkpoint in ", dir, " (state.json missing)");
  }
  const std::string state_path = (fs::path(d) / "state.json").string();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(state_path));
  } catch (const nlohmann::json::exception& e) {
    REMAT_THROW(state_path, ": not valid JSON: ", e.what());
  }
  CheckpointState s;
  try {
    s.step = j.at("step").get<int64_t>();
    s.seed = j.at("seed").get<uint64_t>();
    s.rng_offset = j.at("rng_offset").get<uint64_t>();
    s.epoch = j.at("epoch").get<int64_t>();
    s.position = j.at("position").get<int64_t>();
    s.optimizer_steps = j.at("optimizer_steps").get<int64_t>();
    s.policy = j.at("policy").get<std::string>();
    s.config_name = j.at("config_name").get<std::string>();
    s.batch = j.at("batch").get<int64_t>();
    s.train_size = j.at("train_size").get<int64_t>();
    s.schedule_steps = j.value("schedule_steps", int64_t{0});  // absent before it was recorded
  } catch (const nlohmann::json::exception& e) {
    REMAT_THROW(state_path, ": missing or malformed field: ", e.what());
  }
  const std::string mp = (fs::path(d) / "model.safetensors").string();
  const std::string op = (fs::path(d) / "optimizer.safetensors").string();
  load_into(SafetensorsFile::load(mp), params.named_values(), mp);
  load_into(SafetensorsFile::load(op), optimizer_state, op);
  return s;
}

}  // namespace remat
