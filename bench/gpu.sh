#!/bin/bash
# Every GPU table of docs/performance.md, docs/gpu.md and docs/gmres.md, with the peers (CuPy) in
# the same call. Run from the repository root on the GPU machine:
#
#   bash bench/gpu.sh BIN_DIR OUT [parts]
#
# BIN_DIR: a folder with `seistomo` (release build) and, for the `tests` part, the release test
#          binaries `gpu`, `gpu_compact`, `gpu_gmres`, `gpu_batch` (cargo test --release --no-run --test NAME;
#          cargo prints their paths). OUT: a folder for the logs and tables (created).
# parts (comma-separated, default lsqr,gmres):
#   tests     the GPU test binaries (every CUDA kernel against the CPU backend), with
#             --include-ignored: the tests that need a GPU are #[ignore]d elsewhere
#   python    the Python module's whole test suite (python/tests) on this machine's Python, from
#             the manylinux wheel of this tree (`make wheel`: dist/seistomo-*.whl, or WHEEL=path)
#             installed into OUT/pylib: the GPU's paths of lsqr, lsmr, gmres, lcurve and CuPy
#             input run here; the failures listed (-rf)
#   lsqr      LSQR on australia and on the 100.7M-nonzero straight-ray system, CSR and compact
#             storage, f64/f32, device/host loop, beside CuPy's LSQR loop on the identical
#             systems (as built and reordered)                      -> performance.md, gpu.md
#   layouts   compact storage layouts and tile sizes on the large system          -> gpu.md
#   orders    CSR transpose strategies (csc, scatter, cuSPARSE) and orderings     -> gpu.md
#   gmres     GMRES(16) on the 2.1M-row convection-diffusion system, every orthogonalisation,
#             beside CuPy's gmres                                     -> performance.md, gmres.md
#   multigpu  LSQR on 1 and 2 GPUs (one MPI rank per GPU): the defaults (the device loop summing
#             through the GPUs' memory), host and NCCL allreduce (NCCL with the device loop and
#             with the host loop), a 100M and a 4x larger synthetic dataset
#             (nvidia-h100-x2)                                                -> performance.md
#   restarts  GMRES Jacobi, cgs, on GPU 0: the device and the host Arnoldi loop at restarts 16 and
#             64 (RESTARTS), 2.1M and 16.8M rows (RESTART_N="128 256"), and $PREV's device loop
#             beside them                                       -> performance.md, gmres.md
#   gmres2    GMRES(16) Jacobi on 1 and 2 GPUs (2.1M and 16.8M rows; GMRES2_N="128 256"),
#             the 2-GPU defaults (through the GPUs' memory), NCCL and the host path; $BASE's
#             and $PREV's 2-GPU defaults beside them            -> performance.md, gmres.md
#   sums      one vector summed over the GPUs by every path (the GPUs' memory, NCCL's all-reduce,
#             the host): `seistomo bench --sums` on all GPUs, nccl-tests' algbw/busbw;
#             LSQR's A^T u (1.31M values) and a 128 MB vector (SUMS="1310720 16777216")
#                                                                              -> performance.md
#   scale     LSQR (101M nonzeros) and GMRES (16.8M rows) on 1, 2, 4, ... GPUs, the defaults
#             (nvidia-h100-x4 for four)                                         -> performance.md
#   weak      GMRES weak scaling, N^3 rows per GPU (N=128), cgs vs dcgs2 on 1 and P GPUs
#             (P = $GPUS, default 2; z-slabs, contiguous partition)              -> gmres.md
#   timeline  a defaults invert (prepared storage, each binary's own file) stamped line by
#             line (timeline.py) with every phase traced (--trace-phases), this binary
#             and seistomo-prev beside it
#   batch     batched LSQR (issue 33) on the 600k-ray dataset (the tts part's): its L-curve over 8
#             and 16 weights of the damping rows as one batch (`seistomo lcurve` with [tuning]
#             gpu_batch = true; atol = btol = 0, so every member runs 300 iterations), f32 and
#             f64, beside one `invert` of the same system (the defaults, compact storage; and
#             csr); three of the weights solved one by one (`lcurve --separate`, each its own
#             default solve), their points compared with the batch's; f32: the 16 weights one
#             solve after another (wall beside the batch's); australia's L-curve (11 weights)
#             batched and one solve after another; the block products alone (gpu_batch's
#             time_block_kernels_on_a_dataset) beside cuSPARSE's SpMM through CuPy
#             (bench/peers/cupy_spmm.py, cupy_spmm.txt)                      -> performance.md
#   damps     LSQR's dampings of one system in one bidiagonalisation (issue 33): the 600k-ray
#             dataset's L-curve over 8 and 16 values of LSQR's damping on [G; R] (`lcurve
#             --weight-on damp`, 300 iterations, f32 and f64) beside one `invert` (device and
#             host loop), and three dampings one solve after another against the pass
#                                                                              -> performance.md
#   lcurve    the L-curve with the defaults (GCV's probe) and without it on the 600k-ray dataset:
#             16 weights of R (the batch) and 16 of LSQR's damping (one bidiagonalisation), 300
#             iterations, beside $BIN/seistomo-prev; wall, solves, the points' time, the curves
#             compared                                                       -> performance.md
#   tts4      time to solution on the 4x dataset (369M nonzeros), fresh and prepared, on one GPU
#             and (when there are two) on two
#   tts       time to solution: `invert` with the defaults on the 600k-ray 128x128x80 dataset
#             (300 iterations): 1 GPU defaults, f32, the CPU's encoding (gpu_encode = false),
#             csr, and 2 GPUs when there are two (the
#             defaults: device loop with NCCL; and the host loop); then from prepared storage
#             (f64, f32 prepared in f32, 2 ranks; a file seistomo-prev prepared; and
#             seistomo-prev's own fresh and prepared runs when BIN_DIR has it);
#             load / set-up (each phase) / solve / total from report.json; with $BASE (another
#             binary) its defaults too; the CuPy user's time to solution on the same system
#             (bench/peers/cupy_tts.py)                                       -> performance.md
#   auto      storage = "auto" against csr and compact on every bundled and generated system
#             (LSQ set, australia, demo, the 150k- and 600k-ray synthetics): ms/iteration of
#             each, auto's choice and why                                   -> performance.md
#   same      the outputs of bench/outputs.sh on the GPU with BIN_DIR/seistomo and with
#             $BASE (another binary), compared by bench/compare_outputs.py
#   speed     bench --size large (compact f32/f64 and CSR f64, device loop) with BIN_DIR/seistomo
#             and with $BASE in the same call: the refactor's "within 2 %" check
# The one-off scripts of earlier sessions (scripts/device_*.sh) map onto these parts:
# device_gpu/device_reorder/device_compact -> lsqr, layouts; device_followup -> gmres, orders;
# device_gmres -> gmres, lsqr; device_check/device_multigpu -> multigpu; device_gmres_2gpu -> gmres2.
set -u
BIN=$(cd "${1:?BIN_DIR}" && pwd); OUT=${2:?OUT}; PARTS=${3:-lsqr,gmres}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
PEERS=$PWD/bench/peers
export PYTHONUNBUFFERED=1 SEISTOMO_ROOT=$PWD SEISTOMO_BIN=$BIN/seistomo NCCL_NVLS_ENABLE=0
S=$OUT/summary.txt
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv; date -u
  echo "binary: $("$BIN/seistomo" --version 2>/dev/null)"; } > "$S"
