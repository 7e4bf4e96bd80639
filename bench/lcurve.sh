#!/usr/bin/env bash
# The L-curve in one batch against one solve per weight (docs/performance.md, "L-curve in one
# batch"): `seistomo lcurve` on australia ([G; w R], tol 1e-8, configs/australia-model.toml),
# batched and with --separate, on the CPU. From the repository root:
#
#   bash bench/lcurve.sh [BIN] [RANGE ...]    BIN default target/release/seistomo,
#                                             RANGE default 1e-4:1:11 (FROM:TO:COUNT)
#
# For each range: the wall time of each mode (best of REPS runs, default 1; the data's load,
# about 0.2 s, is in both), their ratio, the ratio of the solves alone (`solved in` of the
# best runs: the sweep without the load), the CPU seconds (user + sys, least of the runs: on a
# shared machine steadier than the wall time), and a check that the two curves agree (each point's ||G m - d|| and ||R m|| within 1e-10 relative,
# the same iterations, istop and corner). PROBES (default 0) sets [solver] gcv_probes: 0 times
# the L-curve alone, 1 adds GCV's probes (twice the solves, in both modes). THREADS sets
# --threads through the config's [backend] threads. ON=damp sweeps LSQR's damping on
# [G; 0.015 R] instead of R's weight ([solver] weight_on = "damp": the weights of one b share
# one bidiagonalisation; --separate solves each alone).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/seistomo}
shift || true
RANGES=("$@")
[ ${#RANGES[@]} -eq 0 ] && RANGES=(1e-4:1:11)
reps=${REPS:-1}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
root=$(pwd)
cfg="$OUT/australia-lcurve.toml"
sed -e "s#\.\./datasets#$root/datasets#g" -e "s#\"\.\./out/australia-model\"#\"$OUT/out\"#" \
  -e "s#^\[solver\]#[solver]\ngcv_probes = ${PROBES:-0}\nweight_on = \"${ON:-reg}\"#" configs/australia-model.toml > "$cfg"
if [ -n "${SYNTH:-}" ]; then
  s="$OUT/synth"
  rm -rf "$s" && mkdir -p "$s"
  "$BIN" synth -q --grid 32,32,16 --rays 40000 --noise 0.01 --flattening 1,1,1 -o "$s/ds" > /dev/null 2>&1
  "$BIN" export -q "$s/ds" --format mtx -o "$s/mtx" > /dev/null 2>&1
  python3 - "$s" 40000 <<'PY'
import sys
d, kr = sys.argv[1], int(sys.argv[2])
body = [l for l in open(f"{d}/mtx/A.mtx") if l.strip() and not l.startswith("%")]
m, n, _ = map(int, body[0].split())
g, r = [], []
for l in body[1:]:
    i, j, v = l.split()
    (g if int(i) <= kr else r).append(f"{int(i) if int(i) <= kr else int(i) - kr} {j} {v}")
for name, rows, ents in (("G", kr, g), ("R", m - kr, r)):
    with open(f"{d}/{name}.mtx", "w") as f:
        f.write(f"%%MatrixMarket matrix coordinate real general\n{rows} {n} {len(ents)}\n")
        f.write("\n".join(ents) + "\n")
b = [l.strip() for l in open(f"{d}/mtx/b.mtx") if l.strip() and not l.startswith("%")][1:]
open(f"{d}/d.txt", "w").write("\n".join(b[:kr]) + "\n")
PY
  cfg="$s/lcurve.toml"
  printf '[system]\nmatrix = "G.mtx"\nrhs = "d.txt"\nreg = "R.mtx"\n[solver]\natol = 1e-8\nbtol = 1e-8\ngcv_probes = %s\nweight_on = "%s"\nnoise = 0.01\n[output]\ndir = "out"\n' "${PROBES:-0}" "${ON:-reg}" > "$cfg"
fi
if [ -n "${THREADS:-}" ]; then printf '\n[backend]\nthreads = %s\n' "$THREADS" >> "$cfg"; fi
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
system=australia; [ -n "${SYNTH:-}" ] && system="synthetic 32x32x16, 40000 rays"
echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)   date: $(date -u +%F)   gcv_probes ${PROBES:-0}   weights on: ${ON:-reg}   system: $system"
echo "| range | batched s | separate s | ratio | solves alone: batched s, separate s, ratio | CPU s (user + sys): batched, separate, ratio | iterations (min-max, sum) | same curve |"
echo "|---|---|---|---|---|---|---|---|"
for range in "${RANGES[@]}"; do
  declare -A best=() solved=() cpus=()
  for i in $(seq "$reps"); do   # the modes alternate: a shared machine's load hits both alike
    for mode in batch separate; do
      flag=""; [ "$mode" = separate ] && flag="--separate"
      t0=$(date +%s.%N)
      cpu=$(python3 -c 'import resource, subprocess, sys
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL, stderr=open(sys.argv[-1] + ".log", "w"))
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(r.ru_utime + r.ru_stime)' "$BIN" lcurve "$cfg" --log-range "$range" $flag -o "$OUT/$mode")
      t=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.4f", b - a }')
      cpus[$mode]="${cpus[$mode]:-} $cpu"
      if [ -z "${best[$mode]:-}" ] || awk -v a="$t" -v b="${best[$mode]}" 'BEGIN { exit !(a < b) }'; then
        best[$mode]=$t
        solved[$mode]=$(sed -n 's/^solved in \([0-9.]*\) s$/\1/p' "$OUT/$mode.log")
      fi
    done
  done
  python3 - "$OUT" "$range" "${best[batch]}" "${best[separate]}" "${solved[batch]}" "${solved[separate]}" "${cpus[batch]}" "${cpus[separate]}" <<'PY'
import csv, sys
d, rng = sys.argv[1], sys.argv[2]
tb, ts, sb, ss = (float(v) for v in sys.argv[3:7])
cb, cs = (min(float(v) for v in a.split()) for a in sys.argv[7:9])
rows = {m: list(csv.DictReader(open(f"{d}/{m}/lcurve.csv"))) for m in ("batch", "separate")}
same = len(rows["batch"]) == len(rows["separate"])
for a, b in zip(rows["batch"], rows["separate"]):
    for k in ("residual_norm", "model_norm"):
        x, y = float(a[k]), float(b[k])
        same &= abs(x - y) <= 1e-10 * abs(y)
    same &= all(a[k] == b[k] for k in ("iterations", "istop", "corner"))
its = [int(r["iterations"]) for r in rows["batch"]]
print(f"| {rng} | {tb:.2f} | {ts:.2f} | {tb / ts:.3f} | {sb:.2f}, {ss:.2f}, {sb / ss:.3f} | {cb:.2f}, {cs:.2f}, {cb / cs:.3f} | {min(its)}-{max(its)}, {sum(its)} | {'yes' if same else 'NO'} |")
PY
  unset best solved cpus
done
