#!/usr/bin/env bash
# The CPU tables of docs/performance.md and docs/gmres.md: seistomo's CPU backend against SciPy and
# PETSc (petsc4py) in the same run on this machine. From the repository root:
#
#   bash bench/cpu.sh [BIN] [parts]      BIN default target/release/seistomo (make build)
#
# parts (comma-separated, default lsqr): lsqr  LSQR on australia ([G; 0.015 R], tol 1e-8),
#   seistomo median of REPS runs (default 5) with THREADS threads (default all), SciPy and PETSc
#   one thread; compare  `seistomo compare` like with like (1 thread vs 1 rank, 2 vs 2);
#   gmres  GMRES(16) Jacobi on generated convection-diffusion systems (SIZES, default 32 64 96);
#   accuracy  compact storage against f64 CSR (bench/accuracy_compact.py);
#   pairs  ROUNDS (default 15) rounds of `seistomo compare --threads 1` (then 2) with compact
#   storage against PETSc only, each round one process of each back to back: every round's ratio
#   PETSc ms/iter / seistomo ms/iter, and their median, quartiles and range (on a shared VM single
#   runs vary by 20-30 %, so one round decides nothing). PIN=C (a core number) runs the
#   one-thread rounds, seistomo and PETSc alike, on core C only (taskset): steadier timings.
#   STORAGE=csr|compact|auto (default compact) picks seistomo's storage for the rounds;
#   setup  load and each set-up phase (report.json setup_phases) of `invert` on the 150k-ray
#   64x64x40 synthetic dataset (12.7M nonzeros, 100 iterations), compact and csr storage, best
#   (and median) of REPS runs, in seconds and M nonzeros/s;
#   mtx  Matrix Market read: seistomo (`solve` load, median of REPS) against SciPy's mmread (one
#   run) on the same files (square --n 64, plain and gzip; the 64x64x40 system exported, plain
#   and gzip; each gzipped twice: by `gzip`, one member, and by seistomo (cd64s, meds), members
#   decoded on every thread), MB/s of text; and seistomo's write (square --n 96, plain and .gz).
# PY: the Python of the peers (default /usr/bin/python3, the Debian SciPy and PETSc of the build
# machine; on another machine e.g. PY=python3). THREADS as for lsqr also limits mtx's reads.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/seistomo}; PARTS=${2:-lsqr}
reps=${REPS:-5}
PY=${PY:-/usr/bin/python3}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
has() { [[ ",$PARTS," == *",$1,"* ]]; }
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)   date: $(date -u +%F)"
if has lsqr; then
tmp=$OUT
D=datasets/australia
best=""
for i in $(seq "$reps"); do
  $BIN solve --matrix $D/G.mtx.gz --rhs $D/d.txt --reg $D/R.mtx.gz --reg-weight 0.015 \
    --atol 1e-8 --btol 1e-8 --conlim 1e14 --backend cpu ${THREADS:+--threads $THREADS} --report "$tmp/r$i.json" 2>/dev/null
done
python3 - "$tmp" "$reps" <<'PY' > "$tmp/ours.txt"
import json, sys, statistics
d, n = sys.argv[1], int(sys.argv[2])
rs = [json.load(open(f"{d}/r{i}.json")) for i in range(1, n + 1)]
ms = statistics.median(r["ms_per_iter"] for r in rs)
r = rs[0]
print(f"seistomo-cpu-{r['threads']}-threads {r['iterations']} {ms:.4f} {r['r1norm']:.8e} {r['xnorm']:.8e}")
PY
OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 $PY bench/peers/peer_lsqr.py $D/G.mtx.gz --rhs $D/d.txt \
  --reg $D/R.mtx.gz --lam 0.015 --tol 1e-8 > "$tmp/peers.json"
python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
name, its, ms, r1, xn = open(f"{d}/ours.txt").read().split()
peers = [json.loads(l) for l in open(f"{d}/peers.json")]
print(f"| solver | iterations | ms/iter | ||r|| | ||x|| | speed-up of seistomo |")
print(f"|---|---|---|---|---|---|")
print(f"| {name} | {its} | {float(ms):.3f} | {float(r1):.8e} | {float(xn):.8e} | 1.00 |")
for p in peers:
    if "skipped" in p:
        print(f"| {p['peer']} | skipped: {p['skipped']} | | | | |"); continue
    print(f"| {p['peer']} {p['version']} (1 thread) | {p['iterations']} | {p['ms_per_iter']:.3f} | {p['rnorm']:.8e} | {p['xnorm']:.8e} | {p['ms_per_iter']/float(ms):.2f} |")
