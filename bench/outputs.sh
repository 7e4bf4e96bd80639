#!/usr/bin/env bash
# The outputs of a fixed set of commands, for checking that a change leaves them as they were:
#   bash bench/outputs.sh BIN OUTDIR [cpu|cuda]
# runs invert (demo, australia with var, a synthetic dataset with every storage x precision,
# column scaling), solve (australia CSR and compact), GMRES (every orthogonalisation x
# preconditioner) and lcurve with BIN, writing every output under OUTDIR; then
#   python3 bench/compare_outputs.py OUTDIR_BEFORE OUTDIR_AFTER
# compares two such trees file by file (report.json without timings and run ids, model.h5
# without provenance, solutions and histories byte for byte). Run from the repository root.
set -u
BIN=$(readlink -f "$1"); OUT=$2; BK=${3:-cpu}
REPO=${REPO:-$PWD}
mkdir -p "$OUT"; OUT=$(readlink -f "$OUT")
cd "$REPO"
run() { local name=$1; shift; echo "== $name" >> "$OUT/log.txt"; "$@" >> "$OUT/log.txt" 2>&1; echo "rc $?" >> "$OUT/log.txt"; }
cfg() { # name dataset-or-system-toml-body extra
  local name=$1 body=$2
  mkdir -p "$OUT/$name"
  printf '%s\n[output]\ndir = "%s"\n' "$body" "$OUT/$name" > "$OUT/$name.toml"
}
S="$OUT/syn"
[ -d "$S" ] || "$BIN" -q synth -o "$S" --grid 20,18,10 --rays 6000 --norm-damping 0.1 --flattening 0.5,0.5,0.5 --seed 3 >/dev/null 2>&1
# demo
cfg demo "[dataset]
path = \"$REPO/datasets/demo/dataset.toml\"
[solver]
atol = 1e-8
btol = 1e-8
iter_lim = 1000
[backend]
kind = \"$BK\"
[model]
unknowns = \"slowness_perturbation\"
slowness_unit = \"s/km\"
reference = 2.0"
run demo "$BIN" -q invert "$OUT/demo.toml"
# australia model with checkpoints
cfg au "[system]
matrix = \"$REPO/datasets/australia/G.mtx.gz\"
rhs = \"$REPO/datasets/australia/d.txt\"
reg = \"$REPO/datasets/australia/R.mtx.gz\"
reg_weight = 0.015
[solver]
atol = 1e-8
btol = 1e-8
conlim = 1e14
calc_var = true
[backend]
kind = \"$BK\"
[model]
unknowns = \"slowness\"
slowness_unit = \"s/m\"
reference = \"mean\"
cells = \"$REPO/datasets/australia/cells.txt\""
run au "$BIN" -q invert "$OUT/au.toml"
# the synthetic dataset: `syn NAME ITERS [KEY = VALUE lines of [backend] or [solver]]`
syn() {
  local name=$1 iters=$2; shift 2
  cfg "$name" "[dataset]
path = \"$S/dataset.toml\"
[solver]
atol = 1e-8
btol = 1e-8
iter_lim = $iters
$(printf '%s\n' "${@}" | grep -v '^storage\|^precision')
[backend]
kind = \"$BK\"
$(printf '%s\n' "${@}" | grep '^storage\|^precision')"
  run "$name" "$BIN" -q invert "$OUT/$name.toml"
}
for st in auto csr compact; do for pr in f64 f32; do
 [ $st = csr ] && [ $pr = f32 ] && [ $BK = cpu ] && continue
 syn syn-$st-$pr 400 "storage = \"$st\"" "precision = \"$pr\""
done; done
syn syn-colscale 300 "col_scale = true" "reorder = \"none\""
mkdir -p "$OUT/solve-au"
run solve-au "$BIN" -q solve --matrix datasets/australia/G.mtx.gz --rhs datasets/australia/d.txt --reg datasets/australia/R.mtx.gz --reg-weight 0.015 --atol 1e-8 --btol 1e-8 --backend $BK --solution "$OUT/solve-au/x.txt" --report "$OUT/solve-au/report.json" --history "$OUT/solve-au/history.csv" --variance "$OUT/solve-au/var.txt"
mkdir -p "$OUT/solve-au-compact"
run solve-au-compact "$BIN" -q solve --matrix datasets/australia/G.mtx.gz --rhs datasets/australia/d.txt --reg datasets/australia/R.mtx.gz --reg-weight 0.015 --damp 0.001 --backend $BK --storage compact --precision f32 --solution "$OUT/solve-au-compact/x.txt" --report "$OUT/solve-au-compact/report.json" --history "$OUT/solve-au-compact/history.csv"
[ -f "$OUT/A.mtx.gz" ] || "$BIN" -q square --kind convdiff --n 16 -o "$OUT/A.mtx.gz" >/dev/null 2>&1
# block ILU(0) on the GPU solves its triangles by Jacobi sweeps, which it is told how many
sw=""; [ "$BK" = cuda ] && sw="--ilu-sweeps 3"
for o in mgs cgs cgs2 dcgs2; do for pc in jacobi block-ilu0; do
 mkdir -p "$OUT/gm-$o-$pc"
 swp=""; [ $pc = block-ilu0 ] && swp=$sw
 run gm-$o-$pc "$BIN" -q solve --method gmres --matrix "$OUT/A.mtx.gz" --precond $pc $swp --orthog $o --restart 16 --rtol 1e-10 --backend $BK --solution "$OUT/gm-$o-$pc/x.txt" --report "$OUT/gm-$o-$pc/report.json" --history "$OUT/gm-$o-$pc/history.csv"
done; done
mkdir -p "$OUT/lcurve"
printf '[system]\nmatrix = "%s"\nrhs = "%s"\nreg = "%s"\nreg_weight = 0.015\n[solver]\natol = 1e-6\nbtol = 1e-6\n[backend]\nkind = "%s"\n[output]\ndir = "%s"\n' "$REPO/datasets/australia/G.mtx.gz" "$REPO/datasets/australia/d.txt" "$REPO/datasets/australia/R.mtx.gz" $BK "$OUT/lcurve" > "$OUT/lcurve.toml"
run lcurve "$BIN" -q lcurve "$OUT/lcurve.toml" --log-range 1e-3:1e-1:3
echo done >> "$OUT/log.txt"
