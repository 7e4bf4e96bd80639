#!/bin/bash
# One GPU (H100 or H200): GMRES(16) Jacobi on the 2.1M-row convection-diffusion system with
# --orthog cgs / cgs2 / dcgs2 / mgs on the GPU in the same call (time per inner step), then the
# CPU dcgs2 solve for the iteration count and the answer. Needs .device/seistomo (a release
# build of this commit). Usage: bash scripts/device_dcgs2.sh [N (default 128)]
# Weak scaling on P GPUs (N^3 rows per GPU, z-slabs: 2 halo planes per interior rank):
#   bash scripts/device_dcgs2.sh weak P   (on nvidia-h200-xP; one MPI rank per GPU)
set -u
cd "$(dirname "$0")/.."
D=.device
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
S=$OUT/summary.txt
{ nvidia-smi --query-gpu=name,memory.total --format=csv; date -u; git rev-parse --short HEAD 2>/dev/null; } > $S
summ() {
python3 - "$@" <<'PY' >> $S
import json, sys
for f in sys.argv[1:]:
    r = json.load(open(f))
    print(f"{f.split('/')[-1]}: {r['backend']} {r['orthog']} ranks={r.get('ranks',1)} n={r['n']} its={r['iterations']} "
          f"conv={r['converged']} relres={r['relres']:.3e} ms/it={r['ms_per_iter']:.4f} solve={r['seconds']['solve']:.3f}s")
PY
}
if [ "${1:-}" = weak ]; then
  P=${2:-2}; N=${3:-128}
  export NCCL_NVLS_ENABLE=0
  MR="mpirun --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE"
  for p in 1 $P; do
    M=/tmp/cd_weak$p.mtx
    $D/seistomo square --kind convdiff --nx $N --ny $N --nz $((N * p)) -o $M 2>> $S
    for o in cgs dcgs2; do
      timeout 240 $MR -np $p $D/seistomo solve --method gmres --matrix $M --restart 16 --rtol 1e-10 \
        --precond jacobi --backend cuda --partition contiguous --orthog $o --report $OUT/weak${p}_$o.json 2>> $S
    done
    rm -f $M
  done
  summ $OUT/weak*_*.json; cat $S; exit 0
fi
N=${1:-128}
M=/tmp/cd$N.mtx
$D/seistomo square --kind convdiff --n $N -o $M 2>> $S
G="solve --method gmres --matrix $M --restart 16 --rtol 1e-10 --precond jacobi"
for o in cgs dcgs2 cgs2 mgs; do
  timeout 120 $D/seistomo $G --orthog $o --backend cuda --solution /tmp/x_$o.txt --report $OUT/gpu_$o.json 2>> $S
done
timeout 120 $D/seistomo $G --orthog dcgs2 --backend cuda --precision f32 --report $OUT/gpu_dcgs2_f32.json 2>> $S
timeout 200 $D/seistomo $G --orthog dcgs2 --backend cpu --solution /tmp/x_cpu.txt --report $OUT/cpu_dcgs2.json 2>> $S
summ $OUT/gpu_*.json $OUT/cpu_dcgs2.json
python3 - <<'PY' >> $S
import numpy as np
ref = np.loadtxt("/tmp/x_cgs2.txt")
for t in ("cgs", "dcgs2", "mgs", "cpu"):
    x = np.loadtxt(f"/tmp/x_{t}.txt")
    print(f"x_{t} vs GPU cgs2: rel diff {np.linalg.norm(x - ref) / np.linalg.norm(ref):.2e}")
PY
cat $S
