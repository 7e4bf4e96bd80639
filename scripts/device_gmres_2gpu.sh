#!/bin/bash
# GMRES on 1 and 2 GPUs (one MPI rank per GPU, nvidia-h200-x2): the halo exchange through the
# host (page-locked copies + MPI all-to-all) and GPU to GPU (NCCL send/recv), contiguous and METIS
# partitions; solutions compared with the one-GPU run. Needs .device/seistomo.
set -u
cd "$(dirname "$0")/.."
D=.device
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
nccl=/usr/lib/x86_64-linux-gnu/libnccl.so.2; [ -f $nccl ] || nccl=$(find / -name 'libnccl.so*' 2>/dev/null | head -1)
[ -n "$nccl" ] && export LD_LIBRARY_PATH=$(dirname "$nccl"):${LD_LIBRARY_PATH:-}
S=$OUT/summary.txt
{ nvidia-smi --query-gpu=name,memory.total --format=csv; date -u; } > $S
M=/tmp/cd128.mtx
$D/seistomo square --kind convdiff --n 128 -o $M 2>> $S
G="solve --method gmres --matrix $M --restart 16 --rtol 1e-10 --backend cuda"
MR="mpirun --allow-run-as-root --bind-to none -np 2 -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH"
for pc in jacobi "block-ilu0 --ilu-sweeps 3"; do
  tag=$(echo $pc | cut -c1-6)
  timeout 60 $D/seistomo $G --precond $pc --orthog cgs --solution /tmp/x1_$tag.txt --report $OUT/g1_$tag.json 2>> $S
  for ar in host nccl; do for part in nnz metis; do
    timeout 90 $MR $D/seistomo $G --precond $pc --orthog cgs --allreduce $ar --partition $part \
      --solution /tmp/x2_${tag}_${ar}_$part.txt --report $OUT/g2_${tag}_${ar}_$part.json 2>> $S
  done; done
done
python3 - "$OUT" <<'PY' >> $S
import json, sys, glob, os
import numpy as np
for tag in ("jacobi", "block-"):
    x1 = np.loadtxt(f"/tmp/x1_{tag}.txt")
    r = json.load(open(os.path.join(sys.argv[1], f"g1_{tag}.json")))
    print(f"1 GPU {r['precond']}: its={r['iterations']} relres={r['relres']:.3e} ms/it={r['ms_per_iter']:.4f}")
    for f in sorted(glob.glob(os.path.join(sys.argv[1], f"g2_{tag}_*.json"))):
        r = json.load(open(f)); name = os.path.basename(f)[3:-5]
        x2 = np.loadtxt(f"/tmp/x2_{name}.txt")
        d = np.linalg.norm(x2 - x1) / np.linalg.norm(x1)
        print(f"2 GPUs {name}: its={r['iterations']} relres={r['relres']:.3e} ms/it={r['ms_per_iter']:.4f} "
              f"halo={r.get('halo')} rel diff vs 1 GPU {d:.2e}")
PY
cat $S
