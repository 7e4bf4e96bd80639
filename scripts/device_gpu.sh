#!/bin/bash
# Copy onto the GPU machine as .device/ with: seistomo, gpu-test (tests/gpu.rs binary),
# unit-test (lib test binary), cupy_lsqr.py, datasets/{australia,lsq}; run as bash .device/run.sh.
cd "$(dirname "$0")/.."
D=.device
export SEISTOMO_ROOT=$D PYTHONUNBUFFERED=1
A="--matrix $D/datasets/australia/G.mtx.gz --rhs $D/datasets/australia/d.txt --reg $D/datasets/australia/R.mtx.gz --reg-weight 0.015"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; date -u; } > $OUT/bench.txt
timeout 240 $D/gpu-test --test-threads=1 --nocapture > $OUT/tests.txt 2>&1; echo "gpu tests rc=$?" | tee -a $OUT/tests.txt
grep -E "test result|panicked|MISMATCH|vs GPU-order|australia|well1850|orders:" $OUT/tests.txt | head -60; $D/unit-test cuda 2>&1 | grep "test result"; $D/seistomo solve $A --atol 1e-8 --btol 1e-8 2>&1 | tail -1; $D/seistomo solve $A --atol 1e-8 --btol 1e-8 --backend cuda --precision f32 --transpose scatter 2>&1 | tail -1
grep -E "A\^T y 2000x700|A x 2000x700" $OUT/tests.txt | head -12
$D/seistomo bench $A --iters 300 >> $OUT/bench.txt 2>> $OUT/bench.err
$D/seistomo bench $A --export-npy /tmp/npyA 2>>$OUT/bench.err
timeout 100 python3 $D/cupy_lsqr.py npy /tmp/npyA 300 > $OUT/cupy_australia.txt 2>&1
$D/seistomo bench --size large --export-npy /tmp/npy 2>>$OUT/bench.err
timeout 200 python3 $D/cupy_lsqr.py npy /tmp/npy 100 > $OUT/cupy_large.txt 2>&1
$D/seistomo bench --size large --iters 100 >> $OUT/bench.txt 2>> $OUT/bench.err
cat $OUT/cupy_australia.txt $OUT/cupy_large.txt $OUT/bench.txt
