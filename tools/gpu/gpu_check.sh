#!/usr/bin/env bash
# The checks of a lent GPU machine, in one command inside a 465 s budget
# (docs/performance.md, "GPU checks"):
#
#   tools/gpu/gpu_check.sh             # on the GPU machine
#   tools/gpu/gpu_check.sh --dry-run   # anywhere: every stage against cuda-emu, small shapes
#
# Stages, most valuable first, each with its own budget (seconds; they sum to 465) and log.
# A stage's time limit is the end of its slot in that plan (start + the budgets up to and
# including it), so time an earlier stage left over goes to the next; a stage never runs
# past the whole budget. A failed stage does not stop the others, except preflight and
# device (no usable GPU: the rest would only skip); the script exits non-zero when any
# stage failed, was cut or was not reached.
#   env        8  the machine: GPU, driver, toolkit, compilers, C library, PyTorch
#   preflight  5  fatal: the CUDA toolkit found; a GPU visible (nvidia-smi -L); the driver's
#                 CUDA version not older than the toolkit's (else cudaErrorInsufficientDriver,
#                 35); the carried packages' GLIBC/GLIBCXX needs met by this machine
#   configure 25  the `gpu` preset (native architecture) with REMAT_DEPS_PREFIX at the
#                 packages tools/gpu/gpu_deps.sh gathered, without the CUDA emulator
#   build    150  the remat command and the GPU test binaries (test_*gpu*), on every core
#   device     5  fatal: `remat info` sees cuda:0 (the runtime's own verdict, error 35 included)
#   ctest     55  `ctest -L gpu -LE mpi`; fails when a test fails, or any is skipped (no GPU)
#   nccl       8  the build has NCCL and test_nccl_gpu passes (one rank: the communicator, the
#                 collectives on the backend's stream, the reducer bitwise the local fold);
#                 then, where mpirun and MPI are there, `mpirun -np 1 remat train` on cuda
#                 bitwise one process (tests/test_mpi_nccl.sh); skipped, saying so, otherwise
#   bench     25  `remat bench kernels` (GB/s and % of peak; GEMM TFLOP/s: fp32, TF32, bf16
#                 square and at GPT-2 124M's shapes, % of the dense bf16 peak; the fused
#                 attention's forward and forward + backward TFLOP/s, causal, bf16 at T 1024
#                 and 4096, head dims 64 and 128, against FlashAttention-2's published figures)
#   link       5  `remat bench link`: the host link each way as activation offload copies
#                 (pinned memory, the copy stream), for `remat plan --offload --link-gbps`
#   train_gpt2_124m_{none,sqrt,selective}  20 each: 30 steps (step time, peak memory), TF32 GEMMs
#   torch     25  the same GPT-2 step in PyTorch eager on the same GPU (tools/reference/torch_reference.py)
#   train_gpt2_124m_bf16_none  20  the GPT-2 step in bf16 (--precision bf16)
#   torch_bf16 25  PyTorch's GPT-2 step under autocast bf16
#   train_resnet_tiny_{none,sqrt,selective}  8 each
#   memcheck  20  the op cases (test_backend_ops_gpu) under compute-sanitizer --tool memcheck
#   racecheck  5  the same under --tool racecheck (and what earlier stages left over)
# then the summary (tools/gpu/gpu_check_summary.py): rewritten after every stage, and printed
# on exit whatever happened (an EXIT trap; INT and TERM stop the running stage first), so
# a cut run still reports what it measured. Logs, run metrics and JSON go to the work
# folder; when $OUT is set (the device tool), the summary, the kernel JSON and a tarball
# of the logs are copied there (4 files), after every stage too.
#
# compute-sanitizer, nvcc, ninja and cmake are looked for on PATH, then under the CUDA
# toolkit folder ($CUDA_HOME, $CUDA_PATH, nvcc's, /usr/local/cuda, the newest
# /usr/local/cuda-*, /opt/cuda: bin/ and compute-sanitizer/), then (ninja, cmake) in the
# Python's pip packages.
#
# --dry-run: the same stages on a machine without a GPU, against the binaries of an
# existing build folder (build/default: configure and build only check it is there; the
# gpu test binaries are those of the emulator), the devices cuda-emu, small shapes, a
# stand-in compute-sanitizer (runs the binary; REMAT_EMU_RACECHECK=1 for racecheck) and no
# nvidia-smi (preflight checks the toolkit and cuda-emu instead). ctest runs it (label unit).
#
# Environment (defaults in brackets; the dry run's after a slash):
#   GPU_CHECK_BUDGET_S   seconds for all stages, the summary excluded [465]
#   GPU_CHECK_STAGES     comma-separated stage names (or prefixes: train) to run [all]
#   GPU_CHECK_WORK       the work folder [build/gpu-check / build/gpu-check-dry]
#   GPU_CHECK_DEPS       the unpacked packages [third_party/gpu-deps/root; the system's if absent]
#   GPU_CHECK_PRESET     CMake configure preset [gpu / default]; its build folder is build/<preset>
#   GPU_CHECK_BUILD_DIR  the build folder [build/<preset>]
#   GPU_CHECK_CMAKE_ARGS more configure arguments, appended []
#   GPU_CHECK_DEVICE     device of the kernel benchmarks [cuda / cuda-emu]
#   GPU_CHECK_TRAIN_DEVICE device of the training runs; PyTorch uses cuda when it is cuda* [$GPU_CHECK_DEVICE]
#   GPU_CHECK_BENCH_ARGS more `remat bench kernels` arguments [ / small sizes]
#   GPU_CHECK_CTEST_ARGS the ctest selection [-L gpu -LE mpi / two small emulator tests]
#   GPU_CHECK_MODELS     model configs: names in models/ or paths [gpt2_124m resnet_tiny / tiny ones]
#   GPU_CHECK_POLICIES   checkpoint policies [none sqrt selective]
#   GPU_CHECK_STEPS      training steps per run [30 / 2]
#   GPU_CHECK_TRAIN_ARGS more `remat train` arguments [ / --batch 2]
#   GPU_CHECK_TORCH_MODEL the model PyTorch times [gpt2_124m / gpt_char_tiny]
#   GPU_CHECK_TORCH_STEPS steps PyTorch times [20 / 2]
#   GPU_CHECK_TF32       1: TF32 GEMMs in remat (REMAT_TF32) and PyTorch; 0: fp32 [1]
#   GPU_CHECK_BF16       1: after PyTorch's step, the torch model's bf16 step (policy none)
#                        in remat (--precision bf16) and in PyTorch (autocast bf16); 0: not [1]
#   GPU_CHECK_SANITIZER_BINARIES test binaries under the sanitizers [test_backend_ops_gpu / test_backend_ops_race]
#                        (empty: every test_*gpu* target)
#   GPU_CHECK_SANITIZER_FILTER  their --gtest_filter [Ops/BackendOps.MatchesCpu/* / the conv2d and softmax cases]
#   GPU_CHECK_PYTHON     the Python with PyTorch [python3]
#   GPU_CHECK_NVIDIA_SMI the nvidia-smi command [nvidia-smi / none]
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
self=$PWD/tools/gpu/gpu_check.sh

