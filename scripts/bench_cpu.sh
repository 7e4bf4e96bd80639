#!/usr/bin/env bash
# LSQR ms/iteration on australia ([G; 0.015 R], tol 1e-8): seistomo (CPU backend, all cores)
# against SciPy and PETSc (one thread each), measured in the same run on this machine.
# Usage: scripts/bench_cpu.sh [repeats]   (needs a release build: make build)
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-5}
D=datasets/australia
bin=target/release/seistomo
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)   date: $(date -u +%F)"
best=""
for i in $(seq "$reps"); do
  $bin solve --matrix $D/G.mtx.gz --rhs $D/d.txt --reg $D/R.mtx.gz --reg-weight 0.015 \
    --atol 1e-8 --btol 1e-8 --conlim 1e14 --backend cpu --report "$tmp/r$i.json" 2>/dev/null
done
python3 - "$tmp" "$reps" <<'PY' > "$tmp/ours.txt"
import json, sys, statistics
d, n = sys.argv[1], int(sys.argv[2])
rs = [json.load(open(f"{d}/r{i}.json")) for i in range(1, n + 1)]
ms = statistics.median(r["ms_per_iter"] for r in rs)
r = rs[0]
print(f"seistomo-cpu-{r['threads']}-threads {r['iterations']} {ms:.4f} {r['r1norm']:.8e} {r['xnorm']:.8e}")
PY
OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 /usr/bin/python3 scripts/peer_lsqr.py $D/G.mtx.gz --rhs $D/d.txt \
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
