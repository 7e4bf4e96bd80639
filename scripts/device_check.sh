#!/bin/bash
# One call on a GPU machine (see ../shared/GPU.md): GPU kernel tests against the CPU backend,
# LSQR on australia and the demo on CUDA, the australia benchmark (CPU and CUDA), and 1 vs 2
# GPUs (MPI, one rank per GPU) on a synthetic 100M-nonzero dataset and a 4x larger one.
# Expects in .device/: seistomo, gpu-test and unit-test (release test binaries), datasets/.
# Usage on the device machine: bash scripts/device_check.sh   (writes under $OUT)
set -u
cd "$(dirname "$0")/.."
D=.device
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 SEISTOMO_ROOT=$D
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; date -u; } > "$OUT/summary.txt"
timeout 240 $D/gpu-test --test-threads=1 > "$OUT/tests.txt" 2>&1; echo "gpu tests rc=$?" >> "$OUT/summary.txt"
grep -E "test result|panicked" "$OUT/tests.txt" >> "$OUT/summary.txt"
$D/unit-test cuda 2>&1 | grep "test result" >> "$OUT/summary.txt"
A="--matrix $D/datasets/australia/G.mtx.gz --rhs $D/datasets/australia/d.txt --reg $D/datasets/australia/R.mtx.gz --reg-weight 0.015"
for b in cpu cuda; do
  $D/seistomo solve $A --atol 1e-8 --btol 1e-8 --backend $b --report "$OUT/au_$b.json" 2>> "$OUT/summary.txt"
done
sed "s#path = \"dataset.toml\"#path = \"$PWD/$D/datasets/demo/dataset.toml\"#; s#dir = .*#dir = \"/tmp/demo\"#" \
  $D/datasets/demo/invert.toml > /tmp/demo.toml
printf '[backend]\nkind = "cuda"\n' >> /tmp/demo.toml
$D/seistomo invert /tmp/demo.toml 2>> "$OUT/summary.txt"
$D/seistomo bench $A --iters 300 --backend all > "$OUT/bench_australia.txt" 2>> "$OUT/bench.err"
for scale in 1 4; do
  rays=$((600000 * scale)); ds=/tmp/big$scale
  /usr/bin/time -f "synth x$scale: %e s, %M KB" $D/seistomo synth --out $ds --grid 128,128,80 --rays $rays \
    --norm-damping 0.1 --flattening 0.5,0.5,0.5 --damping-blocks 2 2>> "$OUT/summary.txt" > /dev/null
  for np in 1 2; do
    cfg=/tmp/big$scale-np$np.toml
    printf '[dataset]\npath = "%s/dataset.toml"\n[solver]\natol = 0\nbtol = 0\nconlim = 0\niter_lim = 200\n[backend]\nkind = "cuda"\n[output]\ndir = "/tmp/o%s-%s"\nmodel = ""\n' \
      $ds $scale $np > $cfg
    if [ $np = 1 ]; then $D/seistomo invert $cfg 2>> "$OUT/summary.txt"
    else mpirun --allow-run-as-root --bind-to none -np 2 -x NCCL_NVLS_ENABLE $D/seistomo invert $cfg 2>> "$OUT/summary.txt"; fi
    cp /tmp/o$scale-$np/report.json "$OUT/big${scale}_np$np.json" 2>/dev/null
  done
  rm -rf $ds
done
python3 - "$OUT" <<'PY' >> "$OUT/summary.txt"
import json, sys, glob, os
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    r = json.load(open(f))
    t = r.get("rank_timing") or []
    red = " ".join(f"r{x['rank']}:{x['allreduce_s']:.3f}s/{x['compute_s']:.3f}s" for x in t)
    print(f"{os.path.basename(f)}: {r['backend']} {r.get('transpose')} m={r['m']} nnz={r['nnz']} its={r['iterations']} "
          f"istop={r['istop']} r1={r['r1norm']:.10e} ms/it={r['ms_per_iter']:.4f} load={r['seconds']['load']:.2f}s {red}")
PY
cat "$OUT/summary.txt"; tail -25 "$OUT/bench_australia.txt"
