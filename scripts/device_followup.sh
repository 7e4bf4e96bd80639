#!/bin/bash
# Second call on the GPU machine: GPU GMRES tests (with --orthog cgs), GMRES(16) Jacobi on the
# 2.1M-row convection-diffusion system with mgs / cgs / cgs2 beside CuPy's gmres, the SpMV of
# that matrix, and LSQR on the 100.8M-nonzero system with the cells in Morton order and the rays
# sorted (what ordering does to the gathers). Same .device/ as device_gmres.sh.
set -u
cd "$(dirname "$0")/.."
D=.device
export PYTHONUNBUFFERED=1 SEISTOMO_BIN=$PWD/$D/seistomo
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
S=$OUT/summary.txt
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; date -u; } > $S
SEISTOMO_ROOT=$PWD timeout 150 $D/gpu-gmres-test --test-threads=1 --nocapture > $OUT/gpu_gmres_tests.txt 2>&1
echo "gpu_gmres tests rc=$?" >> $S; grep -E "test result|panicked" $OUT/gpu_gmres_tests.txt >> $S
M=/tmp/cd128.mtx
$D/seistomo square --kind convdiff --n 128 -o $M 2>> $S
$D/seistomo export $M --format npy -o /tmp/cd128 2>> $OUT/export.err
timeout 100 python3 $D/cupy_gmres.py /tmp/cd128 16 1e-10 > $OUT/cupy_gmres.json 2> $OUT/cupy_gmres.err
G="solve --method gmres --matrix $M --restart 16 --rtol 1e-10 --precond jacobi --backend cuda"
for o in cgs mgs cgs2; do
  timeout 60 $D/seistomo $G --orthog $o --report $OUT/gm_${o}_f64.json 2>> $S
done
timeout 60 $D/seistomo $G --orthog cgs --precision f32 --report $OUT/gm_cgs_f32.json 2>> $S
timeout 60 python3 $D/cupy_gmres.py /tmp/cd128 16 1e-10 > $OUT/cupy_gmres2.json 2>> $OUT/cupy_gmres.err
cat $OUT/cupy_gmres.json $OUT/cupy_gmres2.json >> $S
timeout 90 $D/seistomo bench --matrix $M --iters 50 --transpose csc --precision f64,f32 > $OUT/bench_cd128.txt 2>> $OUT/bench.err
for v in "" "--morton" "--morton --sort-rays"; do
  echo "# variant: $v" >> $OUT/bench_order.txt
  timeout 120 $D/seistomo bench --size large --iters 100 --transpose csc,scatter --precision f64,f32 $v >> $OUT/bench_order.txt 2>> $OUT/bench.err
done
python3 - "$OUT" <<'PY' >> $S
import json, sys, glob, os
for f in sorted(glob.glob(os.path.join(sys.argv[1], "gm_*.json"))):
    r = json.load(open(f))
    print(f"{os.path.basename(f)}: {r['backend']} {r['precond']} {r['orthog']} n={r['n']} nnz={r['nnz']} "
          f"its={r['iterations']} conv={r['converged']} relres={r['relres']:.3e} ms/it={r['ms_per_iter']:.4f} "
          f"solve={r['seconds']['solve']:.3f}s")
PY
cat $S; grep -v "^$" $OUT/bench_cd128.txt | tail -4; grep -v "^$" $OUT/bench_order.txt