dry_run=0
if [[ ${1:-} == --dry-run ]]; then
  dry_run=1
  shift
fi
dry() { ((dry_run)) && echo "$1" || echo "$2"; }

budget=${GPU_CHECK_BUDGET_S:-465}
stages_wanted=${GPU_CHECK_STAGES:-all}
deps=${GPU_CHECK_DEPS:-third_party/gpu-deps/root}
preset=${GPU_CHECK_PRESET:-$(dry default gpu)}
build=${GPU_CHECK_BUILD_DIR:-build/$preset}
device=${GPU_CHECK_DEVICE:-$(dry cuda-emu cuda)}
train_device=${GPU_CHECK_TRAIN_DEVICE:-$device}
read -r -a models <<<"${GPU_CHECK_MODELS:-$(dry "tests/configs/gpt_char_tiny.json resnet_tiny" "gpt2_124m resnet_tiny")}"
read -r -a policies <<<"${GPU_CHECK_POLICIES:-none sqrt selective}"
read -r -a cmake_args <<<"${GPU_CHECK_CMAKE_ARGS:-}"
read -r -a bench_args <<<"${GPU_CHECK_BENCH_ARGS:-$(dry "--elements 4096 --gemm-size 16 --iters 1 --warmup 1 --attention-tokens 64 --attention-seq 64 --attention-width 128" "")}"
read -r -a ctest_args <<<"${GPU_CHECK_CTEST_ARGS:-$(dry "-L kernels -R ^(bench_kernels_smoke|Emu.*Shuffle.*)$" "-L gpu -LE mpi")}"
read -r -a train_args <<<"${GPU_CHECK_TRAIN_ARGS:-$(dry "--batch 2" "")}"
steps=${GPU_CHECK_STEPS:-$(dry 2 30)}
torch_model=${GPU_CHECK_TORCH_MODEL:-$(dry gpt_char_tiny gpt2_124m)}
torch_steps=${GPU_CHECK_TORCH_STEPS:-$(dry 2 20)}
tf32=${GPU_CHECK_TF32:-1}
bf16=${GPU_CHECK_BF16:-1}
# Under the sanitizers: the op cases (small shapes, every kernel; the training tests would
# not fit the stages' budgets under memcheck).
sanitizer_filter=${GPU_CHECK_SANITIZER_FILTER:-$(dry "*BackendOps.MatchesCpu/conv2d*:*BackendOps.MatchesCpu/softmax*" "Ops/BackendOps.MatchesCpu/*")}
sanitizer_binaries=${GPU_CHECK_SANITIZER_BINARIES-$(dry "test_backend_ops_race" "test_backend_ops_gpu")}
python=${GPU_CHECK_PYTHON:-python3}
nvidia_smi=${GPU_CHECK_NVIDIA_SMI:-$(dry none nvidia-smi)}
jobs=$(nproc 2>/dev/null || echo 4)