has() { [[ ",$PARTS," == *",$1,"* ]]; }
AU="--matrix datasets/australia/G.mtx.gz --rhs datasets/australia/d.txt --reg datasets/australia/R.mtx.gz --reg-weight 0.015"
cupy_lsqr() { ( cd /tmp && timeout "$3" python3 "$PEERS/cupy_lsqr.py" npy "$1" "$2" ); }
gmres_table() {
  python3 - "$@" <<'PY'
import json, sys, os
for f in sys.argv[1:]:
    if not os.path.exists(f): continue
    r = json.load(open(f))
    print(f"{os.path.basename(f)}: {r['backend']} {r['precond']} {r['orthog']} n={r['n']} nnz={r['nnz']} "
          f"its={r['iterations']} conv={r['converged']} relres={r['relres']:.3e} ms/it={r['ms_per_iter']:.4f} "
          f"loop={r.get('arnoldi_loop', '-')} storage={r.get('storage', '-')[:16]}")
PY
}
lsqr_table() {
  python3 - "$@" <<'PY'
import json, sys, os
for f in sys.argv[1:]:
    if not os.path.exists(f): continue
    r = json.load(open(f)); t = r.get("rank_timing") or []
    red = " ".join(f"r{x['rank']}: product {x['product_ms']:.3f} allreduce {x['allreduce_ms']:.3f} ms "
                   f"(in the run {1e3*x['allreduce_s']/r['iterations']:.3f} ms/it)" for x in t)
    s = r["seconds"]
    print(f"{os.path.basename(f)}: {r.get('lsqr_loop', '?')} loop, {r['storage'][:30]} {r['transpose'][:60]} "
          f"nnz={r['nnz']} its={r['iterations']} r1={r['r1norm']:.12e} ms/it={r['ms_per_iter']:.4f} "
          f"load {s['load']:.2f} setup {s['setup']:.2f} total {s['total']:.2f}\n   {red}")
PY
}
nccl_path() {
  local l; l=$(find / -name 'libnccl.so*' 2>/dev/null | head -1)
  [ -n "$l" ] && export LD_LIBRARY_PATH=$(dirname "$l"):${LD_LIBRARY_PATH:-}
  echo "libnccl: ${l:-not found}" >> "$S"
}
# Run a command and print its wall-clock seconds ("12.3 s wall") after it.
wall() { local t0; t0=$(date +%s.%N); "$@"; local rc=$?; awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f s wall\n", b - a }'; return $rc; }
MR="mpirun --allow-run-as-root --bind-to none -np 2 -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH"

if has tests; then
  nccl_path  # the two-GPU tests of LSQR's device loop (NCCL or the GPUs' memory inside its graph)
  for t in gpu gpu_compact gpu_gmres gpu_batch; do
    [ -x "$BIN/$t" ] || { echo "test $t: not in $BIN" >> "$S"; continue; }
    timeout 240 "$BIN/$t" --include-ignored --test-threads 1 --nocapture > "$OUT/test_$t.txt" 2>&1
    echo "test $t: rc $? $(grep -E '^test result' "$OUT/test_$t.txt")" >> "$S"
  done
fi

if has python; then
  W=${WHEEL:-$(ls dist/seistomo-*.whl 2>/dev/null | tail -1)}
  if [ -z "$W" ]; then
    echo "python: no wheel (make wheel, or WHEEL=path)" >> "$S"
  else
    rm -rf "$OUT/pylib"
    python3 -m pip install --no-deps -q --disable-pip-version-check --target "$OUT/pylib" "$W" \
      > "$OUT/python_install.txt" 2>&1
    (cd python/tests && PYTHONPATH="$OUT/pylib" timeout 900 python3 -m pytest -q -rf \
      -p no:cacheprovider -W ignore::DeprecationWarning --tb=short . > "$OUT/python.txt" 2>&1)
    echo "python: rc $? $(tail -1 "$OUT/python.txt")" >> "$S"
    grep -E '^FAILED' "$OUT/python.txt" >> "$S"
  fi
fi

if has lsqr; then
  timeout 150 "$BIN/seistomo" bench $AU --reorder auto --iters 300 --storage csr,compact \
    --precision f64,f32 --transpose csc --loops device,host > "$OUT/bench_australia.txt" 2>> "$OUT/log.txt"
  "$BIN/seistomo" bench $AU --reorder auto --export-npy /tmp/npy_au 2>> "$OUT/log.txt"
  cupy_lsqr /tmp/npy_au 300 120 > "$OUT/cupy_australia.txt" 2>&1; rm -rf /tmp/npy_au
  timeout 300 "$BIN/seistomo" bench --size large --reorder auto --iters 100 --storage csr,compact \
    --precision f64,f32 --transpose csc --loops device,host --json "$OUT/bench_large.json" \
    > "$OUT/bench_large.txt" 2>> "$OUT/log.txt"
  for r in auto none; do
    "$BIN/seistomo" bench --size large --reorder $r --export-npy /tmp/npy_$r 2>> "$OUT/log.txt"
    cupy_lsqr /tmp/npy_$r 100 150 > "$OUT/cupy_large_$r.txt" 2>&1; rm -rf /tmp/npy_$r
  done
fi

if has layouts; then
  for cfg in "gpu_layout=mixed tile_bits=9" "gpu_layout=mixed tile_bits=10" \
             "gpu_layout=tiles tile_bits=9" "gpu_layout=tiles tile_bits=12" "gpu_layout=rows"; do
    echo "## $cfg" >> "$OUT/layouts.txt"
    tune=(); for kv in $cfg; do tune+=(--tune "$kv"); done
    timeout 150 "$BIN/seistomo" bench --size large --reorder auto --iters 100 --storage compact \
      --precision f32,f64 --loops device "${tune[@]}" 2>> "$OUT/log.txt" | tail -2 >> "$OUT/layouts.txt"
  done
fi

if has orders; then
  for r in none auto; do
    echo "## reorder $r" >> "$OUT/orders.txt"
    timeout 200 "$BIN/seistomo" bench --size large --reorder $r --iters 100 --storage csr \
      --transpose csc,scatter,library --precision f64,f32 --loops host 2>> "$OUT/log.txt" >> "$OUT/orders.txt"
  done
fi

if has gmres; then
  M=/tmp/cd128.mtx
  "$BIN/seistomo" square --kind convdiff --n 128 -o $M 2>> "$S"
  "$BIN/seistomo" export $M --format npy -o /tmp/cd128 2>> "$OUT/log.txt"
  ( cd /tmp && timeout 100 python3 "$PEERS/cupy_gmres.py" /tmp/cd128 16 1e-10 ) > "$OUT/cupy_gmres.json" 2>> "$OUT/log.txt"
  G="solve --method gmres --matrix $M --restart 16 --rtol 1e-10 --precond jacobi --backend cuda"
  for o in ${ORTHOGS:-cgs dcgs2 cgs2 mgs}; do
    timeout 60 "$BIN/seistomo" $G --orthog $o --solution /tmp/x_$o.txt --report "$OUT/gm_${o}_f64.json" 2>> "$OUT/log.txt"
  done
  timeout 60 "$BIN/seistomo" $G --orthog cgs --precision f32 --report "$OUT/gm_cgs_f32.json" 2>> "$OUT/log.txt"
  # the defaults (orthog and Arnoldi loop auto)
  timeout 60 "$BIN/seistomo" $G --report "$OUT/gm_default_f64.json" 2>> "$OUT/log.txt"
  # CSR storage beside the default row patterns (src/sparse/patterns.rs)
  for p in f64 f32; do
    timeout 60 "$BIN/seistomo" $G --orthog cgs --precision $p --storage csr --report "$OUT/gm_cgs_csr_$p.json" 2>> "$OUT/log.txt"
  done
  # the Arnoldi loop of earlier sessions: each inner product back to the host as it is computed
  timeout 60 "$BIN/seistomo" $G --orthog cgs --arnoldi-loop host --report "$OUT/gm_cgs_hostloop_f64.json" 2>> "$OUT/log.txt"
  timeout 60 "$BIN/seistomo" $G --orthog dcgs2 --precision f32 --report "$OUT/gm_dcgs2_f32.json" 2>> "$OUT/log.txt"
  python3 - > "$OUT/gmres_xdiff.txt" 2>&1 <<'PY'
import numpy as np, os
ref = np.loadtxt("/tmp/x_cgs2.txt")
for t in ("cgs", "dcgs2", "mgs"):
    if os.path.exists(f"/tmp/x_{t}.txt"):
        x = np.loadtxt(f"/tmp/x_{t}.txt")
        print(f"x_{t} vs GPU cgs2: rel diff {np.linalg.norm(x - ref) / np.linalg.norm(ref):.2e}")
PY
  timeout 60 "$BIN/seistomo" solve --method gmres --matrix $M --restart 16 --rtol 1e-10 --precond block-ilu0 \
    --ilu-sweeps 3 --orthog cgs2 --backend cuda --report "$OUT/gm_ilu3_cgs2.json" 2>> "$OUT/log.txt"
  rm -rf /tmp/cd128
fi

if has multigpu; then
  nccl_path
  # SCALES: which datasets (1: 600k rays, 4: 2.4M); EXTRA="nccl8": NCCL with nccl_max_ctas = 8;
  # PIECES="2 4 8": the defaults with A^T u in that many pieces (tuning atu_pieces);
  # PREV: an older binary whose host path runs too
  for scale in ${SCALES:-1 4}; do
    ds=/tmp/big$scale
    "$BIN/seistomo" synth --out $ds --grid 128,128,80 --rays $((600000 * scale)) --norm-damping 0.1 \
      --flattening 0.5,0.5,0.5 --damping-blocks 2 > /dev/null 2>> "$OUT/log.txt"
    for run in np1 auto host nccl ncclhost ${EXTRA:-} ${PIECES:+$(printf 'pieces%s ' $PIECES)}; do
      cfg=/tmp/$run-$scale.toml; path=${run/np1/auto}; path=${path/ncclhost/nccl}; path=${path/nccl8/nccl}
      [[ $run == pieces* ]] && path=auto
      lp=auto; [ $run = ncclhost ] && lp=host
      printf '[dataset]\npath = "%s/dataset.toml"\n[solver]\natol = 0\nbtol = 0\nconlim = 0\niter_lim = 200\n[backend]\nkind = "cuda"\nallreduce = "%s"\nlsqr_loop = "%s"\n[output]\ndir = "/tmp/o-%s-%s"\nmodel = ""\n' \
        $ds $path $lp $run $scale > $cfg
      [ $run = nccl8 ] && printf '[tuning]\nnccl_max_ctas = 8\n' >> $cfg
      [[ $run == pieces* ]] && printf '[tuning]\natu_pieces = %s\n' ${run#pieces} >> $cfg
      if [ $run = np1 ]; then "$BIN/seistomo" invert $cfg 2>> "$OUT/log.txt"
      else $MR "$BIN/seistomo" invert $cfg 2>> "$OUT/log.txt"; fi
      cp /tmp/o-$run-$scale/report.json "$OUT/lsqr_x${scale}_$run.json" 2>/dev/null
    done
    # $PREV (an older binary): its host path beside this one's
    if [ -n "${PREV:-}" ]; then
      $MR "$PREV" invert /tmp/host-$scale.toml 2>> "$OUT/log.txt"
      cp /tmp/o-host-$scale/report.json "$OUT/lsqr_x${scale}_host_prev.json" 2>/dev/null
    fi
    rm -rf $ds
  done
  lsqr_table "$OUT"/lsqr_x*.json > "$OUT/multigpu.txt"
fi

if has restarts; then
  # The device loop launches a cycle 16 steps at a time (src/solver/gmres/arnoldi.rs
  # DEVICE_STEPS): at restart 64 it must not be slower than the host loop.
  for n in ${RESTART_N:-128 256}; do
    M=/tmp/cr$n.mtx
    "$BIN/seistomo" -q square --kind convdiff --n $n -o $M 2>> "$S"
    for R in ${RESTARTS:-16 64}; do
      for v in device host ${PREV:+prev}; do
        b="$BIN/seistomo"; lp=$v; [ $v = prev ] && { b=$PREV; lp=device; }
        CUDA_VISIBLE_DEVICES=0 timeout 120 "$b" solve --method gmres --matrix $M --restart $R \
          --rtol 1e-10 --precond jacobi --backend cuda --orthog cgs --arnoldi-loop $lp \
          --report "$OUT/gr_n${n}_r${R}_$v.json" 2>> "$OUT/log.txt"
      done
    done
    rm -f $M
  done
  gmres_table "$OUT"/gr_*.json > "$OUT/restarts.txt"
fi

if has gmres2; then
  nccl_path
  # GMRES(16) Jacobi on 1 GPU and on 2 (defaults: the halo and the reductions through the GPUs'
  # memory; NCCL, at most one thread block an operation; and the host path), 2.1M and 16.8M
  # rows; with $BASE (an older binary) its 2-GPU defaults beside them, and $PREV's
  for n in ${GMRES2_N:-128 256}; do
    M=/tmp/cd$n.mtx
    [ -f $M ] || "$BIN/seistomo" -q square --kind convdiff --n $n -o $M 2>> "$S"
    G="solve --method gmres --matrix $M --restart 16 --rtol 1e-10 --precond jacobi --backend cuda"
    CUDA_VISIBLE_DEVICES=0 timeout 120 "$BIN/seistomo" $G --report "$OUT/g1_n$n.json" 2>> "$OUT/log.txt"
    for ar in auto nccl host; do
      timeout 120 $MR "$BIN/seistomo" $G --allreduce $ar --report "$OUT/g2_n${n}_$ar.json" 2>> "$OUT/log.txt"
    done
    for b in ${BASE:-} ${PREV:-}; do
      timeout 120 $MR "$b" $G --report "$OUT/g2_n${n}_$(basename $b).json" 2>> "$OUT/log.txt"
    done
    rm -f $M
  done
  gmres_table "$OUT"/g1_n*.json "$OUT"/g2_n*.json > "$OUT/gmres2.txt"
fi

if has sums; then
  nccl_path
  ng=$(nvidia-smi -L | wc -l)
  for v in ${SUMS:-1310720 16777216}; do
    timeout 120 mpirun --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -np $ng \
      "$BIN/seistomo" bench --sums $v --iters 200 --json "$OUT/sums_$v.json" > "$OUT/sums_$v.txt" 2>> "$OUT/log.txt"
    cat "$OUT/sums_$v.txt" >> "$S"
  done
fi

if has scale; then
  nccl_path
  # LSQR (the 600k-ray dataset, 4 damping blocks, 200 iterations) and GMRES(16) Jacobi
  # (16.8M rows) on 1, 2, 4, ... GPUs up to the machine's, the defaults
  ng=$(nvidia-smi -L | wc -l); ps=1; p=2; while [ $p -le $ng ]; do ps="$ps $p"; p=$((2 * p)); done
  ds=/tmp/scale600k
  "$BIN/seistomo" -q synth --out $ds --grid 128,128,80 --rays 600000 --norm-damping 0.1 \
    --flattening 0.5,0.5,0.5 --damping-blocks 4 > /dev/null 2>> "$OUT/log.txt"
  for p in $ps; do
    printf '[dataset]\npath = "%s/dataset.toml"\n[solver]\natol = 0\nbtol = 0\nconlim = 0\niter_lim = 200\n[backend]\nkind = "cuda"\n[output]\ndir = "/tmp/o-scale%s"\nmodel = ""\n' \
      $ds $p > /tmp/scale$p.toml
    timeout 300 mpirun --allow-run-as-root --bind-to none -np $p -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH \
      "$BIN/seistomo" invert /tmp/scale$p.toml 2>> "$OUT/log.txt"
    cp /tmp/o-scale$p/report.json "$OUT/lsqr_x1_np$p.json" 2>/dev/null
  done
  rm -rf $ds
  M=/tmp/cd256.mtx
  [ -f $M ] || "$BIN/seistomo" -q square --kind convdiff --n 256 -o $M 2>> "$S"
  for p in $ps; do
    timeout 300 mpirun --allow-run-as-root --bind-to none -np $p -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH \
      "$BIN/seistomo" solve --method gmres --matrix $M --restart 16 --rtol 1e-10 --precond jacobi \
      --backend cuda --report "$OUT/gs_n256_np$p.json" 2>> "$OUT/log.txt"
  done
  rm -f $M
  { lsqr_table "$OUT"/lsqr_x1_np*.json; gmres_table "$OUT"/gs_n256_np*.json; } > "$OUT/scale.txt"
fi

if has weak; then
  nccl_path
  P=${GPUS:-2}; N=${WEAK_N:-128}
  for p in 1 $P; do
    M=/tmp/cd_weak$p.mtx
    "$BIN/seistomo" square --kind convdiff --nx $N --ny $N --nz $((N * p)) -o $M 2>> "$OUT/log.txt"
    for o in cgs dcgs2; do
      timeout 240 mpirun --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -np $p \
        "$BIN/seistomo" solve --method gmres --matrix $M --restart 16 --rtol 1e-10 --precond jacobi \
        --backend cuda --partition contiguous --orthog $o --report "$OUT/gw${p}_$o.json" 2>> "$OUT/log.txt"
    done
    rm -f $M
  done
fi

if has tts; then
  nccl_path
  ds=/tmp/tts600k
  # format version 2 when $BASE runs too: a binary from before version 3 reads it
  fv=3; [ -n "${BASE:-}" ] && fv=2
  [ -d $ds ] || "$BIN/seistomo" -q synth -o $ds --grid 128,128,80 --rays 600000 --norm-damping 0.1 \
    --flattening 0.5,0.5,0.5 --format-version $fv > /dev/null 2>> "$OUT/log.txt"
  ngpu=$(nvidia-smi -L | wc -l)
  # The prepared runs (prep*) read the storage `seistomo prepare` kept in the dataset (issue 30
  # item 2): written once for one rank and once for two, timed, before them.
  rm -rf $ds/prepared
  # cpuenc: the rows reordered and encoded on the CPU (`[tuning] gpu_encode = false`), as
  # before the GPU did it
  runs="defaults f32 cpuenc csr np2 np2host"; [ -n "${BASE:-}" ] && runs="$runs base"
  # prepf32 reads a file prepared with precision f32 (the GPU encoding is made for one
  # precision); prepold reads a file that seistomo-prev prepared (rows only, when that binary is
  # there), so that the same binary's prepared run is timed with and without the kept encoding;
  # prevdefaults and prevprep are seistomo-prev's own fresh and prepared runs.
  [ -x "$BIN/seistomo-prev" ] && runs="$runs prevdefaults"
  for run in $runs prepare prepdefaults prepnp2 preparef32 prepf32 prepold prevprep; do
    cfg=/tmp/tts-$run.toml
    extra=""; [ $run = f32 ] || [ $run = prepf32 ] || [ $run = preparef32 ] && extra='precision = "f32"'
    [ $run = csr ] && extra='storage = "csr"'
    [ $run = np2host ] && extra='lsqr_loop = "host"'
    tun=""; [ $run = cpuenc ] && tun='gpu_encode = false'
    printf '[dataset]\npath = "%s/dataset.toml"\n[solver]\niter_lim = 300\n[backend]\n%s\n[tuning]\n%s\n[output]\ndir = "/tmp/tts-o-%s"\n' \
      $ds "$extra" "$tun" $run > $cfg
    if [ $run = prepare ] || [ $run = preparef32 ]; then
      CUDA_VISIBLE_DEVICES=0 wall "$BIN/seistomo" prepare $cfg >> "$OUT/tts_prepare.txt" 2>&1
      [ $run = prepare ] && [ "$ngpu" -ge 2 ] && wall $MR "$BIN/seistomo" prepare $cfg >> "$OUT/tts_prepare.txt" 2>&1
      continue
    fi
    if [ $run = prepold ]; then
      [ -x "$BIN/seistomo-prev" ] || continue
      CUDA_VISIBLE_DEVICES=0 wall "$BIN/seistomo-prev" prepare $cfg >> "$OUT/tts_prepare.txt" 2>&1
    fi
    if [ $run = np2 ] || [ $run = np2host ] || [ $run = prepnp2 ]; then
      [ "$ngpu" -ge 2 ] || continue
      wall $MR "$BIN/seistomo" -q invert $cfg 2>> "$OUT/tts_$run.txt" >> "$OUT/tts_$run.txt"
    elif [ $run = prevdefaults ] || [ $run = prevprep ]; then
      [ -x "$BIN/seistomo-prev" ] || continue
      CUDA_VISIBLE_DEVICES=0 wall "$BIN/seistomo-prev" -q invert $cfg 2>> "$OUT/tts_$run.txt" >> "$OUT/tts_$run.txt"
    elif [ $run = base ]; then
      CUDA_VISIBLE_DEVICES=0 wall "$BASE" -q invert $cfg 2>> "$OUT/tts_$run.txt" >> "$OUT/tts_$run.txt"
    else
      CUDA_VISIBLE_DEVICES=0 wall "$BIN/seistomo" -q invert $cfg 2>> "$OUT/tts_$run.txt" >> "$OUT/tts_$run.txt"
    fi
    cp /tmp/tts-o-$run/report.json "$OUT/tts_$run.json" 2>/dev/null
    rm -rf /tmp/tts-o-$run
  done
  # The CuPy user's time to solution on the same system (exported as .npy), GPU 0: run twice,
  # the second reported (warm page cache and CuPy's kernel cache, as for a repeat user).
  rm -rf /tmp/tts_npy
  if "$BIN/seistomo" -q export $ds --format npy -o /tmp/tts_npy > /dev/null 2>> "$OUT/log.txt"; then
    for i in 1 2; do
      ( cd /tmp && CUDA_VISIBLE_DEVICES=0 timeout 300 python3 "$PEERS/cupy_tts.py" /tmp/tts_npy 300 \
        > "$OUT/tts_cupy.txt" 2>&1 )
    done
  fi
  rm -rf /tmp/tts_npy
  python3 - "$OUT" >> "$OUT/tts.txt" <<'PY'
import json, sys, os, glob
for f in sorted(glob.glob(sys.argv[1] + "/tts_*.json")):
    r = json.load(open(f)); s = r["seconds"]
    wall = open(f[:-5] + ".txt").read().strip().splitlines()[-1]
    print(f"{os.path.basename(f)}: ranks {r['ranks']} {r.get('lsqr_loop', '?')} loop, storage {r['storage'][:40]} its {r['iterations']} r1 {r['r1norm']:.12e} x {r['xnorm']:.12e} "
          f"start {s.get('start', 0):.2f} load {s['load']:.2f} setup {s['setup']:.2f} solve {s['solve']:.2f} total {s['total']:.2f} write {s.get('write', 0):.2f} elapsed {s.get('elapsed', 0):.2f} ({wall}) "
          f"ms/it {r['ms_per_iter']:.3f} prepared: {r.get('prepared', '-')}\n   phases {r.get('setup_phases')}")
    for x in r.get("rank_timing") or []:
        print(f"   rank {x['rank']}: rows {x.get('rows')} nnz {x.get('nnz')} product {x.get('product_ms', -1):.3f} ms "
              f"allreduce {x.get('allreduce_ms', -1):.3f} ms wait {x.get('wait_s', -1):.3f} s")
PY
  [ -f "$OUT/tts_cupy.txt" ] && { echo "## cupy_tts"; cat "$OUT/tts_cupy.txt"; } >> "$OUT/tts.txt"
  { echo "## prepare"; cat "$OUT/tts_prepare.txt"; } >> "$OUT/tts.txt"
fi

if has batch; then
  ds=/tmp/tts600k
  [ -d $ds ] || "$BIN/seistomo" -q synth -o $ds --grid 128,128,80 --rays 600000 --norm-damping 0.1 \
    --flattening 0.5,0.5,0.5 > /dev/null 2>> "$OUT/log.txt"
  W8="0.1,0.2,0.5,1,2,5,10,20"
  W16="0.05,0.1,0.15,0.2,0.3,0.5,0.7,1,1.5,2,3,5,7,10,15,20"
  for p in f32 f64; do
    runs="single singlecsr b8 b16 sep3 sep3csr"
    # the whole L-curve of 16 weights one solve after another (f32: the batch's wall beside it)
    [ $p = f32 ] && runs="$runs sep16"
    for run in $runs; do
      cfg=/tmp/batch-$p-$run.toml
      extra="precision = \"$p\""
      [[ $run = *csr ]] && extra="$extra\nstorage = \"csr\""
      printf '[dataset]\npath = "%s/dataset.toml"\n[solver]\niter_lim = 300\natol = 0\nbtol = 0\ngcv_probes = 0\n[backend]\n%b\n[output]\ndir = "/tmp/batch-o-%s"\n' \
        $ds "$extra" $run > $cfg
      [[ $run = b* ]] && printf '[tuning]\ngpu_batch = true\n' >> $cfg
      o=/tmp/batch-o-$run; rm -rf $o
      case $run in
        single*) CUDA_VISIBLE_DEVICES=0 "$BIN/seistomo" -q invert $cfg > /dev/null 2>> "$OUT/log.txt"
          python3 -c "import json; r=json.load(open('$o/report.json')); print('$p $run: %d its, %.4f ms/it, setup %.3f s, storage %s, r1norm %.15e' % (r['iterations'], r['ms_per_iter'], r['seconds']['setup'], r['storage'], r['r1norm']))" >> "$OUT/batch.txt" ;;
        b8|b16) w=$W8; [ $run = b16 ] && w=$W16
          CUDA_VISIBLE_DEVICES=0 wall "$BIN/seistomo" lcurve $cfg --damping $w -o $o > "$OUT/batch_${p}_$run.log" 2>&1
          echo "$p $run: $(grep -E '^batch:|s wall$' "$OUT/batch_${p}_$run.log" | tr '\n' ' ')" >> "$OUT/batch.txt"
          cp $o/lcurve.csv "$OUT/batch_${p}_$run.csv" 2>/dev/null ;;
        sep16) CUDA_VISIBLE_DEVICES=0 wall "$BIN/seistomo" lcurve $cfg --damping $W16 --separate -o $o > "$OUT/batch_${p}_$run.log" 2>&1
          echo "$p $run: $(grep -E '^longest solve:|s wall$' "$OUT/batch_${p}_$run.log" | tr '\n' ' ')" >> "$OUT/batch.txt" ;;
        sep3*) CUDA_VISIBLE_DEVICES=0 "$BIN/seistomo" lcurve $cfg --damping 0.1,1,10 --separate -o $o > "$OUT/batch_${p}_$run.log" 2>&1
          echo "$p $run: $(grep -E '^longest solve:' "$OUT/batch_${p}_$run.log")" >> "$OUT/batch.txt"
          cp $o/lcurve.csv "$OUT/batch_${p}_$run.csv" 2>/dev/null ;;
      esac
      rm -rf $o
    done
    # each of the three weights: the batch's point against its own solve, and the spread of two
    # single solves (compact against csr storage: another order of the same sums)
    for pair in "b16 sep3" "sep3csr sep3"; do
      set -- $pair
      echo "  $p: $1 against $2" >> "$OUT/batch.txt"
      python3 - "$OUT/batch_${p}_$1.csv" "$OUT/batch_${p}_$2.csv" >> "$OUT/batch.txt" <<'PY'
