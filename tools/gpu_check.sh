#!/usr/bin/env bash
# The checks of a lent GPU machine, in one command of at most 8 minutes
# (docs/performance.md, "GPU checks"):
#
#   tools/gpu_check.sh
#
# Stages, in this order, each with its own time limit and log; a failed stage does not
# stop the others, and the script exits non-zero when any stage failed or was cut:
#   env        the machine: GPU, driver, toolkit, compilers, C library, PyTorch
#   configure  the `gpu` preset (native architecture) with REMAT_DEPS_PREFIX at the
#              packages tools/gpu_deps.sh gathered, without the CUDA emulator
#   build      the remat command and the GPU test binaries (test_*gpu*), on every core
#   ctest      `ctest -L gpu` (pass / skip / fail counts in the summary)
#   bench      `remat bench kernels` (GB/s and % of peak; GEMM TFLOP/s)
#   train_*    50 steps of each model x policy (step time, peak memory), TF32 GEMMs
#   torch      the same GPT-2 step in PyTorch eager on the same GPU (tools/torch_reference.py)
#   memcheck   the GPU test binaries under compute-sanitizer --tool memcheck
#   racecheck  the same under --tool racecheck
# then the summary table (tools/gpu_check_summary.py). Logs, run metrics and JSON go to
# build/gpu-check/; when $OUT is set (the device tool), the summary, the kernel JSON and a
# tarball of the logs are copied there (4 files).
#
# Environment (defaults in brackets); the dry run on a machine without a GPU is at the
# end of docs/performance.md:
#   GPU_CHECK_BUDGET_S   seconds for all stages, the summary excluded [465]
#   GPU_CHECK_STAGES     comma-separated stage names (or prefixes: train) to run [all]
#   GPU_CHECK_DEPS       the unpacked packages [third_party/gpu-deps/root; the system's if absent]
#   GPU_CHECK_PRESET     CMake configure preset [gpu]; its build folder is build/<preset>
#   GPU_CHECK_CMAKE_ARGS more configure arguments, appended []
#   GPU_CHECK_DEVICE     device of the kernel benchmarks [cuda]
#   GPU_CHECK_TRAIN_DEVICE device of the training runs; PyTorch uses cuda when it is cuda* [$GPU_CHECK_DEVICE]
#   GPU_CHECK_BENCH_ARGS more `remat bench kernels` arguments []
#   GPU_CHECK_MODELS     model configs: names in models/ or paths [gpt2_124m resnet_tiny]
#   GPU_CHECK_POLICIES   checkpoint policies [none sqrt selective]
#   GPU_CHECK_STEPS      training steps per run [50]
#   GPU_CHECK_TRAIN_ARGS more `remat train` arguments []
#   GPU_CHECK_TORCH_MODEL the model PyTorch times [gpt2_124m]
#   GPU_CHECK_TF32       1: TF32 GEMMs in remat (REMAT_TF32) and PyTorch; 0: fp32 [1]
#   GPU_CHECK_SANITIZER_FILTER  --gtest_filter of the GPU tests under the sanitizers [*-*OutOfMemory*]
#   GPU_CHECK_PYTHON     the Python with PyTorch [python3]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
self=$PWD/tools/gpu_check.sh

start=$(date +%s)
budget=${GPU_CHECK_BUDGET_S:-465}
deadline=$((start + budget))
stages_wanted=${GPU_CHECK_STAGES:-all}
deps=${GPU_CHECK_DEPS:-third_party/gpu-deps/root}
preset=${GPU_CHECK_PRESET:-gpu}
build=build/$preset
device=${GPU_CHECK_DEVICE:-cuda}
train_device=${GPU_CHECK_TRAIN_DEVICE:-$device}
read -r -a models <<<"${GPU_CHECK_MODELS:-gpt2_124m resnet_tiny}"
read -r -a policies <<<"${GPU_CHECK_POLICIES:-none sqrt selective}"
read -r -a cmake_args <<<"${GPU_CHECK_CMAKE_ARGS:-}"
read -r -a bench_args <<<"${GPU_CHECK_BENCH_ARGS:-}"
read -r -a train_args <<<"${GPU_CHECK_TRAIN_ARGS:-}"
steps=${GPU_CHECK_STEPS:-50}
torch_model=${GPU_CHECK_TORCH_MODEL:-gpt2_124m}
tf32=${GPU_CHECK_TF32:-1}
sanitizer_filter=${GPU_CHECK_SANITIZER_FILTER:-*-*OutOfMemory*}
python=${GPU_CHECK_PYTHON:-python3}
jobs=$(nproc 2>/dev/null || echo 4)