work=${GPU_CHECK_WORK:-$(dry build/gpu-check-dry build/gpu-check)}
stages_tsv=$work/stages.tsv
plan_tsv=$work/plan.tsv

# The toolkit folder and the tools under it (see the header).
cuda_home() {
  local c nv
  for c in "${CUDA_HOME:-}" "${CUDA_PATH:-}"; do [[ -n $c && -x $c/bin/nvcc ]] && { echo "$c"; return 0; }; done
  if nv=$(command -v nvcc 2>/dev/null); then
    c=$(dirname "$(dirname "$(readlink -f "$nv")")")
    [[ -x $c/bin/nvcc ]] && { echo "$c"; return 0; }
  fi
  local versioned
  mapfile -t versioned < <(printf '%s\n' /usr/local/cuda-* | grep -v '\*' | sort -V -r)
  for c in /usr/local/cuda "${versioned[@]}" /opt/cuda; do
    [[ -x $c/bin/nvcc ]] && { echo "$c"; return 0; }
  done
  return 1
}
cuda=$(cuda_home) || cuda=""
if [[ -n $cuda ]]; then
  for d in "$cuda/bin" "$cuda/compute-sanitizer"; do
    [[ -d $d && ":$PATH:" != *":$d:"* ]] && PATH=$PATH:$d
  done
fi
for tool in ninja cmake; do
  command -v "$tool" >/dev/null 2>&1 && continue
  d=$("$python" -c "import $tool, os; print(getattr($tool, 'BIN_DIR', ''))" 2>/dev/null) || d=""
  [[ -n $d && -x $d/$tool ]] && PATH=$PATH:$d
done
export PATH

# The plan: stage name and budget, in order (the train stages per model and policy).
plan=()
add_plan() { plan+=("$1:$2"); }
model_name() { basename "$1" .json; }
train_budget() { [[ $(model_name "$1") == resnet* ]] && echo 8 || echo 20; }
add_plan env 8
add_plan preflight 5
add_plan configure 25
add_plan build 150
add_plan device 5
add_plan ctest 55
add_plan nccl 8
add_plan bench 25
add_plan link 5
torch_added=0
torch_plan() {  # PyTorch's fp32 step, then remat's and PyTorch's bf16 steps (GPT-2: issue 14's target)
  add_plan torch 25
  ((bf16)) && add_plan "train_${torch_model}_bf16_none" 20 && add_plan torch_bf16 25
  torch_added=1
}
for m in "${models[@]}"; do
  for p in "${policies[@]}"; do add_plan "train_$(model_name "$m")_$p" "$(train_budget "$m")"; done
  [[ $(model_name "$m") == "$torch_model" ]] && torch_plan
done
((torch_added)) || torch_plan
add_plan memcheck 20
add_plan racecheck 5

note() { printf '[gpu_check %4ds] %s\n' "$(($(date +%s) - start))" "$*"; }
loud() {
  printf '\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n'
  printf '!!! gpu_check: %s\n' "$@"
  printf '!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\n'
}

wanted() {
  [[ $stages_wanted == all ]] && return 0
  local s
  IFS=, read -r -a sel <<<"$stages_wanted"
  for s in "${sel[@]}"; do [[ $1 == "$s" || $1 == "$s"_* ]] && return 0; done
  return 1
}

# "13.0" from `nvcc --version` ("release 13.0, V13.0.88").
toolkit_version() { nvcc --version 2>/dev/null | grep -o 'release [0-9]*\.[0-9]*' | head -1 | cut -d' ' -f2; }
# The newest CUDA the driver supports, from nvidia-smi's header ("CUDA Version: 12.8").
driver_cuda_version() { "$nvidia_smi" 2>/dev/null | grep -o 'CUDA Version: *[0-9]*\.[0-9]*' | head -1 | grep -o '[0-9.]*$'; }
# The newest GLIBCXX_ symbol version of a libstdc++.
glibcxx_of() { grep -ao 'GLIBCXX_[0-9][0-9.]*' "$1" 2>/dev/null | sort -uV | tail -1; }
# ver_ge A B: version A >= version B.
ver_ge() { [[ $(printf '%s\n%s\n' "$1" "$2" | sort -V | head -1) == "$2" ]]; }

