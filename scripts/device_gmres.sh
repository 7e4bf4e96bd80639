#!/bin/bash
# One call on a GPU machine (see ../shared/GPU.md; HOPPER.md of the device tool): GPU GMRES
# tests against the CPU backend, GMRES(16) Jacobi on a 2.1M-row convection-diffusion system
# beside CuPy's gmres, LSQR on australia and on the 100.8M-nonzero system beside the CuPy LSQR
# loop, then the older GPU kernel tests.
# Expects in .device/: seistomo, gpu-test, gpu-gmres-test (release test binaries),
# cupy_lsqr.py, cupy_gmres.py, datasets/australia. Usage: bash scripts/device_gmres.sh
set -u
cd "$(dirname "$0")/.."
D=.device
export PYTHONUNBUFFERED=1 SEISTOMO_BIN=$PWD/$D/seistomo
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
S=$OUT/summary.txt
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; date -u; } > $S
SEISTOMO_ROOT=$PWD timeout 150 $D/gpu-gmres-test --test-threads=1 --nocapture > $OUT/gpu_gmres_tests.txt 2>&1
echo "gpu_gmres tests rc=$?" >> $S; grep -E "test result|panicked" $OUT/gpu_gmres_tests.txt >> $S
# GMRES(16) Jacobi, 128^3 convection-diffusion: seistomo (CUDA) and CuPy in the same call
M=/tmp/cd128.mtx
$D/seistomo square --kind convdiff --n 128 -o $M 2>> $S
$D/seistomo export $M --format npy -o /tmp/cd128 2>> $OUT/export.err
timeout 100 python3 $D/cupy_gmres.py /tmp/cd128 16 1e-10 > $OUT/cupy_gmres.json 2> $OUT/cupy_gmres.err
G="solve --method gmres --matrix $M --restart 16 --rtol 1e-10 --precond jacobi"
for o in cgs2 mgs; do for p in f64 f32; do
  timeout 60 $D/seistomo $G --orthog $o --backend cuda --precision $p --report $OUT/gm_${o}_$p.json 2>> $S
done; done
timeout 60 $D/seistomo $G --orthog cgs2 --backend cuda --stop scipy --report $OUT/gm_cgs2_scipystop.json 2>> $S
timeout 60 $D/seistomo solve --method gmres --matrix $M --restart 16 --rtol 1e-10 --precond block-ilu0 \
  --ilu-sweeps 3 --orthog cgs2 --backend cuda --report $OUT/gm_ilu3.json 2>> $S
timeout 90 $D/seistomo $G --orthog cgs2 --backend cpu --report $OUT/gm_cpu.json 2>> $S
cat $OUT/cupy_gmres.json >> $S
# LSQR: australia and the 100.8M-nonzero system, CuPy in the same call
A="--matrix $D/datasets/australia/G.mtx.gz --rhs $D/datasets/australia/d.txt --reg $D/datasets/australia/R.mtx.gz --reg-weight 0.015"
$D/seistomo bench $A --iters 300 --backend all > $OUT/bench_australia.txt 2>> $OUT/bench.err
$D/seistomo bench $A --export-npy /tmp/npyA 2>> $OUT/bench.err
timeout 60 python3 $D/cupy_lsqr.py npy /tmp/npyA 300 > $OUT/cupy_australia.txt 2>&1
$D/seistomo bench --size large --export-npy /tmp/npy 2>> $OUT/bench.err
timeout 150 python3 $D/cupy_lsqr.py npy /tmp/npy 100 > $OUT/cupy_large.txt 2>&1
rm -rf /tmp/npy
$D/seistomo bench --size large --iters 100 > $OUT/bench_large.txt 2>> $OUT/bench.err
$D/seistomo bench --size large --sort-rays --iters 100 --transpose csc --precision f64,f32 > $OUT/bench_large_sorted.txt 2>> $OUT/bench.err
SEISTOMO_ROOT=$D timeout 120 $D/gpu-test --test-threads=1 > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$?" >> $S; grep -E "test result|panicked" $OUT/gpu_tests.txt >> $S
python3 - "$OUT" <<'PY' >> $S
import json, sys, glob, os
for f in sorted(glob.glob(os.path.join(sys.argv[1], "gm_*.json"))):
    r = json.load(open(f))
    print(f"{os.path.basename(f)}: {r['backend']} {r['precond']} {r['orthog']} n={r['n']} nnz={r['nnz']} "
          f"its={r['iterations']} conv={r['converged']} relres={r['relres']:.3e} ms/it={r['ms_per_iter']:.4f} "
          f"solve={r['seconds']['solve']:.3f}s setup={r['seconds']['setup']:.2f}s")
PY
cat $S; tail -4 $OUT/cupy_australia.txt; tail -4 $OUT/cupy_large.txt; cat $OUT/bench_australia.txt $OUT/bench_large.txt $OUT/bench_large_sorted.txt | grep -v "^$" | tail -40