import csv, sys
rows = lambda f: {float(r[0]): r for r in csv.reader(open(f)) if r[0][0].isdigit()}
b, s = rows(sys.argv[1]), rows(sys.argv[2])
for w, r in sorted(s.items()):
    q = b[w]
    rel = lambda i: abs(float(q[i]) - float(r[i])) / abs(float(r[i]))
    print(f"    weight {w:g}: its {q[4]} istop {q[5]} against its {r[4]} istop {r[5]}; "
          f"||Gm-d|| rel {rel(1):.2e}, ||Rm|| rel {rel(2):.2e}")
PY
    done
  done
  # the batch's block products timed alone (k = 1, 4, 8, 16) and, beside them, cuSPARSE's SpMM
  # through CuPy on the same system (exported as built)
  if [ -x "$BIN/gpu_batch" ]; then
    SEISTOMO_ROOT=$(pwd) SEISTOMO_BIN="$BIN/seistomo" BATCH_DATASET=$ds/dataset.toml CUDA_VISIBLE_DEVICES=0 \
      "$BIN/gpu_batch" --include-ignored --exact time_block_kernels_on_a_dataset --nocapture 2>&1 \
      | grep -E "nonzeros|k +[0-9]+:" >> "$OUT/batch.txt"
  fi
  rm -rf /tmp/batch-npy
  "$BIN/seistomo" -q export $ds/dataset.toml --format npy -o /tmp/batch-npy 2>> "$OUT/log.txt"
  ( cd /tmp && CUDA_VISIBLE_DEVICES=0 timeout 300 python3 "$PEERS/cupy_spmm.py" /tmp/batch-npy ) \
    > "$OUT/cupy_spmm.txt" 2>&1
  rm -rf /tmp/batch-npy
  # australia (the real 140,792 x 2,921 system, 1.4M nonzeros): the L-curve's 11 weights as
  # one batch against one GPU solve after another (the latency-bound end)
  cfg=/tmp/batch-au.toml
  sed -e "s#\.\./datasets#$(pwd)/datasets#g" -e "s#^\[solver\]#[solver]\ngcv_probes = 0#" \
    configs/australia-model.toml > $cfg
  printf '[backend]\nkind = "cuda"\n' >> $cfg
  cp $cfg /tmp/batch-au-b.toml; printf '[tuning]\ngpu_batch = true\n' >> /tmp/batch-au-b.toml
  for mode in batch separate; do
    flag=""; c=/tmp/batch-au-b.toml; [ $mode = separate ] && flag=--separate && c=$cfg
    rm -rf /tmp/batch-au-$mode
    CUDA_VISIBLE_DEVICES=0 wall "$BIN/seistomo" lcurve $c --log-range 1e-4:1:11 $flag \
      -o /tmp/batch-au-$mode > "$OUT/batch_au_$mode.log" 2>&1
    echo "australia $mode: $(grep -E '^(solved in|batch:|longest solve:)|s wall$' "$OUT/batch_au_$mode.log" | tr '\n' ' ')" >> "$OUT/batch.txt"
  done
  python3 - /tmp/batch-au-batch/lcurve.csv /tmp/batch-au-separate/lcurve.csv >> "$OUT/batch.txt" <<'PY'
