#!/bin/bash
# Third call on the GPU machine: LSQR on the 100.8M-nonzero straight-ray system as built and with
# the product's default reordering (`--reorder auto`: rows sorted, cells in Morton order), the
# CuPy LSQR loop on both versions of the system in the same call. Same .device/ as device_gmres.sh.
set -u
cd "$(dirname "$0")/.."
D=.device
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
S=$OUT/summary.txt
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; date -u; } > $S
for r in none auto; do
  $D/seistomo bench --size large --reorder $r --export-npy /tmp/npy_$r 2>> $OUT/bench.err
  timeout 120 python3 $D/cupy_lsqr.py npy /tmp/npy_$r 100 > $OUT/cupy_large_$r.txt 2>&1
  rm -rf /tmp/npy_$r
  timeout 150 $D/seistomo bench --size large --reorder $r --iters 100 > $OUT/bench_large_$r.txt 2>> $OUT/bench.err
done
cat $S; for r in none auto; do echo "## reorder $r"; grep -E "ms" $OUT/cupy_large_$r.txt | head -12; grep -v "^$" $OUT/bench_large_$r.txt; done