PY
fi
if has compare; then
  for t in 1 2; do for s in compact csr; do "$BIN" compare configs/australia.toml --backend cpu --threads $t --storage $s; done; done
fi
if has pairs; then
  for t in 1 2; do
    pin=()
    if [[ -n "${PIN:-}" && $t == 1 ]]; then pin=(taskset -c "$PIN"); fi
    for i in $(seq "${ROUNDS:-15}"); do
      "${pin[@]}" "$BIN" compare configs/australia.toml --backend cpu --threads $t --storage "${STORAGE:-compact}" --peers petsc -q 2>/dev/null
    done | python3 -c '
import sys, statistics as st
t = sys.argv[1]
ours, petsc = [], []
for l in sys.stdin:
    c = [x.strip() for x in l.split("|")]
    if len(c) < 10 or not c[1] or c[1] == "solver" or c[1].startswith("-"):
        continue
    (ours if c[1].startswith("seistomo") else petsc).append(float(c[9]))
r = sorted(p / o for o, p in zip(ours, petsc))
q = st.quantiles(r, n=4)
print(f"threads {t}{sys.argv[2]}, storage {sys.argv[3]}: {len(r)} rounds; seistomo ms/iter median {st.median(ours):.4f}, PETSc {st.median(petsc):.4f}")
print(f"  PETSc / seistomo per round: median {st.median(r):.2f}, quartiles {q[0]:.2f}-{q[2]:.2f}, range {r[0]:.2f}-{r[-1]:.2f}, rounds >= 1: {sum(x >= 1 for x in r)}/{len(r)}")
print("  rounds: " + " ".join(f"{x:.2f}" for x in r))
' $t "${pin[*]:+ (${pin[*]})}" "${STORAGE:-compact}"
  done
fi
if has accuracy; then
  $PY bench/accuracy_compact.py "$BIN"
fi
if has gmres; then
for n in ${SIZES:-32 64 96}; do
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
    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 $PY tests/reference/gmres_reference.py --one "$m" --precond jacobi \
      | python3 -c "import json,sys;c=json.loads(sys.stdin.read());[print(k,c['n'],c['nnz'],c[k]['iterations'],c[k]['converged'],'%.3e'%c[k]['relres'],'%.4f'%c[k]['ms_per_iter']) for k in ('scipy','petsc') if k in c]"
  done
done
fi
# The 150k-ray 64x64x40 synthetic dataset (setup, mtx).
med() {
  D=$OUT/med
  [ -f "$D/dataset.toml" ] || "$BIN" -q synth -o "$D" --grid 64,64,40 --rays 150000 \
    --norm-damping 0.1 --flattening 0.5,0.5,0.5 >/dev/null 2>&1
}
if has setup; then
med
for s in compact csr; do
  sed -e 's/^iter_lim = .*/iter_lim = 100/' -e "s#^dir = .*#dir = \"$OUT/setup-$s\"#" \
    -e "s#^path = .*#path = \"$D/dataset.toml\"#" "$D/invert.toml" > "$OUT/setup-$s.toml"
  printf '\n[backend]\nkind = "cpu"\nstorage = "%s"\n' "$s" >> "$OUT/setup-$s.toml"
  for i in $(seq "$reps"); do
    rm -rf "$OUT/setup-$s"
    "$BIN" -q invert "$OUT/setup-$s.toml" >/dev/null 2>&1
    cp "$OUT/setup-$s/report.json" "$OUT/setup-$s-$i.json"
  done
done
python3 - "$OUT" "$reps" <<'PY'
import json, sys, statistics
d, n = sys.argv[1], int(sys.argv[2])
rs = {s: [json.load(open(f"{d}/setup-{s}-{i}.json")) for i in range(1, n + 1)] for s in ("compact", "csr")}
nnz = rs["compact"][0]["nnz"]
names = []
for s in rs:
    for r in rs[s]:
        names += [k for k in r["setup_phases"] if k not in names and k != "read"]