import csv, sys
rows = lambda f: [r for r in csv.reader(open(f)) if r[0][0].isdigit()]
b, s = rows(sys.argv[1]), rows(sys.argv[2])
worst = max(max(abs(float(q[i]) - float(r[i])) / abs(float(r[i])) for i in (1, 2)) for q, r in zip(b, s))
its = sum(q[4] == r[4] and q[5] == r[5] for q, r in zip(b, s))
print(f"  australia: {its} of {len(s)} weights with the same iterations and istop; norms within {worst:.2e}")
PY
  # resolution tests on the GPU with the defaults: the 600k dataset's data and 4 tests solved
  # one after another on one operator (set up once), beside one `invert` of the same config
  cfg=/tmp/batch-res.toml; rm -rf /tmp/batch-res-o
  printf '[dataset]\npath = "%s/dataset.toml"\n[solver]\niter_lim = 300\n[output]\ndir = "/tmp/batch-res-o"\n[resolution]\ncheckerboard = [[8, 8, 4], [16, 16, 8]]\nspikes = [[64, 64, 40], [20, 100, 10]]\n' \
    $ds > $cfg
  CUDA_VISIBLE_DEVICES=0 wall "$BIN/seistomo" resolution $cfg > "$OUT/batch_res.log" 2>&1
  CUDA_VISIBLE_DEVICES=0 wall "$BIN/seistomo" -q invert $cfg > "$OUT/batch_res_invert.log" 2>&1
  echo "resolution, data + 4 tests: $(grep -E '^solved|s wall$' "$OUT/batch_res.log" | tr '\n' ' ')" >> "$OUT/batch.txt"
  echo "  invert of the same config: $(grep -E 's wall$' "$OUT/batch_res_invert.log")" >> "$OUT/batch.txt"
  grep -E "correlation" "$OUT/batch_res.log" | sed 's/^/  /' >> "$OUT/batch.txt"
  python3 - /tmp/batch-res-o/resolution/report.json /tmp/batch-res-o/report.json >> "$OUT/batch.txt" <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
