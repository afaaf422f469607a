#!/usr/bin/env bash
# The sharded optimizer (ZeRO-1, --shard-optimizer; docs/distributed.md) over MPI: with 1,
# 2 and 3 ranks the weights and the saved optimizer state are bitwise those of one
# unsharded process, with gradient clipping (each rank gathers the whole reduced gradient
# for the norm) and without (each rank reads its shard only); a checkpoint saved sharded
# resumes unsharded and the other way round, with another rank count; the same on
# cuda-emu. Exits 77 (skipped) without mpirun.
# Usage: test_mpi_shard.sh REMAT_BINARY MPIRUN
set -uo pipefail
source "$(dirname "$0")/mpi_env.sh"  # remat, mpirun, dir, fail=0; exits 77 without mpirun
cp "$(dirname "$0")/configs/mpi_tiny.json" "$dir/clip.json"
sed 's/"grad_clip": 1.0/"grad_clip": 0/' "$dir/clip.json" >"$dir/noclip.json"
grep -q '"grad_clip": 0}' "$dir/noclip.json" || { echo "FAIL: could not make the config without clipping"; exit 1; }

same() {  # same RUN_A RUN_B: weights and optimizer state byte for byte
  cmp -s "$1/checkpoint/model.safetensors" "$2/checkpoint/model.safetensors" &&
    cmp -s "$1/checkpoint/optimizer.safetensors" "$2/checkpoint/optimizer.safetensors"
}

for cfg in clip noclip; do
  for policy in none sqrt; do
    train=(train "$dir/$cfg.json" --device cpu --quiet --policy "$policy")
    ref="$dir/ref_${cfg}_$policy"
    "$remat" "${train[@]}" --out "$ref" || { echo "FAIL: one process, $cfg, $policy"; fail=1; continue; }
    for n in 1 2 3; do
      out="$dir/zero_${cfg}_${policy}_np$n"
      if "$mpirun" -np "$n" "$remat" "${train[@]}" --shard-optimizer --out "$out" && same "$ref" "$out"; then
        echo "ok: $cfg, $policy, $n rank(s) with the optimizer sharded: bitwise one unsharded process"
      else
        echo "FAIL: $cfg, $policy, $n rank(s) with the optimizer sharded"
        fail=1
      fi
    done
  done
done

# Resume across layouts: sharded on 2 ranks -> unsharded on 3, unsharded on 2 -> sharded on 3
# (the schedule is constant, so --steps 3 then 5 is the 5-step run).
train=(train "$dir/clip.json" --device cpu --quiet --policy none)
if "$mpirun" -np 2 "$remat" "${train[@]}" --shard-optimizer --steps 3 --out "$dir/r1" &&
  "$mpirun" -np 3 "$remat" "${train[@]}" --steps 5 --resume "$dir/r1" && same "$dir/ref_clip_none" "$dir/r1"; then
  echo "ok: saved sharded on 2 ranks, resumed unsharded on 3: bitwise the one-process run"
else
  echo "FAIL: sharded on 2 ranks, resumed unsharded on 3"
  fail=1
fi
if "$mpirun" -np 2 "$remat" "${train[@]}" --steps 3 --out "$dir/r2" &&
  "$mpirun" -np 3 "$remat" "${train[@]}" --shard-optimizer --steps 5 --resume "$dir/r2" &&
  same "$dir/ref_clip_none" "$dir/r2"; then
  echo "ok: saved unsharded on 2 ranks, resumed sharded on 3: bitwise the one-process run"
else
  echo "FAIL: unsharded on 2 ranks, resumed sharded on 3"
  fail=1
fi

# On cuda-emu (the CUDA backend's kernels on the emulator, shard pieces as device views).
emu=(train "$dir/noclip.json" --device cuda-emu --quiet --steps 2 --policy sqrt)
if "$remat" "${emu[@]}" --out "$dir/emu_ref" 2>/dev/null; then
  if "$mpirun" -np 2 "$remat" "${emu[@]}" --shard-optimizer --out "$dir/emu_np2" && same "$dir/emu_ref" "$dir/emu_np2"; then
    echo "ok: cuda-emu, 2 ranks with the optimizer sharded: bitwise one unsharded process"
  else
    echo "FAIL: cuda-emu, 2 ranks with the optimizer sharded"
    fail=1
  fi
else
  echo "note: no cuda-emu in this remat; its part is skipped"
fi

# The progress line says the optimizer is sharded; memprof --ranks reports one rank's
# state: a third of the state kept flat on one rank for 3 ranks (up to the padding to 16
# floats and the allocator's 512-byte rounding), and no more than a third of the
# unsharded state (whose small tensors are each rounded to 512 bytes).
log=$("$mpirun" -np 2 "$remat" train "$dir/clip.json" --device cpu --steps 1 --shard-optimizer 2>&1) || fail=1
if grep -q 'optimizer state sharded over 2 ranks' <<<"$log"; then
  echo "ok: the run says its optimizer state is sharded"
else
  echo "FAIL: no sharding in the 2-rank log:"
  echo "$log"
  fail=1
fi
mp=("$remat" memprof "$dir/clip.json" --policy none --device cpu)
"${mp[@]}" --json "$dir/one.json" >/dev/null &&
  "${mp[@]}" --shard-optimizer --json "$dir/flat.json" >/dev/null &&
  "${mp[@]}" --ranks 3 --shard-optimizer --json "$dir/three.json" >/dev/null || fail=1
ratios=$(command -p python3 - "$dir/one.json" "$dir/flat.json" "$dir/three.json" <<'PY'
import json, sys
rows = [json.load(open(p))["policies"][0] for p in sys.argv[1:]]
one, flat, three = (r["peak_by_category"]["optimizer_state"] for r in rows)
assert rows[2]["ranks"] == 3 and rows[2]["shard_optimizer"] and not rows[0]["shard_optimizer"], rows
print(f"{three / flat:.4f} {three / one:.4f}")
PY
) || fail=1
read -r of_flat of_one <<<"$ratios"
if [[ -n $ratios ]] && command -p python3 -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if 1/3 <= a < 0.345 and b <= 1/3 else 1)" "$of_flat" "$of_one"; then
  echo "ok: memprof --ranks 3 --shard-optimizer (measured on cpu): optimizer state ${of_flat}x the flat state of one rank, ${of_one}x the unsharded"
else
  echo "FAIL: memprof --ranks 3 --shard-optimizer: optimizer state ratios '$ratios'"
  fail=1
fi
exit $fail
