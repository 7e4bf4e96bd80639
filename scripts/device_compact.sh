#!/bin/bash
# Compact storage + stencil damping + the device-resident LSQR loop on one GPU, with the CuPy
# peer in the same call (issue: GPU LSQR past the f64 floor).
#   bash scripts/device_compact.sh BIN_DIR OUT [parts]
# BIN_DIR holds: seistomo (release), gpu and gpu_compact (release test binaries),
# cupy_lsqr.py (the CuPy peer). parts: any of tests,australia,large,sweep,prof (default
# tests,australia,large).
set -u
BIN=$1; OUT=$2; PARTS=${3:-tests,australia,large}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 SEISTOMO_ROOT=$PWD
S=/tmp/summary.txt
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv; date -u; } > "$S"
has() { [[ ",$PARTS," == *",$1,"* ]]; }
if has tests; then
  for t in gpu_compact gpu; do
    timeout 200 "$BIN/$t" --test-threads 1 --nocapture > /tmp/test_$t.txt 2>&1
    echo "test $t: rc $? $(grep -E '^test result' /tmp/test_$t.txt)" >> "$S"
    { echo "######## $t"; cat /tmp/test_$t.txt; } >> "$OUT/tests.txt"
  done
fi
AU="--matrix datasets/australia/G.mtx.gz --rhs datasets/australia/d.txt --reg datasets/australia/R.mtx.gz --reg-weight 0.015"
if has australia; then
  timeout 120 "$BIN/seistomo" bench $AU --reorder auto --iters 300 --storage csr,compact \
    --precision f64,f32 --transpose csc --loops device,host > "$OUT/bench_australia.txt" 2>> "$OUT/log.txt"
  "$BIN/seistomo" bench $AU --reorder auto --export-npy /tmp/npy_au 2>> "$OUT/log.txt"
  ( cd /tmp && OUT= timeout 120 python3 "$OLDPWD/$BIN/cupy_lsqr.py" npy /tmp/npy_au 300 ) > "$OUT/cupy_australia.txt" 2>&1
  rm -rf /tmp/npy_au
fi
if has large; then
  timeout 300 "$BIN/seistomo" bench --size large --reorder auto --iters 100 --storage csr,compact \
    --precision f64,f32 --transpose csc --loops device,host --json "$OUT/bench_large.json" \
    > "$OUT/bench_large.txt" 2>> "$OUT/log.txt"
  for r in auto none; do
    "$BIN/seistomo" bench --size large --reorder $r --export-npy /tmp/npy_$r 2>> "$OUT/log.txt"
    ( cd /tmp && OUT= timeout 150 python3 "$OLDPWD/$BIN/cupy_lsqr.py" npy /tmp/npy_$r 100 ) > "$OUT/cupy_large_$r.txt" 2>&1
    rm -rf /tmp/npy_$r
  done
fi
if has sweep; then
  # Layouts and tile sizes of compact storage on the large system (device loop, f32 and f64):
  # tiles of 2^9..2^12 columns measured 2026-11-23 (docs/gpu.md); mixed = rows for A x, tiles for A^T.
  for cfg in "SEISTOMO_COMPACT_LAYOUT=mixed SEISTOMO_TILE_BITS=9" "SEISTOMO_COMPACT_LAYOUT=mixed SEISTOMO_TILE_BITS=10" \
             "SEISTOMO_COMPACT_LAYOUT=tiles SEISTOMO_TILE_BITS=9" \
             "SEISTOMO_COMPACT_LAYOUT=rows"; do
    echo "## $cfg" >> "$OUT/sweep.txt"
    env $cfg timeout 150 "$BIN/seistomo" bench --size large --reorder auto --iters 100 --storage compact \
      --precision f32,f64 --loops device 2>> "$OUT/log.txt" | tail -2 >> "$OUT/sweep.txt"
    grep "layout" "$OUT/log.txt" | tail -1 >> "$OUT/sweep.txt"
  done
fi
if has prof; then
  # Per-kernel durations of the device loop on australia (latency-bound): where the time goes.
  command -v ncu >/dev/null && timeout 200 ncu --section SpeedOfLight --print-summary per-kernel \
    "$BIN/seistomo" bench $AU --reorder auto --iters 64 --storage csr,compact --precision f64 \
    --transpose csc --loops device > "$OUT/ncu_australia.txt" 2>&1
  grep -E "^  [a-z_0-9]+.*\(|Duration" "$OUT/ncu_australia.txt" | head -60 > "$OUT/ncu_summary.txt"
fi
cat "$S"
[ -f "$OUT/sweep.txt" ] && cat "$OUT/sweep.txt"
for f in "$OUT"/bench_australia.txt "$OUT"/bench_large.txt; do [ -f "$f" ] && { echo "## $f"; cat "$f"; }; done
for f in "$OUT"/cupy_*.txt; do
  [ -f "$f" ] && { echo "## $f"; grep -E "ms|GBps" "$f" | head -12; }
done
grep -E "column steps|row steps|escape|launch shapes" "$OUT"/log.txt 2>/dev/null | head -8