print(f"  data member: set-up {a['seconds']['setup']:.3f} s, solve {a['seconds']['solve']:.3f} s, "
      f"r1norm {a['r1norm']:.15e}; invert: set-up {b['seconds']['setup']:.3f} s, "
      f"r1norm {b['r1norm']:.15e} (equal: {a['r1norm'] == b['r1norm']})")
PY
  cp /tmp/batch-res-o/resolution/resolution.csv "$OUT/batch_res.csv" 2>/dev/null
  cat "$OUT/batch.txt" >> "$S"
fi

if has damps; then
  # LSQR's dampings of one system in one bidiagonalisation (issue 33): the 600k-ray dataset's
  # L-curve over 8 and 16 values of LSQR's damping on [G; R] (`lcurve --weight-on damp`,
  # atol = btol = 0: every member runs 300 iterations, no GCV probes), f32 and f64, beside one
  # `invert` of the same system (the defaults: the device loop; and the host loop); three of the
  # dampings one solve after another (`--separate`), their points against the pass's.
  ds=/tmp/tts600k
  [ -d $ds ] || "$BIN/seistomo" -q synth -o $ds --grid 128,128,80 --rays 600000 --norm-damping 0.1 \
    --flattening 0.5,0.5,0.5 > /dev/null 2>> "$OUT/log.txt"
  D8="0.01,0.02,0.05,0.1,0.2,0.5,1,2"
  D16="0.005,0.01,0.015,0.02,0.03,0.05,0.07,0.1,0.15,0.2,0.3,0.5,0.7,1,1.5,2"
  for p in f32 f64; do
    for run in single host d8 d16 d3 sep3; do
      cfg=/tmp/damps-$p-$run.toml; o=/tmp/damps-o-$run; rm -rf $o
      extra="precision = \"$p\""
      [ $run = host ] && extra="$extra\nlsqr_loop = \"host\""
      printf '[dataset]\npath = "%s/dataset.toml"\n[solver]\niter_lim = 300\natol = 0\nbtol = 0\ngcv_probes = 0\n[backend]\n%b\n[output]\ndir = "%s"\n' \
        $ds "$extra" $o > $cfg
      case $run in
        single|host) CUDA_VISIBLE_DEVICES=0 "$BIN/seistomo" -q invert $cfg > /dev/null 2>> "$OUT/log.txt"
          python3 -c "import json; r=json.load(open('$o/report.json')); print('$p $run: %d its, %.4f ms/it, %s loop, setup %.3f s, storage %s, r1norm %.15e' % (r['iterations'], r['ms_per_iter'], r['lsqr_loop'], r['seconds']['setup'], r['storage'], r['r1norm']))" >> "$OUT/damps.txt" ;;
        d8|d16|d3|sep3) w=$D8; [ $run = d16 ] && w=$D16; flag=""
          [[ $run = *3 ]] && w=0.01,0.1,1; [ $run = sep3 ] && flag=--separate
          CUDA_VISIBLE_DEVICES=0 wall "$BIN/seistomo" lcurve $cfg --weight-on damp --damping $w $flag \
            -o $o > "$OUT/damps_${p}_$run.log" 2>&1
          echo "$p $run: $(grep -E '^(one bidiag|longest solve|solved in)|s wall$' "$OUT/damps_${p}_$run.log" | tr '\n' ' ')" >> "$OUT/damps.txt"
          cp $o/lcurve.csv "$OUT/damps_${p}_$run.csv" 2>/dev/null ;;
      esac
      rm -rf $o
    done
    python3 - "$OUT/damps_${p}_d3.csv" "$OUT/damps_${p}_sep3.csv" >> "$OUT/damps.txt" <<'PY'