# versions_compatible DRIVER_CUDA TOOLKIT_CUDA: an error naming cudaErrorInsufficientDriver
# when the driver's major version is older (nothing runs); a warning when only the minor
# is (CUDA's minor version compatibility runs the native-architecture build).
versions_compatible() {
  local drv=$1 tk=$2
  [[ -n $drv && -n $tk ]] || { echo "driver CUDA '${drv}' or toolkit '${tk}' unknown"; return 1; }
  if ((${drv%%.*} < ${tk%%.*})); then
    echo "the driver supports CUDA $drv, older than the toolkit's $tk: every CUDA call would fail with"
    echo "cudaErrorInsufficientDriver (35). Use a toolkit of CUDA ${drv%%.*} (CUDA_HOME=...) or a newer driver."
    return 1
  fi
  if ! ver_ge "$drv" "$tk"; then
    echo "warning: the driver supports CUDA $drv, the toolkit is $tk: minor version compatibility"
    echo "runs the native-architecture build (no PTX JIT)"
  fi
  echo "driver CUDA $drv >= toolkit CUDA $tk (major): ok"
}

# deps_compatible MANIFEST: this machine's C library and libstdc++ provide the newest
# GLIBC_ and GLIBCXX_ versions the carried packages need (MANIFEST.txt's "needs:" line).
deps_compatible() {
  local manifest=$1 need_glibc need_glibcxx have_glibc lib have_glibcxx="" v rc=0
  need_glibc=$(grep -o 'GLIBC_[0-9.]*' "$manifest" | head -1)
  need_glibcxx=$(grep -o 'GLIBCXX_[0-9.]*' "$manifest" | head -1)
  have_glibc=GLIBC_$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
  # The libstdc++ the programs load (the loader's) and the one they link (the compiler's):
  # the older of the two counts.
  for lib in $(/sbin/ldconfig -p 2>/dev/null | awk '/libstdc\+\+\.so\.6 .*x86-64/ {print $NF}' | head -1) \
    "$(c++ -print-file-name=libstdc++.so.6 2>/dev/null)"; do
    [[ -f $lib ]] || continue
    v=$(glibcxx_of "$lib")
    [[ -z $have_glibcxx ]] || ver_ge "$v" "$have_glibcxx" || have_glibcxx=$v
    [[ -n $have_glibcxx ]] || have_glibcxx=$v
  done
  echo "carried packages need ${need_glibc:-?} ${need_glibcxx:-?}; this machine has $have_glibc ${have_glibcxx:-GLIBCXX_?}"
  if [[ -n $need_glibc ]] && ! ver_ge "${have_glibc#GLIBC_}" "${need_glibc#GLIBC_}"; then
    echo "the C library is older than the packages need: gather them on an older Debian (tools/gpu/gpu_deps.sh)"
    rc=1
  fi
  if [[ -n $need_glibcxx ]] && ! ver_ge "${have_glibcxx#GLIBCXX_}" "${need_glibcxx#GLIBCXX_}"; then
    echo "libstdc++ is older than the packages need: gather them on an older Debian (tools/gpu/gpu_deps.sh)"
    rc=1
  fi
  return "$rc"
}

env_report() {
  set +e
  echo "== date"; date -u
  echo "== CUDA toolkit folder"; echo "${cuda:-not found}"
  echo "== nvidia-smi"; "$nvidia_smi"
  echo "== nvcc"; nvcc --version
  echo "== cmake"; cmake --version | head -1
  echo "== ninja"; ninja --version
  echo "== c++"; c++ --version | head -1
  echo "== C library"; ldd --version | head -1
  echo "== libstdc++ (newest GLIBCXX)"; glibcxx_of "$(c++ -print-file-name=libstdc++.so.6)"
  echo "== compute-sanitizer"; command -v compute-sanitizer && compute-sanitizer --version | tail -1
  echo "== python3 / torch"
  "$python" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())'
  echo "== cores"; nproc
  echo "== dependencies"; cat "$deps/MANIFEST.txt"
  return 0
}

