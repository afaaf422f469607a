#!/usr/bin/env bash
# NCCL under mpirun (labels gpu and mpi; docs/distributed.md): GPU ranks of an MPI launch
# reduce gradients with NCCL on the backend's stream, even one rank, and give bitwise the
# weights of one process on the same GPU: mpirun -np 1 with 6 micro-batches (ordered,
# fast, sharded optimizer), REMAT_NCCL=0 (host copies over MPI) the same; with two GPUs or
# more, mpirun -np 2 too. Exits 77 (skipped, saying why) without mpirun, a CUDA device or
# NCCL in this remat.
# Usage: test_mpi_nccl.sh REMAT_BINARY MPIRUN [DEVICE]
#   DEVICE cuda (default) or cuda-emu: the same comparisons through the host path (the
#   dry run of tools/gpu/gpu_check.sh; no NCCL there). MPI_NCCL_QUICK=1: the ordered
#   comparison alone (tools/gpu/gpu_check.sh's nccl stage).
set -uo pipefail
source "$(dirname "$0")/mpi_env.sh"  # remat, mpirun, dir, fail=0; exits 77 without mpirun
device=${3:-cuda}
info=$("$remat" info 2>&1)
if ! grep -q '^  MPI  *on' <<<"$info"; then
  echo "SKIPPED: this remat was built without MPI"
  exit 77
fi
if [[ $device == cuda ]]; then
  if ! grep -Eq '^  cuda:0 ' <<<"$info"; then
    echo "SKIPPED: no CUDA device: $(grep -E '^  cuda ' <<<"$info" | sed 's/^ *//')"
    exit 77
  fi
  if ! grep -Eq '^  NCCL +[0-9]' <<<"$info"; then
    echo "SKIPPED: this remat was built without NCCL (no nccl.h and libnccl found; set NCCL_ROOT)"
    exit 77
  fi
fi
gpus=$(grep -Ec '^  cuda:[0-9]+ ' <<<"$info")
cp "$(dirname "$0")/configs/mpi_tiny.json" "$dir/tiny.json"
train=(train "$dir/tiny.json" --device "$device" --steps 2 --policy sqrt)
same() {  # same REF OUT: weights and optimizer state byte for byte
  cmp -s "$1/checkpoint/model.safetensors" "$2/checkpoint/model.safetensors" &&
    cmp -s "$1/checkpoint/optimizer.safetensors" "$2/checkpoint/optimizer.safetensors"
}
if ! "$remat" "${train[@]}" --quiet --out "$dir/ref" >"$dir/ref.log" 2>&1; then
  echo "FAIL: one process on $device:"
  cat "$dir/ref.log"
  exit 1
fi
engine=nccl
[[ $device == cuda ]] || engine=local  # one rank without NCCL folds locally
export REMAT_NCCL=${REMAT_NCCL:-1}
cases=("ordered::" "fast:--reduce fast:" "shard:--shard-optimizer:" "host:--quiet:REMAT_NCCL=0")
[[ ${MPI_NCCL_QUICK:-0} == 1 ]] && cases=("ordered::")
for c in "${cases[@]}"; do
  IFS=: read -r name extra env <<<"$c"
  out="$dir/np1_$name"
  # shellcheck disable=SC2086 # extra and env are word lists
  if ! env $env "$mpirun" -x REMAT_NCCL -np 1 "$remat" "${train[@]}" $extra --out "$out" >"$out.log" 2>&1; then
    echo "FAIL: mpirun -np 1, $name:"
    cat "$out.log"
    fail=1
    continue
  fi
  if [[ $name != host ]] && ! grep -q "micro-batches per step on 1 rank ($engine" "$out.log"; then
    echo "FAIL: mpirun -np 1, $name: the reduction is not $engine's:"
    grep 'micro-batch' "$out.log"
    fail=1
  fi
  if same "$dir/ref" "$out"; then
    echo "ok: mpirun -np 1 on $device, $name ($([[ $name == host ]] && echo 'REMAT_NCCL=0: no NCCL' || echo "$engine")): bitwise one process"
  else
    echo "FAIL: mpirun -np 1 on $device, $name: the weights differ from one process's"
    fail=1
  fi
done
if [[ $device == cuda && $gpus -ge 2 && ${MPI_NCCL_QUICK:-0} != 1 ]]; then
  if "$mpirun" -np 2 "$remat" "${train[@]}" --out "$dir/np2" >"$dir/np2.log" 2>&1 && same "$dir/ref" "$dir/np2"; then
    echo "ok: mpirun -np 2 on cuda:0 and cuda:1 (nccl): bitwise one process"
  else
    echo "FAIL: mpirun -np 2 on two GPUs:"
    cat "$dir/np2.log"
    fail=1
  fi
else
  echo "note: $gpus CUDA device(s) on $device: the 2-rank run needs two"
fi
exit $fail