import csv, sys
rows = lambda f: [r for r in csv.reader(open(f)) if r[0][0].isdigit()]
b, s = rows(sys.argv[1]), rows(sys.argv[2])
for q, r in zip(b, s):
    d = max(abs(float(q[i]) - float(r[i])) / abs(float(r[i])) for i in (1, 2))
    print(f"  damp {q[0]}: one pass {q[4]} its istop {q[5]}, alone {r[4]} its istop {r[5]}; norms within {d:.2e}")
PY
  done
  cat "$OUT/damps.txt" >> "$S"
fi

if has lcurve; then
  # The L-curve with the defaults (GCV's probe on: `[solver] gcv_probes` 1) and without the
  # probe, on the 600k-ray dataset, 300 iterations (atol = btol = 0), f64: 16 weights of R (the
  # GPU's batch) and 16 values of LSQR's damping (one bidiagonalisation); this binary and
  # $BIN/seistomo-prev when it is there, runs alternated; wall, the solves and the traced points.
  ds=/tmp/tts600k
  [ -d $ds ] || "$BIN/seistomo" -q synth -o $ds --grid 128,128,80 --rays 600000 --norm-damping 0.1 \
    --flattening 0.5,0.5,0.5 > /dev/null 2>> "$OUT/log.txt"
  W16="0.05,0.07,0.1,0.15,0.2,0.3,0.5,0.7,1,1.5,2,3,5,7,10,20"
  D16="0.005,0.01,0.015,0.02,0.03,0.05,0.07,0.1,0.15,0.2,0.3,0.5,0.7,1,1.5,2"
  for probes in 1 0; do
    for on in reg damp; do
      for b in seistomo seistomo-prev seistomo seistomo-prev; do
        [ -x "$BIN/$b" ] || continue
        cfg=/tmp/lc-$probes-$on.toml; o=/tmp/lc-o; rm -rf $o
        printf '[dataset]\npath = "%s/dataset.toml"\n[solver]\niter_lim = 300\natol = 0\nbtol = 0\ngcv_probes = %s\n[output]\ndir = "%s"\n' \
          $ds $probes $o > $cfg
        flag=(--damping $W16); [ $on = damp ] && flag=(--weight-on damp --damping $D16)
        log="$OUT/lcurve_${probes}_${on}_$b.log"
        CUDA_VISIBLE_DEVICES=0 wall "$BIN/$b" --trace-phases lcurve $cfg "${flag[@]}" -o $o > "$log" 2>&1
        echo "probes $probes, $on, $b: $(grep -E '^(one bidiag|batch:|solved in|gcv:|corner:)|s wall$' "$log" | tr '\n' ' ')" >> "$OUT/lcurve.txt"
        echo "  points: $(grep -E 'points of [0-9]+ members in' "$log" | awk '{n+=$5; s+=$8} END {print n" members in "s" s"}')" >> "$OUT/lcurve.txt"
        cp $o/lcurve.csv "$OUT/lcurve_${probes}_${on}_$b.csv" 2>/dev/null
        rm -rf $o
      done
      [ -f "$OUT/lcurve_${probes}_${on}_seistomo-prev.csv" ] && python3 - "$OUT/lcurve_${probes}_${on}_seistomo.csv" "$OUT/lcurve_${probes}_${on}_seistomo-prev.csv" >> "$OUT/lcurve.txt" <<'PY'
