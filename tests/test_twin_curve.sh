#!/usr/bin/env bash
# ctest twin_curve (label unit): tools/reference/torch_reference.py's curve mode against remat runs of
# a tiny config, in both precisions, so the twin keeps reading remat's run folders (their
# resolved config.json, init.safetensors, metrics.jsonl) as both grow.
#
#   tests/test_twin_curve.sh REMAT_BINARY WORK_DIR
#
# fp32: the twin's losses equal remat's to 1e-5 relative at every step (docs/training.md
# measures 2e-7 on the tiny configs). bf16: remat's bf16 run against the twin under
# torch.autocast, which rounds other intermediates (docs/training.md): within 3% (1.4% measured). A run
# whose config the twin cannot read fails. Exits 77 (skipped) without Debian's python3
# with torch.
set -uo pipefail
remat=$1
work=$2
root=$(cd "$(dirname "$0")/.." && pwd)
py=/usr/bin/python3
if ! "$py" -c "import torch" 2>/dev/null; then
  echo "twin_curve: skipped: $py cannot import torch (tools/bootstrap.sh installs python3-torch)"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work"
cfg=$root/tests/configs/conv_mix_tiny.json
status=0
for p in fp32 bf16; do
  limit=$([[ $p == fp32 ]] && echo 1e-5 || echo 0.03)
  if ! "$remat" train "$cfg" --device cpu --precision "$p" --steps 12 --out "$work/$p" --quiet >"$work/$p.log" 2>&1; then
    cat "$work/$p.log"
    echo "twin_curve: remat train ($p) failed"
    status=1
    continue
  fi
  if ! OMP_NUM_THREADS=1 "$py" "$root/tools/reference/torch_reference.py" curve --run "$work/$p" --threads 1 --max-rel "$limit" \
      >"$work/twin_$p.log" 2>&1; then
    cat "$work/twin_$p.log"
    echo "twin_curve: the $p twin differs from remat by more than $limit (or failed)"
    status=1
    continue
  fi
  tail -1 "$work/twin_$p.log"
done
exit $status