work=build/gpu-check
stages_tsv=$work/stages.tsv
failures=0

note() { printf '[gpu_check %4ds] %s\n' "$(($(date +%s) - start))" "$*"; }

wanted() {
  [[ $stages_wanted == all ]] && return 0
  local s
  IFS=, read -r -a sel <<<"$stages_wanted"
  for s in "${sel[@]}"; do [[ $1 == "$s" || $1 == "$s"_* ]] && return 0; done
  return 1
}

# stage NAME LIMIT_S COMMAND...: runs the command (a program, or a function of this
# script: it runs in `gpu_check.sh --run`, so that `timeout` can stop it with everything
# it started) with its output in logs/NAME.log, for at most LIMIT_S seconds and never
# past the deadline; records ok, failed, timeout or cut (no time left) in stages.tsv.
stage() {
  local name=$1 limit=$2
  shift 2
  wanted "$name" || return 0
  local log=$work/logs/$name.log now left t0 rc status
  now=$(date +%s)
  left=$((deadline - now))
  if ((left < 15)); then
    printf '%s\tcut\t0\t-\n' "$name" >>"$stages_tsv"
    note "$name: cut (the ${budget} s budget is spent)"
    failures=$((failures + 1))
    return 1
  fi
  ((limit > left)) && limit=$left
  note "$name: start (limit ${limit} s)"
  t0=$now
  timeout --kill-after=10 "$limit" bash "$self" --run "$@" >"$log" 2>&1
  rc=$?
  if ((rc == 0)); then status=ok
  elif ((rc == 124 || rc == 137)); then status=timeout
  else status=failed
  fi
  printf '%s\t%s\t%d\t%d\n' "$name" "$status" "$(($(date +%s) - t0))" "$rc" >>"$stages_tsv"
  note "$name: $status (rc $rc, $(($(date +%s) - t0)) s)"
  if [[ $status != ok ]]; then
    failures=$((failures + 1))
    tail -n 15 "$log" | sed 's/^/    | /'
  fi
  [[ $status == ok ]]
}

env_report() {
  set +e
  echo "== date"; date -u
  echo "== nvidia-smi"; nvidia-smi
  echo "== nvcc"; nvcc --version || /usr/local/cuda/bin/nvcc --version
  echo "== cmake"; cmake --version | head -1
  echo "== ninja"; ninja --version
  echo "== c++"; c++ --version | head -1
  echo "== C library"; ldd --version | head -1
  echo "== libstdc++ (newest GLIBCXX)"
  local lib
  lib=$(c++ -print-file-name=libstdc++.so.6)
  grep -ao 'GLIBCXX_[0-9.]*' "$lib" | sort -uV | tail -1
  echo "== compute-sanitizer"; compute-sanitizer --version | tail -1
  echo "== python3 / torch"
  "$python" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())'
  echo "== cores"; nproc
  echo "== dependencies"; cat "$deps/MANIFEST.txt"
  return 0
}

configure() {
  local args=(--preset "$preset" -DREMAT_EMU=OFF)
  if [[ -d $deps/usr ]]; then
    args+=("-DREMAT_DEPS_PREFIX=$(realpath "$deps")")
  else
    echo "gpu_check: no $deps (tools/gpu_deps.sh); using the system's packages"
  fi
  cmake "${args[@]}" "${cmake_args[@]}"
}

# The GPU test binaries: the build's test_*gpu* targets (test_backend_ops_gpu,
# test_device_exec_gpu, test_gpu_runtime, ...); the other tests are not built.
gpu_test_targets() {
  ninja -C "$build" -t targets all | grep -oE '^test_[A-Za-z0-9_]*gpu[A-Za-z0-9_]*:' | tr -d : | sort -u
}

build_targets() {
  local targets
  mapfile -t targets < <(gpu_test_targets)
  targets=(remat_cli "${targets[@]}")
  echo "building ${targets[*]} with $jobs jobs"
  cmake --build "$build" --target "${targets[@]}" -j "$jobs"
}

# A config with every step logged (log_every 1), from models/NAME.json or a path; a
# Fashion-MNIST model without the data set (none on the GPU machine) gets synthetic
# images of the same shape: the step costs the same.
derive_config() {
  local src=$1 dst=$2
  [[ -f $src ]] || src=models/$1.json
  python3 - "$src" "$dst" <<'EOF'
import json, os, sys
src, dst = sys.argv[1], sys.argv[2]
cfg = json.load(open(src))
cfg.setdefault("training", {})["log_every"] = 1
data = cfg.setdefault("data", {})
fm = os.environ.get("REMAT_FASHION_MNIST_DIR") or "/usr/share/datasets/fashion-mnist"
if data.get("dataset", "fashion_mnist") == "fashion_mnist" and not data.get("path") and \
        not os.path.exists(os.path.join(fm, "train-labels-idx1-ubyte.gz")):
    shape = cfg["model"]["input"].get("shape", [1, 28, 28])
    cfg["data"] = {"dataset": "synthetic_images", "image_shape": shape, "classes": 10, "synthetic_size": 4096}
    print(f"{src}: no Fashion-MNIST in {fm}: synthetic images {shape} instead")
json.dump(cfg, open(dst, "w"), indent=2)
EOF
}