import csv, sys
rows = lambda f: [r for r in csv.reader(open(f)) if r[0][0].isdigit()]
a, b = rows(sys.argv[1]), rows(sys.argv[2])
d = max(abs(float(q[i]) - float(r[i])) / abs(float(r[i])) for q, r in zip(a, b) for i in (1, 2))
g = [abs(float(q[8]) - float(r[8])) / abs(float(r[8])) for q, r in zip(a, b) if r[8] not in ("NaN", "")]
print(f"  this binary against prev: {len(a)} points, norms within {d:.2e}" + (f", GCV within {max(g):.2e}" if g else "") + f"; corners {[q[0] for q in a if q[6] == '1']} / {[r[0] for r in b if r[6] == '1']}")
PY
    done
  done
  cat "$OUT/lcurve.txt" >> "$S"
fi

if has tts4; then
  # Time to solution on the 4x dataset (2.4M rays, 369M nonzeros), GPU 0: the defaults fresh,
  # then `prepare` and the defaults again reading it (issue 30's second "must show").
  ds=/tmp/tts2400k
  [ -d $ds ] || "$BIN/seistomo" -q synth -o $ds --grid 128,128,80 --rays 2400000 --norm-damping 0.1 \
    --flattening 0.5,0.5,0.5 > /dev/null 2>> "$OUT/log.txt"
  rm -rf $ds/prepared
  ngpu=$(nvidia-smi -L | wc -l)
  # np2*: the same on two GPUs (one rank each, NCCL) when there are two
  for run in fresh prepare prepared np2fresh np2prepare np2prepared; do
    case $run in np2*) [ "$ngpu" -ge 2 ] || continue; nccl_path; L=$MR ;; *) L="env CUDA_VISIBLE_DEVICES=0" ;; esac
    cfg=/tmp/tts4-$run.toml
    printf '[dataset]\npath = "%s/dataset.toml"\n[solver]\niter_lim = 300\n[output]\ndir = "/tmp/tts4-o-%s"\n' \
      $ds $run > $cfg
    if [ ${run#np2} = prepare ]; then
      wall $L "$BIN/seistomo" prepare $cfg >> "$OUT/tts4_prepare.txt" 2>&1
      continue
    fi
    wall $L "$BIN/seistomo" -q invert $cfg > "$OUT/tts4_$run.txt" 2>&1
    cp /tmp/tts4-o-$run/report.json "$OUT/tts4_$run.json" 2>/dev/null
    rm -rf /tmp/tts4-o-$run
  done
  rm -rf $ds/prepared
fi

if has timeline; then
  # Where the wall time goes: a defaults `invert` (prepared storage) with every output line
  # stamped (timeline.py) and report.json's seconds (start, load, setup, solve, write), the
  # second of two runs, by this binary and by $BIN/seistomo-prev when it is there (a same-call
  # comparison of one change).
  [ -d /tmp/tts600k ] || "$BIN/seistomo" -q synth -o /tmp/tts600k --grid 128,128,80 --rays 600000 \
    --norm-damping 0.1 --flattening 0.5,0.5,0.5 > /dev/null 2>> "$OUT/log.txt"
  cfg=/tmp/tl.toml; dir=/tmp/tl-o
  printf '[dataset]\npath = "/tmp/tts600k/dataset.toml"\n[solver]\niter_lim = 300\n[output]\ndir = "%s"\n' $dir > $cfg
  # each binary reads the prepared storage it wrote itself
  for b in seistomo seistomo seistomo-prev seistomo-prev; do
    [ -x "$BIN/$b" ] || continue
    [ "$(cat /tmp/tl-prepared-by 2>/dev/null)" = $b ] || {
      CUDA_VISIBLE_DEVICES=0 "$BIN/$b" -q prepare $cfg > /dev/null 2>&1; echo $b > /tmp/tl-prepared-by; }
    rm -rf $dir
    CUDA_VISIBLE_DEVICES=0 python3 bench/timeline.py "$BIN/$b" --trace-phases invert $cfg \
      > "$OUT/timeline_$b.txt" 2>&1
    cp $dir/report.json "$OUT/timeline_$b.json" 2>/dev/null
  done
  rm -rf $dir
fi

if has auto; then
  [ -d /tmp/tts600k ] || "$BIN/seistomo" -q synth -o /tmp/tts600k --grid 128,128,80 --rays 600000 \
    --norm-damping 0.1 --flattening 0.5,0.5,0.5 > /dev/null 2>> "$OUT/log.txt"
  [ -d /tmp/med150k ] || "$BIN/seistomo" -q synth -o /tmp/med150k --grid 64,64,40 --rays 150000 \
    --norm-damping 0.1 --flattening 0.5,0.5,0.5 > /dev/null 2>> "$OUT/log.txt"
  for sys in well1850 illc1850 australia demo med150k tts600k; do
    for st in auto csr compact; do
      r=/tmp/auto-$sys-$st.json
      case $sys in
        australia) "$BIN/seistomo" -q solve $AU --atol 1e-8 --btol 1e-8 --storage $st --backend cuda --report $r 2>> "$OUT/log.txt" ;;
        well1850|illc1850) "$BIN/seistomo" -q solve --matrix datasets/lsq/$sys.mtx.gz --rhs datasets/lsq/${sys}_rhs1.mtx.gz \
            --atol 1e-10 --btol 1e-10 --iter-lim 3000 --storage $st --backend cuda --report $r 2>> "$OUT/log.txt" ;;
        *) d=/tmp/$sys; [ $sys = demo ] && d=datasets/demo
           printf '[dataset]\npath = "%s/dataset.toml"\n[solver]\niter_lim = 300\n[backend]\nkind = "cuda"\nstorage = "%s"\n[output]\ndir = "/tmp/auto-o-%s-%s"\nmodel = ""\n' \
             "$(readlink -f $d)" $st $sys $st > /tmp/auto.toml
           "$BIN/seistomo" -q invert /tmp/auto.toml 2>> "$OUT/log.txt"; cp /tmp/auto-o-$sys-$st/report.json $r 2>/dev/null ;;
      esac
    done
    python3 - $sys >> "$OUT/auto.txt" <<'PY'
