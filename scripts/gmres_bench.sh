#!/usr/bin/env bash
# GMRES(16) Jacobi on generated convection-diffusion systems: seistomo (CPU) against SciPy and
# PETSc (petsc4py) in the same run, one thread each (and seistomo on all threads).
# Usage: scripts/gmres_bench.sh [sizes...]   (default: 32 64 96); needs a release build.
set -euo pipefail
BIN=${BIN:-target/release/seistomo}
OUT=${OUT:-/tmp/seistomo-gmres-bench}
mkdir -p "$OUT"
for n in "${@:-32 64 96}"; do
  for kind in convdiff; do
    m="$OUT/${kind}${n}.mtx"
    [ -f "$m" ] || "$BIN" square --kind $kind --n "$n" -o "$m" 2>/dev/null
    for orth in mgs cgs cgs2; do
      "$BIN" solve --method gmres --matrix "$m" --restart 16 --rtol 1e-10 --precond jacobi \
        --orthog $orth --stop scipy --threads 1 --max-cycles 300 --report "$OUT/r.json" 2>/dev/null
      python3 -c "import json;r=json.load(open('$OUT/r.json'));print('seistomo-$orth-1t',r['n'],r['nnz'],r['iterations'],r['converged'],'%.3e'%r['relres'],'%.4f'%r['ms_per_iter'])"
    done
    "$BIN" solve --method gmres --matrix "$m" --restart 16 --rtol 1e-10 --precond jacobi \
      --orthog cgs2 --stop scipy --max-cycles 300 --report "$OUT/r.json" 2>/dev/null
    python3 -c "import json;r=json.load(open('$OUT/r.json'));print('seistomo-cgs2-%dt'%r['threads'],r['n'],r['nnz'],r['iterations'],r['converged'],'%.3e'%r['relres'],'%.4f'%r['ms_per_iter'])"
    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 /usr/bin/python3 scripts/gmres_reference.py --one "$m" --precond jacobi \
      | python3 -c "import json,sys;c=json.loads(sys.stdin.read());[print(k,c['n'],c['nnz'],c[k]['iterations'],c[k]['converged'],'%.3e'%c[k]['relres'],'%.4f'%c[k]['ms_per_iter']) for k in ('scipy','petsc') if k in c]"
  done
done
