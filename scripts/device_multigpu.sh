#!/bin/bash
# 1 vs 2 GPUs (one MPI rank per GPU) with each allreduce path (pinned host + MPI, NCCL) on a
# synthetic 100M-nonzero dataset and a 4x larger one. Run on nvidia-h200-x2 with .device/seistomo.
set -u
cd "$(dirname "$0")/.."
D=.device
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nccl=$(find / -name 'libnccl.so*' 2>/dev/null | head -1)
[ -n "$nccl" ] && export LD_LIBRARY_PATH=$(dirname "$nccl"):${LD_LIBRARY_PATH:-}
echo "libnccl: ${nccl:-not found}" > "$OUT/summary.txt"
for scale in 1 4; do
  ds=/tmp/big$scale
  $D/seistomo synth --out $ds --grid 128,128,80 --rays $((600000 * scale)) --norm-damping 0.1 \
    --flattening 0.5,0.5,0.5 --damping-blocks 2 > /dev/null 2>> "$OUT/summary.txt"
  for run in ${RUNS:-np1 host nccl}; do
    cfg=/tmp/$run-$scale.toml; path=${run/np1/auto}
    printf '[dataset]\npath = "%s/dataset.toml"\n[solver]\natol = 0\nbtol = 0\nconlim = 0\niter_lim = 200\n[backend]\nkind = "cuda"\nallreduce = "%s"\n[output]\ndir = "/tmp/o-%s-%s"\nmodel = ""\n' \
      $ds $path $run $scale > $cfg
    if [ $run = np1 ]; then $D/seistomo invert $cfg 2>> "$OUT/summary.txt"
    else mpirun --allow-run-as-root --bind-to none -np 2 -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH $D/seistomo invert $cfg 2>> "$OUT/summary.txt"; fi
    cp /tmp/o-$run-$scale/report.json "$OUT/x${scale}_$run.json" 2>/dev/null
  done
  rm -rf $ds
done
python3 - "$OUT" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys, glob, os
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    r = json.load(open(f)); t = r.get("rank_timing") or []
    red = " ".join(f"r{x['rank']}: allreduce {1e3*x['allreduce_s']/r['iterations']:.3f} ms/it, compute {1e3*x['compute_s']/r['iterations']:.3f}" for x in t)
    print(f"{os.path.basename(f)}: {r['transpose']} nnz={r['nnz']} its={r['iterations']} r1={r['r1norm']:.10e} ms/it={r['ms_per_iter']:.4f} {red}")
PY
grep -iE "allreduce of|error|nccl" "$OUT/summary.txt" | head -20