# best of the runs (a shared machine's other work only slows a run down) and the median
best = lambda s, f: min(f(r) for r in rs[s])
med = lambda s, f: statistics.median(f(r) for r in rs[s])
print(f"64x64x40, 150k rays: {nnz / 1e6:.2f}M nonzeros, {rs['compact'][0]['threads']} threads; best of {n} runs (median)")
print("| phase | compact s | compact M nnz/s | csr s | csr M nnz/s |")
print("|---|---|---|---|---|")
def row(name, f):
    cells = []
    for s in ("compact", "csr"):
        t, m = best(s, f), med(s, f)
        cells += [f"{t:.3f} ({m:.3f})", f"{nnz / t / 1e6:.0f}" if t > 1e-4 else "-"]
    print(f"| {name} | " + " | ".join(cells) + " |")
row("load", lambda r: r["seconds"]["load"])
for k in names:
    row(k, lambda r, k=k: r["setup_phases"].get(k, 0.0))
row("set-up (all)", lambda r: r["seconds"]["setup"])
row("**load + set-up**", lambda r: r["seconds"]["load"] + r["seconds"]["setup"])
PY
fi
if has mtx; then
med
M=$OUT/mtx
mkdir -p "$M"
[ -f "$M/cd64.mtx" ] || "$BIN" -q square --kind convdiff --n 64 -o "$M/cd64.mtx" 2>/dev/null
[ -f "$M/cd64.mtx.gz" ] || gzip -c "$M/cd64.mtx" > "$M/cd64.mtx.gz"
[ -f "$M/med/A.mtx" ] || "$BIN" -q export "$D" --format mtx -o "$M/med" >/dev/null 2>&1
[ -f "$M/med/A.mtx.gz" ] || gzip -c "$M/med/A.mtx" > "$M/med/A.mtx.gz"
# the same text gzipped by seistomo (members that say their lengths: decoded on every thread)
[ -f "$M/cd64s.mtx.gz" ] || "$BIN" -q square --kind convdiff --n 64 -o "$M/cd64s.mtx.gz" 2>/dev/null
[ -f "$M/meds/A.mtx.gz" ] || "$BIN" -q export "$D" --format mtx.gz -o "$M/meds" >/dev/null 2>&1
echo "Matrix Market read, MB/s of (uncompressed) text; seistomo: solve's load, median of $reps; SciPy $($PY -c 'import scipy; print(scipy.__version__)') mmread: one run"
echo "| file | text MB | nonzeros | seistomo s | seistomo MB/s | SciPy s | SciPy MB/s | seistomo / SciPy |"
echo "|---|---|---|---|---|---|---|---|"
for f in cd64.mtx cd64.mtx.gz cd64s.mtx.gz med/A.mtx med/A.mtx.gz meds/A.mtx.gz; do
  t=${f%.gz}; t=${t/cd64s/cd64}; t=${t/meds/med}
  text=$(stat -c %s "$M/$t")
  for i in $(seq "$reps"); do
    "$BIN" solve --matrix "$M/$f" --backend cpu ${THREADS:+--threads $THREADS} --iter-lim 1 --reorder none --report "$M/r$i.json" >/dev/null 2>&1
  done
  $PY - "$M" "$f" "$text" "$reps" <<'PY'
import json, statistics, sys, time
import scipy.io
m, f, text, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rs = [json.load(open(f"{m}/r{i}.json")) for i in range(1, n + 1)]
ours = statistics.median(r["seconds"]["load"] for r in rs)
t = time.perf_counter()
a = scipy.io.mmread(f"{m}/{f}")
theirs = time.perf_counter() - t
assert a.nnz == rs[0]["nnz"], (a.nnz, rs[0]["nnz"])
mb = text / 1e6
print(f"| {f} | {mb:.0f} | {a.nnz} | {ours:.3f} | {mb / ours:.0f} | {theirs:.2f} | {mb / theirs:.0f} | {theirs / ours:.1f}x |")
PY
done
echo "Matrix Market write (seistomo square --kind convdiff --n 96: 884,736 rows), MB/s of text"
for o in cd96.mtx cd96.mtx.gz; do
  rm -f "$M/$o"
  "$BIN" square --kind convdiff --n 96 -o "$M/$o" 2>&1 | python3 -c "
import re, sys, os
l = sys.stdin.read(); s = float(re.search(r'written in ([0-9.]+) s', l).group(1))
mb = os.path.getsize('$M/cd96.mtx') / 1e6 if os.path.exists('$M/cd96.mtx') else float('nan')
print(f'  $o: {s:.3f} s, {mb / s:.0f} MB/s of text')"
done
fi