preflight() {
  local rc=0 tk drv gpus out
  echo "== CUDA toolkit"
  if [[ -z $cuda ]]; then
    echo "FAIL: no CUDA toolkit: no nvcc on PATH, in \$CUDA_HOME, \$CUDA_PATH, /usr/local/cuda* or /opt/cuda"
    return 1
  fi
  tk=$(toolkit_version)
  echo "$cuda: CUDA $tk"
  for t in nvcc ninja cmake compute-sanitizer; do
    printf '  %-18s %s\n' "$t" "$(command -v "$t" || echo 'NOT FOUND')"
  done
  if ! command -v cmake >/dev/null || { ((!dry_run)) && ! command -v ninja >/dev/null; }; then
    echo "FAIL: $(dry cmake 'ninja and cmake') needed"  # the dry run builds nothing: any generator's folder
    rc=1
  fi
  echo "== GPU and driver"
  if ((dry_run)); then
    echo "dry run: no nvidia-smi; the device stage looks for cuda-emu"
  elif ! command -v "$nvidia_smi" >/dev/null; then
    echo "FAIL: no $nvidia_smi: no NVIDIA driver on this machine"
    rc=1
  else
    gpus=$("$nvidia_smi" -L 2>&1 | grep -c '^GPU [0-9]')
    echo "$nvidia_smi -L: $gpus GPU(s)"
    if ((gpus == 0)); then
      "$nvidia_smi" -L 2>&1 | head -5
      echo "FAIL: no GPU visible (nvidia-smi -L lists none)"
      rc=1
    fi
    if [[ ${CUDA_VISIBLE_DEVICES+set} && -z ${CUDA_VISIBLE_DEVICES// /} ]]; then
      echo "FAIL: CUDA_VISIBLE_DEVICES is set and empty: CUDA sees no device"
      rc=1
    fi
    drv=$(driver_cuda_version)
    out=$(versions_compatible "$drv" "$tk") || { rc=1; out=$(tr '\n' ' ' <<<"$out" | sed 's/^/FAIL: /'); }
    echo "$out"
  fi
  echo "== carried packages ($deps)"
  if [[ -f $deps/MANIFEST.txt ]]; then
    out=$(deps_compatible "$deps/MANIFEST.txt") || { rc=1; out=$(tr '\n' ' ' <<<"$out" | sed 's/^/FAIL: /'); }
    echo "$out"
  else
    echo "none: the system's packages"
  fi
  return "$rc"
}

configure() {
  if ((dry_run)); then
    [[ -f $build/CMakeCache.txt ]] || { echo "dry run: $build is not configured"; return 1; }
    grep -E '^(REMAT_EMU|REMAT_CUDA|CMAKE_BUILD_TYPE):' "$build/CMakeCache.txt"
    return 0
  fi
  local args=(--preset "$preset" -DREMAT_EMU=OFF) nccl
  [[ -n $cuda ]] && args+=("-DCMAKE_CUDA_COMPILER=$cuda/bin/nvcc" "-DCUDAToolkit_ROOT=$cuda")
  if nccl=$(nccl_root); then
    echo "gpu_check: NCCL in $nccl"
    args+=("-DNCCL_ROOT=$nccl")
  else
    echo "gpu_check: no NCCL (nccl.h) under the toolkit nor in $python's nvidia packages: built without it"
  fi
  if [[ -d $deps/usr ]]; then
    args+=("-DREMAT_DEPS_PREFIX=$(realpath "$deps")")
  else
    echo "gpu_check: no $deps (tools/gpu/gpu_deps.sh); using the system's packages"
  fi
  cmake "${args[@]}" "${cmake_args[@]}"
}

# NCCL's folder (include/nccl.h, lib/libnccl.so*): the toolkit's, else a pip wheel's
# (nvidia-nccl-cu*: nvidia/nccl/include, nvidia/nccl/lib) in the Python's packages.
nccl_root() {
  [[ -n $cuda && -f $cuda/include/nccl.h ]] && { echo "$cuda"; return 0; }
  local code h
  code='import glob, os, site, sys
for d in site.getsitepackages() + [site.getusersitepackages()] + sys.path:
    for h in sorted(glob.glob(os.path.join(d, "nvidia", "**", "include", "nccl.h"), recursive=True)):
        print(os.path.dirname(os.path.dirname(h)))
        sys.exit(0)
sys.exit(1)'
  h=$("$python" -c "$code" 2>/dev/null) || return 1
  [[ -n $h ]] && echo "$h"
}

# The NCCL path (docs/distributed.md): this build has NCCL, its one-rank tests pass (the
# dry run: they are built; they skip without a GPU), then mpirun -np 1 on the GPU against
# one process where mpirun and MPI are there (the dry run: on cuda-emu, through the host).
nccl_check() {
  local info out rc
  info=$("$build/remat" info 2>&1)
  grep -E '^  (MPI|NCCL) ' <<<"$info"
  if ((!dry_run)) && ! grep -Eq '^  NCCL +[0-9]' <<<"$info"; then
    echo "FAIL: this build has no NCCL: no nccl.h and libnccl under the toolkit or in the Python's nvidia packages"
    return 1
  fi
  [[ -x $build/tests/test_nccl_gpu ]] || { echo "FAIL: $build/tests/test_nccl_gpu is not built"; return 1; }
  out=$("$build/tests/test_nccl_gpu" --gtest_brief=1 2>&1)
  rc=$?
  echo "$out"
  ((rc == 0)) || { echo "FAIL: test_nccl_gpu failed"; return 1; }
  if ((!dry_run)) && ! grep -Eq '^\[  PASSED  \] 3 tests' <<<"$out"; then
    echo "FAIL: test_nccl_gpu did not pass its 3 tests (skipped on a GPU machine?)"
    return 1
  fi
  if ! command -v mpirun >/dev/null 2>&1; then
    echo "SKIPPED (mpirun part): no mpirun on this machine; the one-rank NCCL path ran above (test_nccl_gpu)"
    return 0
  fi
  MPI_NCCL_QUICK=1 bash tests/test_mpi_nccl.sh "$build/remat" mpirun "$(dry cuda-emu cuda)"
  rc=$?
  if ((rc == 77)); then
    echo "SKIPPED (mpirun part): see the line above; the one-rank NCCL path ran above (test_nccl_gpu)"
    return 0
  fi
  return "$rc"
}

# The GPU test binaries: the build's test_*gpu* targets (test_backend_ops_gpu,
# test_device_exec_gpu, test_gpu_runtime, ...); the other tests are not built.
gpu_test_targets() {
  # `cmake --build --target help` lists them for any generator: "... name" (Makefiles),
  # "name: phony" (Ninja).
  cmake --build "$build" --target help 2>/dev/null | sed -E 's/^\.\.\. //; s/:.*$//' |
    grep -xE 'test_[A-Za-z0-9_]*gpu[A-Za-z0-9_]*' | sort -u
}
sanitizer_targets() {
  if [[ -n $sanitizer_binaries ]]; then tr ' ' '\n' <<<"$sanitizer_binaries"; else gpu_test_targets; fi
}

build_targets() {
  local targets t
  mapfile -t targets < <(gpu_test_targets)
  ((${#targets[@]})) || { echo "no test_*gpu* targets in $build (a build without CUDA?)"; return 1; }
  if ((dry_run)); then  # the binaries of the build folder, as they are
    for t in remat $(sanitizer_targets | sed 's|^|tests/|'); do
      [[ -x $build/$t ]] || { echo "dry run: $build/$t is not built"; return 1; }
      echo "$build/$t"
    done
    return 0
  fi
  targets=(remat_cli "${targets[@]}")
  echo "building ${targets[*]} with $jobs jobs"
  cmake --build "$build" --target "${targets[@]}" -j "$jobs"
}

# The runtime's own verdict: `remat info` lists cuda:0 (cudaGetDeviceCount succeeded and
# found one); its "unavailable" line names the error (35: the driver is too old).
device_check() {
  local info want
  info=$("$build/remat" info 2>&1)
  echo "$info"
  want=$(dry 'cuda-emu +available' 'cuda:0 ')
  if ! grep -Eq "^ *$want" <<<"$info"; then
    echo "FAIL: no ${want%% *} in \`remat info\`: $(grep -E '^ *cuda' <<<"$info" | tr '\n' ' ')"
    grep -E '^ *cuda' <<<"$info"
    return 1
  fi
}

# ctest, then its counts: a skipped test fails the stage (on a GPU machine a GPU test only
# skips when it sees no device), and so does an empty selection.
ctest_run() {
  local log=$work/logs/ctest_output.txt rc passed skipped
  # At most 8 at once: on one GPU each test process makes its own CUDA context.
  ctest --test-dir "$build" "${ctest_args[@]}" --no-tests=error -j "$((jobs < 8 ? jobs : 8))" --timeout 90 \
    --output-on-failure 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  passed=$(grep -cE 'Test +#[0-9]+: .* Passed' "$log")
  skipped=$(grep -cE 'Test +#[0-9]+: .*Skipped' "$log")
  echo "gpu_check: ctest rc $rc, passed $passed, skipped $skipped"
  if ((skipped > 0)); then
    echo "gpu_check: $skipped test(s) skipped: a GPU test skips only when it sees no CUDA device"
    ((passed == 0)) && echo "gpu_check: every selected test skipped"
    return 1
  fi
  ((passed > 0)) || { echo "gpu_check: no test passed"; return 1; }
  return "$rc"
}

# A config with every step logged (log_every 1) and one evaluation batch, from
# models/NAME.json or a path; a
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
cfg["training"]["eval_batches"] = 1  # the check times steps: one evaluation batch is enough
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

train_run() {  # train_run MODEL POLICY [bf16]: the run's folder is runs/MODEL_POLICY or runs/MODEL_bf16_POLICY
  local cfg=$work/configs/$1.json run=$work/runs/$1_$2 precision=()
  [[ -f $cfg ]] || { echo "no config $cfg"; return 1; }
  if [[ ${3:-} == bf16 ]]; then
    run=$work/runs/$1_bf16_$2
    precision=(--precision bf16)
  fi
  if [[ $tf32 == 1 ]]; then export REMAT_TF32=1; fi
  "$build/remat" train "$cfg" --device "$train_device" --policy "$2" --steps "$steps" --out "$run" "${precision[@]}" "${train_args[@]}"
  local rc=$?
  rm -rf "$run/init.safetensors" "$run/checkpoint"  # weights: large and not looked at
  return "$rc"
}

# The dry run's compute-sanitizer: its options skipped, the program run (with the
# emulator's race check for --tool racecheck), the program's exit status kept.
fake_sanitizer() {
  mkdir -p "$work/bin"
  cat >"$work/bin/compute-sanitizer" <<'EOF'
#!/usr/bin/env bash
tool=memcheck
while [[ $# -gt 0 && $1 == -* ]]; do
  case $1 in
    --tool) tool=$2; shift 2 ;;
    --version) echo "gpu_check dry-run stand-in"; exit 0 ;;
    --*) shift 2 ;;
  esac
done
echo "(dry-run compute-sanitizer --tool $tool: $1)"
[[ $tool == racecheck ]] && export REMAT_EMU_RACECHECK=1
exec "$@"
EOF
  chmod +x "$work/bin/compute-sanitizer"
}

sanitize() {  # sanitize TOOL: every GPU test binary under compute-sanitizer
  local tool=$1 rc=0 extra=() t
  command -v compute-sanitizer >/dev/null || {
    echo "compute-sanitizer not found on PATH nor under the toolkit (${cuda:-none})"
    return 1
  }
  [[ $tool == racecheck ]] && extra+=(--racecheck-report analysis)
  # API errors are remat's own checks' business (the out-of-memory test provokes one).
  local cs=(compute-sanitizer --tool "$tool" --error-exitcode 99 --report-api-errors no --print-limit 20 "${extra[@]}")
  local out=$work/logs/sanitize_$tool.txt
  for t in $(sanitizer_targets); do
    echo "== $t --gtest_filter=$sanitizer_filter"
    "${cs[@]}" "$build/tests/$t" --gtest_filter="$sanitizer_filter" --gtest_brief=1 2>&1 | tee "$out"
    local status=${PIPESTATUS[0]}
    ((status == 0)) || rc=$status
    if ! grep -Eq '^\[  PASSED  \] [1-9]' "$out"; then
      echo "gpu_check: no test of $t passed under the filter: nothing was checked"
      ((rc == 0)) && rc=1
    fi
  done
  return "$rc"
}

# A stage's command, in a process of its own (see stage).
if [[ ${1:-} == --run ]]; then
  shift
  ((dry_run)) && PATH=$work/bin:$PATH
  "$@"
  exit
fi

start=$(date +%s)
deadline=$((start + budget))
slot_end=$start   # the end of the current stage's slot in the plan
fatal=""          # set by a failed fatal stage: the stages after it are not run
stage_pid=""
stage_name=""
stage_t0=0
summarized=0

budget_of() {
  local e
  for e in "${plan[@]}"; do [[ ${e%%:*} == "$1" ]] && { echo "${e##*:}"; return; }; done
  echo 0
}

record() { printf '%s\t%s\t%d\t%s\n' "$1" "$2" "$3" "$4" >>"$stages_tsv"; }

summary() {
  python3 tools/gpu/gpu_check_summary.py "$work" --tf32 "$tf32" --torch-model "$torch_model" >"$work/summary.txt" 2>&1
  (shopt -s nullglob && cd "$work" && tar -czf logs.tar.gz logs runs configs plan.tsv stages.tsv ./*.json 2>/dev/null)
  if [[ -n ${OUT:-} ]]; then
    mkdir -p "$OUT"
    cp "$work/summary.txt" "$OUT/gpu_check_summary.txt"
    cp "$work/summary.json" "$OUT/gpu_check_summary.json" 2>/dev/null
    cp "$work/bench_kernels.json" "$OUT/bench_kernels.json" 2>/dev/null
    cp "$work/logs.tar.gz" "$OUT/gpu_check_logs.tar.gz"
  fi
}

on_exit() {
  local rc=$?
  ((summarized)) && return
  summarized=1
  note "summary"
  summary
  cat "$work/summary.txt"
  [[ -n ${OUT:-} ]] && note "copied the summary, bench_kernels.json and gpu_check_logs.tar.gz to \$OUT"
  [[ -n $fatal ]] && loud "$fatal" "the stages after it were not run; see $work/logs/${fatal%%:*}.log"
  # Every planned stage counts: one that never recorded a result (cut by a signal) is not ok.
  local bad
  bad=$(awk -F'\t' 'NR == FNR { if ($2 == "ok") ok[$1] = 1; next } !($1 in ok)' "$stages_tsv" "$plan_tsv" | wc -l)
  note "done: $bad stage(s) not ok"
  ((bad == 0 && rc == 0)) || exit 1
}

on_signal() {
  note "interrupted: stopping the running stage, then the summary"
  if [[ -n $stage_pid ]]; then
    kill -TERM "$stage_pid" 2>/dev/null
    wait 2>/dev/null
    record "$stage_name" interrupted "$(($(date +%s) - stage_t0))" -
  fi
  exit 1
}

# stage NAME COMMAND...: runs the command (a program, or a function of this script: it runs
# in `gpu_check.sh --run`, so that `timeout` can stop it with everything it started) with
# its output in logs/NAME.log, until the end of its slot in the plan and never past the
# deadline; records ok, failed, timeout, cut (no time left) or skipped (after a fatal
# stage) in stages.tsv.
stage() {
  local name=$1
  shift
  wanted "$name" || return 0
  slot_end=$((slot_end + $(budget_of "$name")))
  ((slot_end > deadline)) && slot_end=$deadline
  local log=$work/logs/$name.log now limit t0 rc status
  if [[ -n $fatal ]]; then
    record "$name" skipped 0 -
    return 1
  fi
  now=$(date +%s)
  limit=$((slot_end - now))
  if ((limit < 3 || deadline - now < 3)); then
    record "$name" cut 0 -
    note "$name: cut (its slot ended: the ${budget} s budget is spent)"
    return 1
  fi
  note "$name: start (limit ${limit} s)"
  t0=$now
  local mode=()
  ((dry_run)) && mode=(--dry-run)
  timeout --kill-after=5 "$limit" bash "$self" "${mode[@]}" --run "$@" >"$log" 2>&1 &
  stage_pid=$!
  stage_name=$name
  stage_t0=$t0
  wait "$stage_pid"
  rc=$?
  stage_pid=""
  if ((rc == 0)); then status=ok
  elif ((rc == 124 || rc == 137)); then status=timeout
  else status=failed
  fi
  record "$name" "$status" "$(($(date +%s) - t0))" "$rc"
  note "$name: $status (rc $rc, $(($(date +%s) - t0)) s)"
  [[ $status != ok ]] && tail -n 15 "$log" | sed 's/^/    | /'
  summary
  [[ $status == ok ]]
}

# fatal_stage NAME COMMAND...: a stage whose failure stops the GPU stages after it.
fatal_stage() {
  local name=$1
  stage "$@" && return 0
  wanted "$name" || return 0
  [[ -n $fatal ]] && return 1
  fatal="$name: $(grep '^FAIL: ' "$work/logs/$name.log" | sed 's/^FAIL: //' | tr '\n' ' ')"
  loud "FATAL: $fatal"
  return 1
}

rm -rf "$work"
mkdir -p "$work/logs" "$work/runs" "$work/configs"
: >"$stages_tsv"
for e in "${plan[@]}"; do wanted "${e%%:*}" && printf '%s\t%s\n' "${e%%:*}" "${e##*:}"; done >"$plan_tsv"
total=0
for e in "${plan[@]}"; do total=$((total + ${e##*:})); done
((dry_run)) && fake_sanitizer
trap on_exit EXIT
trap on_signal INT TERM
note "$( ((dry_run)) && echo 'DRY RUN: ')budget ${budget} s (the plan's stages: ${total} s), devices $device (bench) and $train_device (training), $jobs cores, build $build, deps $deps, toolkit ${cuda:-none}"
unset REMAT_TF32  # the op tests compare fp32 GEMMs; train_run sets it for the training runs
stage env env_report
fatal_stage preflight preflight
stage configure configure
stage build build_targets
fatal_stage device device_check
stage ctest ctest_run
stage nccl nccl_check
stage bench "$build/remat" bench kernels --device "$device" --json "$work/bench_kernels.json" "${bench_args[@]}"
stage link "$build/remat" bench link --device "$device" --size "$(dry 8MiB 256MiB)"
torch_args=(time "$work/configs/$torch_model.json" --steps "$torch_steps" --json "$work/torch_$torch_model.json")
if [[ $train_device == cuda* && $train_device != cuda-emu ]]; then
  torch_args+=(--device "$train_device")
  [[ $tf32 == 1 ]] && torch_args+=(--tf32)
fi
torch_bf16_args=("${torch_args[@]}")
torch_bf16_args[5]=$work/torch_${torch_model}_bf16.json  # the value of --json
torch_bf16_args+=(--precision bf16)
torch_stages() {  # the torch_plan's stages
  stage torch "$python" tools/reference/torch_reference.py "${torch_args[@]}"
  if ((bf16)); then
    stage "train_${torch_model}_bf16_none" train_run "$torch_model" none bf16
    stage torch_bf16 "$python" tools/reference/torch_reference.py "${torch_bf16_args[@]}"
  fi
  torch_done=1
}
torch_done=0
for m in "${models[@]}"; do
  name=$(model_name "$m")
  derive_config "$m" "$work/configs/$name.json" >>"$work/logs/configs.log" 2>&1
  for p in "${policies[@]}"; do stage "train_${name}_${p}" train_run "$name" "$p"; done
  [[ $name == "$torch_model" ]] && torch_stages
done
if ((!torch_done)); then
  derive_config "$torch_model" "$work/configs/$torch_model.json" >>"$work/logs/configs.log" 2>&1
  torch_stages
fi
stage memcheck sanitize memcheck
stage racecheck sanitize racecheck
