#!/usr/bin/env bash
# ctest gpu_check_dry_run (label unit): tools/gpu/gpu_check.sh's own logic, without a GPU.
#
#   tests/test_gpu_check.sh BUILD_DIR
#
# 1. `gpu_check.sh --dry-run` against BUILD_DIR's binaries (cuda-emu, small shapes): every
#    stage of the plan is reported ok in the summary, the summary lists the kernel table
#    and the training runs, and the script exits 0.
# 2. A driver older than the toolkit (a stand-in nvidia-smi saying CUDA 12.2): preflight
#    fails loudly naming cudaErrorInsufficientDriver (35), the stages after it are skipped
#    (not run), the summary is still printed and the script exits non-zero.
# 3. A ctest selection whose tests all skip (the gpu label on a machine without a GPU)
#    fails the ctest stage instead of passing.
# 4. A budget too small for the plan: the stages past it are cut, the summary says so.
# 5. Stopped by SIGTERM mid-stage: that stage is "interrupted", the later ones "not
#    reached", the summary printed.
# 6. The version checks alone: driver 13.0 vs toolkit 13.0 ok, 12.8 vs 13.0 fails,
#    13.0 vs 13.1 warns and passes; carried packages needing a newer GLIBCXX fail.
set -uo pipefail
build=$(realpath "$1")
root=$(cd "$(dirname "$0")/.." && pwd)
script=$root/tools/gpu/gpu_check.sh
tmp=$(mktemp -d "$build/gpu_check_test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
expect_in() {  # expect_in FILE PATTERN WHAT
  grep -Eq -- "$2" "$1" || {
    fail "$3: no line matching /$2/ in $1"
    sed 's/^/    | /' "$1" | tail -n 40
  }
}

# The torch stages need a Python with numpy and PyTorch: $GPU_CHECK_PYTHON, else the
# system's, else the first python3 on PATH (a pyenv shim may have neither).
python=""
for p in ${GPU_CHECK_PYTHON:-} /usr/bin/python3 "$(command -v python3)"; do
  if [[ -x $p ]] && "$p" -c 'import numpy, torch' >/dev/null 2>&1; then
    python=$p
    break
  fi
done
if [[ -z $python ]]; then
  echo "SKIPPED: no Python with numpy and torch (tried ${GPU_CHECK_PYTHON:-} /usr/bin/python3" \
    "$(command -v python3)) for the dry run's torch stages; set GPU_CHECK_PYTHON"
  exit 77
fi
export GPU_CHECK_BUILD_DIR=$build GPU_CHECK_PYTHON=$python

# 1. the whole dry run
echo "== 1. dry run"
GPU_CHECK_WORK=$tmp/w1 bash "$script" --dry-run >"$tmp/1.log" 2>&1
rc=$?
((rc == 0)) || fail "the dry run exited $rc"
plan=$(cut -f1 "$tmp/w1/plan.tsv" 2>/dev/null)
[[ $(wc -w <<<"$plan") -ge 15 ]] || fail "the plan has $(wc -w <<<"$plan") stages: $plan"
for s in $plan; do
  expect_in "$tmp/w1/summary.txt" "^  $s +ok " "stage $s"
done
expect_in "$tmp/w1/summary.txt" '^== [0-9]+ stage\(s\) ok$' "the summary's last line"
expect_in "$tmp/w1/summary.txt" 'passed [1-9][0-9]*, skipped 0, failed 0' "ctest counts"
expect_in "$tmp/w1/summary.txt" '^  (copy|fill|add)' "the kernel table"
expect_in "$tmp/w1/summary.txt" '^  gpt_char_tiny +selective ' "the GPT runs"
expect_in "$tmp/w1/summary.txt" '^  resnet_tiny +sqrt ' "the ResNet runs"
expect_in "$tmp/w1/summary.txt" 'PyTorch eager gpt_char_tiny' "the PyTorch step"
expect_in "$tmp/w1/summary.txt" '^  gpt_char_tiny_bf16 +none .* <= PyTorch: (met|MISSED)' "the bf16 run beside PyTorch's"
expect_in "$tmp/w1/summary.txt" 'PyTorch eager gpt_char_tiny bf16 \(autocast\)' "PyTorch's bf16 step"
expect_in "$tmp/w1/summary.txt" '^  gpt2_fc_bf16 +16x3072x768 +[0-9.]+ TFLOP/s' "the bf16 GEMM at a GPT-2 shape"
expect_in "$tmp/w1/logs/racecheck.log" 'compute-sanitizer --tool racecheck' "the sanitizer stand-in"
expect_in "$tmp/w1/logs/racecheck.log" '^\[  PASSED  \] [1-9]' "tests under the sanitizer stand-in"
budget_sum=$(awk -F'\t' '{ s += $2 } END { print s }' "$tmp/w1/plan.tsv")
((budget_sum <= 465)) || fail "the stage budgets sum to $budget_sum s > 465 s"
((failures == 0)) || sed 's/^/    | /' "$tmp/1.log" | tail -n 60

# 2. a driver older than the toolkit
echo "== 2. old driver"
mkdir -p "$tmp/bin"
cat >"$tmp/bin/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
if [[ ${1:-} == -L ]]; then echo "GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)"; exit 0; fi
echo "| NVIDIA-SMI 535.00    Driver Version: 535.00    CUDA Version: 12.2     |"
EOF
chmod +x "$tmp/bin/nvidia-smi"
toolkit=$(PATH=$PATH:/usr/local/cuda/bin nvcc --version 2>/dev/null | grep -o 'release [0-9]*' | grep -o '[0-9]*$')
if [[ -z $toolkit || $toolkit -le 12 ]]; then
  echo "(skipped: needs a CUDA 13 toolkit here, found '${toolkit}')"
else
  # preflight's real path (not the dry run's), then the stages after it are skipped
  GPU_CHECK_WORK=$tmp/w2 GPU_CHECK_NVIDIA_SMI=$tmp/bin/nvidia-smi GPU_CHECK_STAGES=env,preflight,configure,ctest \
    GPU_CHECK_PRESET=none bash "$script" >"$tmp/2.log" 2>&1
  rc=$?
  ((rc != 0)) || fail "an old driver: the script exited 0"
  expect_in "$tmp/2.log" '!!! gpu_check: FATAL: preflight: .*cudaErrorInsufficientDriver \(35\)' "the loud preflight failure"
  expect_in "$tmp/w2/summary.txt" '^  preflight +failed ' "preflight failed"
  expect_in "$tmp/w2/summary.txt" '^  configure +skipped ' "configure skipped"
  expect_in "$tmp/w2/summary.txt" '^  ctest +skipped ' "ctest skipped"
  expect_in "$tmp/w2/summary.txt" 'not ok: preflight, configure, ctest' "the summary's verdict"
fi

# 3. every selected test skipped
echo "== 3. all skipped"
GPU_CHECK_WORK=$tmp/w3 GPU_CHECK_STAGES=ctest GPU_CHECK_CTEST_ARGS="-L gpu -R ^GpuRuntime" \
  bash "$script" --dry-run >"$tmp/3.log" 2>&1
rc=$?
((rc != 0)) || fail "all tests skipped: the script exited 0"
expect_in "$tmp/w3/logs/ctest.log" 'every selected test skipped' "the skip verdict"
expect_in "$tmp/w3/summary.txt" '^  ctest +failed ' "ctest failed"

# 4. a budget too small: the stages past it are cut, the summary is printed
echo "== 4. cut"
# Three training runs (seconds each on cuda-emu) and memcheck cannot fit 6 s; a budget
# against quick stages (bench, 0 s on a warm machine) would depend on the machine's speed.
GPU_CHECK_WORK=$tmp/w4 GPU_CHECK_BUDGET_S=6 GPU_CHECK_STAGES=env,train_resnet,memcheck bash "$script" --dry-run \
  >"$tmp/4.log" 2>&1
rc=$?
((rc != 0)) || fail "a cut run exited 0"
expect_in "$tmp/w4/summary.txt" '^  (train_resnet_tiny_[a-z]+|memcheck) +cut ' "a cut stage"
expect_in "$tmp/4.log" '^== stages' "the summary printed"

# 5. stopped by a signal in the middle of a stage: that stage is interrupted, the later
#    ones not reached, and the summary is printed all the same
echo "== 5. signal"
GPU_CHECK_WORK=$tmp/w6 GPU_CHECK_STAGES=env,train_resnet,memcheck bash "$script" --dry-run >"$tmp/6.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do
  [[ -f $tmp/w6/logs/train_resnet_tiny_none.log ]] && break
  sleep 0.1
done
kill -TERM "$pid"
wait "$pid"
rc=$?
((rc != 0)) || fail "a stopped run exited 0"
expect_in "$tmp/w6/summary.txt" '^  train_resnet_tiny_none +interrupted ' "the interrupted stage"
expect_in "$tmp/w6/summary.txt" '^  memcheck +not reached ' "a stage not reached"
expect_in "$tmp/6.log" '^== stages' "the summary printed"

# 6. the version checks alone
echo "== 6. versions"
bash "$script" --run versions_compatible 13.0 13.0 >"$tmp/5a.log" 2>&1 || fail "13.0 vs 13.0 refused"
if bash "$script" --run versions_compatible 12.8 13.0 >"$tmp/5b.log" 2>&1; then fail "12.8 vs 13.0 accepted"; fi
expect_in "$tmp/5b.log" 'cudaErrorInsufficientDriver \(35\)' "the error 35 message"
bash "$script" --run versions_compatible 13.0 13.1 >"$tmp/5c.log" 2>&1 || fail "13.0 vs 13.1 refused"
expect_in "$tmp/5c.log" 'minor version compatibility' "the minor-version warning"
printf 'needs: GLIBC_2.17 GLIBCXX_3.4.99 (C library and libstdc++ symbol versions, at least)\n' >"$tmp/MANIFEST.txt"
if bash "$script" --run deps_compatible "$tmp/MANIFEST.txt" >"$tmp/5d.log" 2>&1; then fail "GLIBCXX_3.4.99 accepted"; fi
expect_in "$tmp/5d.log" 'libstdc\+\+ is older than the packages need' "the GLIBCXX message"
printf 'needs: GLIBC_2.17 GLIBCXX_3.4.9 (C library and libstdc++ symbol versions, at least)\n' >"$tmp/MANIFEST.txt"
bash "$script" --run deps_compatible "$tmp/MANIFEST.txt" >"$tmp/5e.log" 2>&1 || fail "old needs refused: $(cat "$tmp/5e.log")"

if ((failures)); then
  echo "gpu_check tests: $failures failure(s)"
  exit 1
fi
echo "gpu_check tests: ok"