train_run() {  # train_run MODEL POLICY
  local cfg=$work/configs/$1.json run=$work/runs/$1_$2
  [[ -f $cfg ]] || { echo "no config $cfg"; return 1; }
  if [[ $tf32 == 1 ]]; then export REMAT_TF32=1; fi
  "$build/remat" train "$cfg" --device "$train_device" --policy "$2" --steps "$steps" --out "$run" "${train_args[@]}"
  local rc=$?
  rm -rf "$run/init.safetensors" "$run/checkpoint"  # weights: large and not looked at
  return $rc
}

sanitize() {  # sanitize TOOL: every GPU test binary under compute-sanitizer
  local tool=$1 rc=0 extra=() t
  command -v compute-sanitizer >/dev/null || { echo "compute-sanitizer not found"; return 1; }
  [[ $tool == racecheck ]] && extra+=(--racecheck-report analysis)
  # API errors are remat's own checks' business (the out-of-memory test provokes one).
  local cs=(compute-sanitizer --tool "$tool" --error-exitcode 99 --report-api-errors no --print-limit 20 "${extra[@]}")
  for t in $(gpu_test_targets); do
    echo "== $t --gtest_filter=$sanitizer_filter"
    "${cs[@]}" "$build/tests/$t" --gtest_filter="$sanitizer_filter" --gtest_brief=1 || rc=$?
  done
  return $rc
}

# A stage's command, in a process of its own (see stage).
if [[ ${1:-} == --run ]]; then
  shift
  "$@"
  exit
fi

rm -rf "$work"
mkdir -p "$work/logs" "$work/runs" "$work/configs"
: >"$stages_tsv"
note "budget ${budget} s, devices $device (bench) and $train_device (training), $jobs cores, preset $preset, deps $deps"
unset REMAT_TF32  # the op tests compare fp32 GEMMs; train_run sets it for the training runs
stage env 30 env_report
stage configure 120 configure
stage build 360 build_targets
stage ctest 150 ctest --test-dir "$build" -L gpu --no-tests=error -j 8 --timeout 90 --output-on-failure
stage bench 120 "$build/remat" bench kernels --device "$device" --json "$work/bench_kernels.json" "${bench_args[@]}"
for m in "${models[@]}"; do
  name=$(basename "$m" .json)
  derive_config "$m" "$work/configs/$name.json" >>"$work/logs/configs.log" 2>&1
  for p in "${policies[@]}"; do
    stage "train_${name}_${p}" 150 train_run "$name" "$p"
  done
done
torch_args=(time "$work/configs/$torch_model.json" --steps 20 --json "$work/torch_$torch_model.json")
[[ -f $work/configs/$torch_model.json ]] || torch_args[1]=models/$torch_model.json
if [[ $train_device == cuda* && $train_device != cuda-emu ]]; then
  torch_args+=(--device "$train_device")
  [[ $tf32 == 1 ]] && torch_args+=(--tf32)
fi
stage torch 150 "$python" tools/torch_reference.py "${torch_args[@]}"
stage memcheck 120 sanitize memcheck
stage racecheck 90 sanitize racecheck

note "summary"
python3 tools/gpu_check_summary.py "$work" --tf32 "$tf32" --torch-model "$torch_model" | tee "$work/summary.txt"
(shopt -s nullglob && cd "$work" && tar -czf logs.tar.gz logs runs configs stages.tsv ./*.json)
if [[ -n ${OUT:-} ]]; then
  mkdir -p "$OUT"
  cp "$work/summary.txt" "$OUT/gpu_check_summary.txt"
  cp "$work/summary.json" "$OUT/gpu_check_summary.json" 2>/dev/null
  cp "$work/bench_kernels.json" "$OUT/bench_kernels.json" 2>/dev/null
  cp "$work/logs.tar.gz" "$OUT/gpu_check_logs.tar.gz"
  note "copied the summary, bench_kernels.json and gpu_check_logs.tar.gz to \$OUT"
fi
note "done: $failures stage(s) failed or cut"
((failures == 0))
