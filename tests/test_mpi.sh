#!/usr/bin/env bash
# Data parallel over MPI (docs/distributed.md): with the ordered reduction, N = 1, 2, 3
# ranks give bitwise the weights of one process accumulating the same micro-batches,
# after 5 steps, under every checkpoint policy, with the buckets of the reduction
# overlapped with the backward sweep or not; --reduce fast runs; a config that differs
# between ranks is an error naming the rank. Exits 77 (skipped) without mpirun.
# Usage: test_mpi.sh REMAT_BINARY MPIRUN
set -uo pipefail
source "$(dirname "$0")/mpi_env.sh"  # remat, mpirun, dir, fail=0; exits 77 without mpirun
cp "$(dirname "$0")/configs/mpi_tiny.json" "$dir/tiny.json"  # shared with test_mpi_shard.sh
train=(train "$dir/tiny.json" --device cpu --quiet)
for policy in none all every:2 sqrt selective; do
  ref="$dir/ref_${policy/:/_}"
  "$remat" "${train[@]}" --policy "$policy" --out "$ref" || { echo "FAIL: one process, $policy"; fail=1; continue; }
  for n in 1 2 3; do
    out="$dir/np${n}_${policy/:/_}"
    if ! "$mpirun" -np "$n" "$remat" "${train[@]}" --policy "$policy" --out "$out"; then
      echo "FAIL: mpirun -np $n, $policy: the run failed"
      fail=1
      continue
    fi
    if cmp -s "$ref/checkpoint/model.safetensors" "$out/checkpoint/model.safetensors" &&
      cmp -s "$ref/checkpoint/optimizer.safetensors" "$out/checkpoint/optimizer.safetensors"; then
      echo "ok: $policy, $n rank(s): weights and optimizer state bitwise those of one process"
    else
      echo "FAIL: $policy, $n rank(s): the weights differ from one process's"
      fail=1
    fi
  done
done
# Buckets reduced during the backward sweep (--overlap on, the default; here a bucket per
# parameter or two, --bucket-kib 1) give the bits of the reduction after it (--overlap
# off): 2 and 3 ranks (3 and 2 rounds of micro-batches), the tied embedding's bucket last.
for n in 2 3; do
  for overlap in on off; do
    out="$dir/overlap${n}_$overlap"
    if ! "$mpirun" -np "$n" "$remat" "${train[@]}" --policy sqrt --overlap "$overlap" --bucket-kib 1 --out "$out"; then
      echo "FAIL: mpirun -np $n --overlap $overlap: the run failed"
      fail=1
    fi
  done
  if cmp -s "$dir/ref_sqrt/checkpoint/model.safetensors" "$dir/overlap${n}_on/checkpoint/model.safetensors" &&
    cmp -s "$dir/overlap${n}_off/checkpoint/model.safetensors" "$dir/overlap${n}_on/checkpoint/model.safetensors" &&
    cmp -s "$dir/overlap${n}_off/checkpoint/optimizer.safetensors" "$dir/overlap${n}_on/checkpoint/optimizer.safetensors"; then
    echo "ok: $n ranks, buckets overlapped with backward: bitwise the reduction after it and one process"
  else
    echo "FAIL: $n ranks: --overlap on and off give different weights"
    fail=1
  fi
done
# The fast reduction's all-reduce per bucket: on 2 ranks each element is a + b either way.
for overlap in on off; do
  "$mpirun" -np 2 "$remat" "${train[@]}" --reduce fast --overlap "$overlap" --bucket-kib 1 --out "$dir/fast_$overlap" ||
    fail=1
done
if cmp -s "$dir/fast_on/checkpoint/model.safetensors" "$dir/fast_off/checkpoint/model.safetensors"; then
  echo "ok: --reduce fast on 2 ranks, overlapped or not: the same weights"
else
  echo "FAIL: --reduce fast on 2 ranks: --overlap on and off differ"
  fail=1
fi
# The same on cuda-emu (the CUDA backend's kernels on the emulator; gradients reach MPI
# through host copies), where this remat has it.
emu=(train "$dir/tiny.json" --device cuda-emu --quiet --steps 2 --policy sqrt)
if "$remat" "${emu[@]}" --out "$dir/emu_ref" 2>/dev/null; then
  for n in 2 3; do
    if "$mpirun" -np "$n" "$remat" "${emu[@]}" --out "$dir/emu_np$n" &&
      cmp -s "$dir/emu_ref/checkpoint/model.safetensors" "$dir/emu_np$n/checkpoint/model.safetensors"; then
      echo "ok: cuda-emu, $n ranks: weights bitwise those of one process"
    else
      echo "FAIL: cuda-emu, $n ranks"
      fail=1
    fi
  done