import json, sys
s = sys.argv[1]; ms = {}
for st in ("auto", "csr", "compact"):
    try: r = json.load(open(f"/tmp/auto-{s}-{st}.json")); ms[st] = (r["ms_per_iter"], r["storage"], r["nnz"], r["iterations"])
    except Exception as e: ms[st] = (float("nan"), str(e), 0, 0)
best = min(ms["csr"][0], ms["compact"][0])
a = ms["auto"]
print(f"{s}: nnz {a[2]} its {a[3]}; auto {a[0]:.4f} ms/it ({a[1][:60]}...); csr {ms['csr'][0]:.4f}; compact {ms['compact'][0]:.4f}; auto / fastest {a[0] / best:.3f}")
PY
  done
fi

if has same; then
  for b in "$BIN/seistomo" "${BASE:?BASE=another seistomo binary}"; do
    d=/tmp/same_$(basename "$b"); rm -rf $d
    timeout 300 bash bench/outputs.sh "$b" $d cuda
  done
  python3 bench/compare_outputs.py /tmp/same_$(basename "$BASE") /tmp/same_seistomo > "$OUT/same.txt" 2>&1
  grep -B1 "rc [^0]" /tmp/same_seistomo/log.txt >> "$OUT/same.txt"
fi

if has speed; then
  for b in "$BIN/seistomo" "${BASE:?BASE=another seistomo binary}"; do
    for st in compact csr; do
      p=f64,f32; [ $st = csr ] && p=f64
      echo "## $(basename "$b") $st" >> "$OUT/speed.txt"
      timeout 200 "$b" bench --size large --reorder auto --iters 200 --storage $st --precision $p \
        --transpose csc --loops device 2>> "$OUT/log.txt" | tail -3 >> "$OUT/speed.txt"
    done
  done
fi

# One summary: tests, tables, peers.
cat "$S"
for f in "$OUT"/bench_australia.txt "$OUT"/bench_large.txt "$OUT"/layouts.txt "$OUT"/orders.txt; do
  [ -f "$f" ] && { echo "## $(basename "$f")"; grep -v '^$' "$f"; }
done
for f in "$OUT"/cupy_*.txt; do [ -f "$f" ] && { echo "## $(basename "$f")"; grep -E "ms|GBps" "$f" | head -12; }; done
[ -f "$OUT/cupy_gmres.json" ] && { echo "## cupy_gmres"; cat "$OUT/cupy_gmres.json"; }
gmres_table "$OUT"/gm_*.json "$OUT"/g1_*.json "$OUT"/g2_*.json "$OUT"/gw*_*.json
[ -f "$OUT/gmres_xdiff.txt" ] && cat "$OUT/gmres_xdiff.txt"
lsqr_table "$OUT"/lsqr_x*.json
for f in "$OUT"/tts.txt "$OUT"/auto.txt "$OUT"/same.txt "$OUT"/speed.txt; do [ -f "$f" ] && { echo "## $(basename "$f")"; cat "$f"; }; done
grep -E "escape|layout" "$OUT/log.txt" 2>/dev/null | sort | uniq | head -8