else
  echo "note: no cuda-emu in this remat; its part is skipped"
fi
# A run saved with 2 ranks resumes with 3 (and the schedule is constant, so --steps 3
# then 5 is the 5-step run): bitwise the one-process run.
if "$mpirun" -np 2 "$remat" "${train[@]}" --steps 3 --out "$dir/resumed" &&
  "$mpirun" -np 3 "$remat" "${train[@]}" --steps 5 --resume "$dir/resumed" &&
  cmp -s "$dir/ref_none/checkpoint/model.safetensors" "$dir/resumed/checkpoint/model.safetensors" &&
  cmp -s "$dir/ref_none/checkpoint/optimizer.safetensors" "$dir/resumed/checkpoint/optimizer.safetensors"; then
  echo "ok: saved with 2 ranks, resumed with 3: bitwise the one-process run"
else
  echo "FAIL: resume with another rank count"
  fail=1
fi
# The progress line reports communication; only rank 0 prints.
log=$("$mpirun" -np 2 "$remat" train "$dir/tiny.json" --device cpu --steps 2 --bucket-kib 1 2>&1) || fail=1
if [[ $(grep -c '^step 2/2' <<<"$log") == 1 && $(grep -c '^done' <<<"$log") == 1 &&
  $(grep -c 'comm .* ms, [0-9]*% hidden' <<<"$log") -ge 1 ]] &&
  grep -q 'on 2 ranks (mpi, reduction ordered, overlapped with backward in [0-9]* buckets)' <<<"$log" &&
  grep -Eq '^communication: 2 ranks, .* ms of it waited for \([0-9]+% hidden' <<<"$log"; then
  echo "ok: rank 0 alone logs, with communication bytes, time and the part hidden behind backward"
else
  echo "FAIL: the 2-rank log:"
  echo "$log"
  fail=1
fi
# The fast reduction runs (its weights are close, not bitwise, so not compared).
"$mpirun" -np 3 "$remat" "${train[@]}" --reduce fast --out "$dir/fast" || {
  echo "FAIL: --reduce fast"
  fail=1
}
# A batch whose micro-batches do not split over the ranks.
log=$("$mpirun" -np 4 "$remat" "${train[@]}" 2>&1)
if grep -q "6 micro-batches per step, not a multiple of the 4 ranks" <<<"$log"; then
  echo "ok: 6 micro-batches over 4 ranks is a clear error"
else
  echo "FAIL: 4 ranks over 6 micro-batches:"
  echo "$log"
  fail=1
fi
# A config that differs between ranks (MPMD launch): an error naming the rank.
sed 's/"lr": 0.01/"lr": 0.02/' "$dir/tiny.json" >"$dir/other.json"
log=$(timeout 60 "$mpirun" -np 1 "$remat" "${train[@]}" : -np 1 "$remat" train "$dir/other.json" --device cpu --quiet 2>&1)
if grep -q "rank 1's config and options" <<<"$log"; then
  echo "ok: a config that differs between ranks is an error naming the rank"
else
  echo "FAIL: differing configs:"
  echo "$log"
  fail=1
fi
# A rank that dies (SIGKILL) or hangs (SIGSTOP) ends the job with an error naming a rank,
# within the timeout (REMAT_DIST_TIMEOUT, here 5 s), never hangs it.
rank1_of() {  # the pid of rank 1 among mpirun's children
  local p
  for p in $(pgrep -P "$1"); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -q '^OMPI_COMM_WORLD_RANK=1$'; then echo "$p"; fi
  done
}
for signal in KILL STOP; do
  start=$(date +%s)
  REMAT_DIST_TIMEOUT=5 timeout 60 "$mpirun" -x REMAT_DIST_TIMEOUT -np 2 "$remat" "${train[@]}" --steps 100000 \
    >"$dir/fault.log" 2>&1 &
  launcher=$!
  sleep 3
  victim=$(rank1_of "$(pgrep -P $launcher -x mpirun || echo $launcher)")
  [[ -n $victim ]] && kill -s "$signal" "$victim"
  wait $launcher
  rc=$?
  took=$(($(date +%s) - start))
  if [[ -n $victim && $rc != 0 && $rc != 124 && $took -lt 40 ]] &&
    grep -Eq "rank 1 .*exited on signal|rank 0: MPI_[A-Za-z]+ did not complete within 5 s" "$dir/fault.log"; then
    echo "ok: SIG$signal to rank 1 ended the job in ${took} s with an error naming the rank"
  else
    echo "FAIL: SIG$signal to rank 1 (pid '$victim'): exit $rc after ${took} s:"
    cat "$dir/fault.log"
    fail=1
  fi
done
exit $fail
