// Sparse products on compact storage (src/sparse/compact.rs) and on grid stencils
// (src/grid/stencil.rs), with LSQR's vector work fused into their epilogues.
//
// Every product here computes y = a * (A x) + b * y (b == 0: y is not read) and, when `partial`
// is not null, writes per block the sum of the new y^2 (deterministic: fixed row-to-block
// assignment, fixed reduction trees), which lsqr.cu's scalar kernels add up in block order.
// (a, b) come by value, or from device memory at `coef` when it is not null (the scalars of a
// device-resident LSQR loop); a kernel does nothing when `skip` is not null and *skip != 0.
//
// Compact rows: entry k of row r has column base[r] + delta[ptr[r]] + ... + delta[k] (16-bit
// deltas; escapes are zero-valued fillers). A sub-warp of S lanes owns a row: each lane loads a
// delta and a value per chunk of S entries, one shuffle scan turns deltas into columns, the last
// lane's column carries into the next chunk. UNROLL chunks are loaded before the scans and the
// gathers, so a row costs few memory latencies.
//
// Needs spmv.cu (warp_sum, the warp-segment helpers) before it in the same program.

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;

#define FULL_MASK 0xffffffffu
#define CWARPS 8                 // warps per block of the compact kernels
#ifndef CUNROLL
#define CUNROLL 4                // chunks of S entries in flight per sub-warp
#endif
#ifndef CMINB
// blocks per SM the compact kernels are compiled for (6 allowed 40 registers: A x 3.6 % slower
// on an H100 than with 5, 48 registers, docs/gpu.md)
#define CMINB 5
#endif
#define STENCIL_MAX_BLOCKS 7
#define STENCIL_ROWS_PER_THREAD 4

// A block of stencil rows (layout shared with src/backend/cuda/compact.rs StencilBlockArg).
struct StencilBlock {
    double w;       // weight
    u64 row0;       // first row of the block
    u32 lo[3];      // first cell coordinate of the box the rows enumerate
    u32 dims[3];    // extent of that box
    int kind;       // 0 norm, 1 first difference, 2 second difference
    int axis;       // 0 x, 1 y, 2 z
};
struct StencilArgs {
    StencilBlock b[STENCIL_MAX_BLOCKS];
    const u32* new_of_old;  // cell c -> position in x (null: identity)
    const u32* old_of_new;  // position in x -> cell c (null: identity)
    u32 n[3];
    int nblocks;
};

__device__ __forceinline__ u64 cell_stride(const StencilArgs& st, int axis) {
    return axis == 0 ? 1ull : (axis == 1 ? (u64)st.n[0] : (u64)st.n[0] * st.n[1]);
}

// Row of block b at cell coordinates (i, j, k), or -1 when the block has none there.
__device__ __forceinline__ long long stencil_block_row(const StencilBlock& b, long long i,
                                                       long long j, long long k) {
    const long long x = i - b.lo[0], y = j - b.lo[1], z = k - b.lo[2];
    if (x < 0 || y < 0 || z < 0 || x >= b.dims[0] || y >= b.dims[1] || z >= b.dims[2]) return -1;
    return (long long)b.row0 + x + (long long)b.dims[0] * (y + (long long)b.dims[1] * z);
}

// Continue the transposed row sum s of the cell at position jn of x with the stencil rows (in
// increasing row order, as src/grid/stencil.rs add_transposed).
__device__ double stencil_t_add(const StencilArgs& st, double s, u32 jn,
                                const double* __restrict__ yd) {
    // cells are 32-bit numbers: 32-bit divisions
    const u32 c32 = st.old_of_new ? st.old_of_new[jn] : jn;
    const u64 c = c32;
    const u32 q = c32 / st.n[0];
    const long long i = (long long)(c32 - q * st.n[0]);
    const u32 q2 = q / st.n[1];
    const long long j = (long long)(q - q2 * st.n[1]);
    const long long k = (long long)q2;
    for (int bi = 0; bi < st.nblocks; ++bi) {
        const StencilBlock& b = st.b[bi];
        const double w = b.w;
        if (b.kind == 0) {
            s += w * yd[b.row0 + c];
            continue;
        }
        const long long di = b.axis == 0, dj = b.axis == 1, dk = b.axis == 2;
        const long long rm = stencil_block_row(b, i - di, j - dj, k - dk);
        const long long r0 = stencil_block_row(b, i, j, k);
        if (b.kind == 1) {
            if (rm >= 0) s += w * yd[rm];
            if (r0 >= 0) s += -w * yd[r0];
        } else {
            const long long rp = stencil_block_row(b, i + di, j + dj, k + dk);
            if (rm >= 0) s += w * yd[rm];
            if (r0 >= 0) s += -2.0 * w * yd[r0];
            if (rp >= 0) s += w * yd[rp];
        }
    }
    return s;
}

// Block sum of v written to partial[blockIdx.x] (fixed tree: deterministic).
__device__ __forceinline__ void block_partial(double v, double* partial) {
    __shared__ double sh[32];
    v = warp_sum(v);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int i = 0; i < (int)(blockDim.x >> 5); ++i) t += sh[i];
        partial[blockIdx.x] = t;
    }
}

// The fused products' prologue: false (the kernel does nothing) while *skip != 0; (a, b) from
// `coef` when it is not null.
__device__ __forceinline__ bool fused_begin(const int* __restrict__ skip,
                                            const double* __restrict__ coef, double* a, double* b) {
    if (skip && *skip) return false;
    if (coef) {
        *a = coef[0];
        *b = coef[1];
    }
    return true;
}

// The fused epilogue of one output: *y = a * s + b * *y (b == 0: *y is not read); the new
// value's square is added to *acc.
__device__ __forceinline__ void fused_store(double s, double a, double b, double* y, double* acc) {
    const double out = (b == 0.0) ? a * s : a * s + b * *y;
    *y = out;
    *acc += out * out;
}

// Sum over the S lanes of a sub-warp by a shuffle tree (valid in its first lane).
template <int S>
__device__ __forceinline__ double subwarp_sum(double sum) {
#pragma unroll
    for (int o = S / 2; o > 0; o >>= 1) sum += __shfl_down_sync(FULL_MASK, sum, o, S);
    return sum;
}

// Rows of a compact matrix, S lanes per row; a block owns CWARPS * (32 / S) * rows_per_sub
// consecutive rows (row = block start + t * subs_per_block + sub-warp id). STT: add the stencil
// rows' transposed terms (rows are then cells, in the order of x).
template <int S, typename V, bool STT>
__device__ __forceinline__ void compact_impl(u32 nrows, u32 rows_per_sub,
                                             const u64* __restrict__ ptr,
                                             const u32* __restrict__ base,
                                             const u16* __restrict__ delta,
                                             const V* __restrict__ val,
                                             const double* __restrict__ x, double* __restrict__ y,
                                             double a, double b, const double* __restrict__ coef,
                                             const int* __restrict__ skip,
                                             double* __restrict__ partial,
                                             const StencilArgs& st,
                                             const double* __restrict__ yd) {
    if (!fused_begin(skip, coef, &a, &b)) return;
    constexpr int G = 32 / S;
    const int lane = threadIdx.x & 31;
    const int sl = lane & (S - 1);
    const u32 sub_id = (threadIdx.x >> 5) * G + lane / S;
    const u32 subs = CWARPS * G;
    double acc = 0.0;
    for (u32 t = 0; t < rows_per_sub; ++t) {
        const u64 row64 = ((u64)blockIdx.x * rows_per_sub + t) * subs + sub_id;
        const bool valid = row64 < nrows;
        const u32 row = valid ? (u32)row64 : 0u;
        const u64 k0 = valid ? ptr[row] : 0ull;
        // Row length in entries (< 2^32: checked on the host); the row's arrays from k0.
        const u32 len = valid ? (u32)(ptr[row + 1] - k0) : 0u;
        const u16* __restrict__ dr = delta + k0;
        const V* __restrict__ vr = val + k0;
        u32 col = valid ? base[row] : 0u;
        // Trip count uniform over the warp (every lane takes part in every shuffle).
        u32 trips = (len + (u32)(S * CUNROLL) - 1) / (u32)(S * CUNROLL);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) trips = max(trips, __shfl_xor_sync(FULL_MASK, trips, o));
        double sum = 0.0;
        for (u32 kb = sl; trips > 0; --trips, kb += (u32)(S * CUNROLL)) {
            u32 c[CUNROLL];
            V v[CUNROLL];
#pragma unroll
            for (int q = 0; q < CUNROLL; ++q) {
                const u32 k = kb + (u32)(q * S);
                const bool in = k < len;
                c[q] = in ? (u32)__ldg(&dr[k]) : 0u;
                v[q] = in ? __ldg(&vr[k]) : (V)0;
            }
#pragma unroll
            for (int q = 0; q < CUNROLL; ++q) {
                u32 t = c[q];
#pragma unroll
                for (int o = 1; o < S; o <<= 1) {
                    const u32 up = __shfl_up_sync(FULL_MASK, t, o, S);
                    if (sl >= o) t += up;
                }
                c[q] = col + t;
                col = __shfl_sync(FULL_MASK, c[q], S - 1, S);
            }
#pragma unroll
            for (int q = 0; q < CUNROLL; ++q)
                if (kb + (u32)(q * S) < len) sum += (double)v[q] * __ldg(&x[c[q]]);
        }
        sum = subwarp_sum<S>(sum);
        if (valid && sl == 0) {
            if (STT) sum = stencil_t_add(st, sum, row, yd);
            fused_store(sum, a, b, &y[row], &acc);
        }
    }
    if (partial) block_partial(acc, partial);
}

#define COMPACT_KERNEL(NAME, S, V, STT)                                                        \
    extern "C" __global__ void __launch_bounds__(CWARPS * 32, CMINB)                               \
        NAME(u32 nrows, u32 rows_per_sub, const u64* ptr, const u32* base, const u16* delta,   \
             const V* val, const double* x, double* y, double a, double b, const double* coef, \
             const int* skip, double* partial, StencilArgs st, const double* yd) {            \
        compact_impl<S, V, STT>(nrows, rows_per_sub, ptr, base, delta, val, x, y, a, b, coef, \
                                skip, partial, st, yd);                                        \
    }

COMPACT_KERNEL(compact_s32_f64, 32, double, false)
COMPACT_KERNEL(compact_s16_f64, 16, double, false)
COMPACT_KERNEL(compact_s8_f64, 8, double, false)
COMPACT_KERNEL(compact_s4_f64, 4, double, false)
COMPACT_KERNEL(compact_s32_f32, 32, float, false)
COMPACT_KERNEL(compact_s16_f32, 16, float, false)
COMPACT_KERNEL(compact_s8_f32, 8, float, false)
COMPACT_KERNEL(compact_s4_f32, 4, float, false)
COMPACT_KERNEL(compact_st_s32_f64, 32, double, true)
COMPACT_KERNEL(compact_st_s16_f64, 16, double, true)
COMPACT_KERNEL(compact_st_s8_f64, 8, double, true)
COMPACT_KERNEL(compact_st_s4_f64, 4, double, true)
COMPACT_KERNEL(compact_st_s32_f32, 32, float, true)
COMPACT_KERNEL(compact_st_s16_f32, 16, float, true)
COMPACT_KERNEL(compact_st_s8_f32, 8, float, true)
COMPACT_KERNEL(compact_st_s4_f32, 4, float, true)

// y[r] = a * (D x)[r] + b * y[r] for the stencil rows r (canonical order); each thread takes
// STENCIL_ROWS_PER_THREAD rows strided by the block size. Sums in increasing position in x, as
// a CSR row of the renumbered columns (src/grid/stencil.rs row_sum).
extern "C" __global__ void __launch_bounds__(256)
stencil_av(StencilArgs st, u64 nrows, const double* __restrict__ x, double* __restrict__ y,
           double a, double b, const double* __restrict__ coef, const int* __restrict__ skip,
           double* __restrict__ partial) {
    if (!fused_begin(skip, coef, &a, &b)) return;
    double acc = 0.0;
    for (int t = 0; t < STENCIL_ROWS_PER_THREAD; ++t) {
        const u64 r = ((u64)blockIdx.x * STENCIL_ROWS_PER_THREAD + t) * blockDim.x + threadIdx.x;
        if (r >= nrows) break;
        int bi = 0;
        while (bi + 1 < st.nblocks && r >= st.b[bi + 1].row0) ++bi;
        const StencilBlock& blk = st.b[bi];
        // A block enumerates at most the grid's cells (< 2^32): 32-bit divisions (a 64-bit one
        // is a long software routine; with three per row the kernel was bound by them).
        const u32 rl = (u32)(r - blk.row0);
        const u32 q = rl / blk.dims[0];
        const u64 i = rl - q * blk.dims[0] + blk.lo[0];
        const u32 q2 = q / blk.dims[1];
        const u64 j = q - q2 * blk.dims[1] + blk.lo[1];
        const u64 k = q2 + blk.lo[2];
        const u64 c = i + (u64)st.n[0] * (j + (u64)st.n[1] * k);
        u64 col[3];
        double v[3];
        int ne;
        if (blk.kind == 0) {
            col[0] = c;
            v[0] = blk.w;
            ne = 1;
        } else if (blk.kind == 1) {
            const u64 s = cell_stride(st, blk.axis);
            col[0] = c;
            v[0] = -blk.w;
            col[1] = c + s;
            v[1] = blk.w;
            ne = 2;
        } else {
            const u64 s = cell_stride(st, blk.axis);
            col[0] = c - s;
            v[0] = blk.w;
            col[1] = c;
            v[1] = -2.0 * blk.w;
            col[2] = c + s;
            v[2] = blk.w;
            ne = 3;
        }
        if (st.new_of_old)
            for (int e = 0; e < ne; ++e) col[e] = st.new_of_old[col[e]];
        // sort by position (at most three entries)
        if (ne >= 2 && col[1] < col[0]) {
            u64 tc = col[0]; col[0] = col[1]; col[1] = tc;
            double tv = v[0]; v[0] = v[1]; v[1] = tv;
        }
        if (ne == 3) {
            if (col[2] < col[1]) {
                u64 tc = col[1]; col[1] = col[2]; col[2] = tc;
                double tv = v[1]; v[1] = v[2]; v[2] = tv;
            }
            if (col[1] < col[0]) {
                u64 tc = col[0]; col[0] = col[1]; col[1] = tc;
                double tv = v[0]; v[0] = v[1]; v[1] = tv;
            }
        }
        double s = 0.0;
        for (int e = 0; e < ne; ++e) s += v[e] * x[col[e]];
        fused_store(s, a, b, &y[r], &acc);
    }
    if (partial) block_partial(acc, partial);
}

// CSR rows in warp segments (as spmv_impl of spmv.cu) with the same fused epilogue: each warp
// takes `segs_per_warp` consecutive segments, a block 8 warps' worth.
template <typename V>
__device__ __forceinline__ void csr_fused_impl(
    u32 nseg, u32 segs_per_warp, const u32* __restrict__ seg, const u64* __restrict__ ip,
    const u32* __restrict__ ci, const V* __restrict__ val, const double* __restrict__ x,
    double* __restrict__ y, double a, double b, const double* __restrict__ coef,
    const int* __restrict__ skip, double* __restrict__ partial) {
    __shared__ double prod[8][256];
    if (!fused_begin(skip, coef, &a, &b)) return;
    const int lane = threadIdx.x & 31;
    const int wib = threadIdx.x >> 5;
    double acc = 0.0;
    for (u32 t = 0; t < segs_per_warp; ++t) {
        const u64 s64 = ((u64)blockIdx.x * segs_per_warp + t) * 8 + wib;
        if (s64 >= nseg) break;
        const WarpSeg g = seg_bounds((u32)s64, seg, ip);
        if (g.r1 - g.r0 == 1) {
            const double sum = warp_row_sum(g.b, g.e, lane, ci, val, x);
            if (lane == 0) fused_store(sum, a, b, &y[g.r0], &acc);
        } else {
            u32 r;
            double sum;
            if (lane_row_sum(g, lane, prod[wib], ip, ci, val, x, &r, &sum))
                fused_store(sum, a, b, &y[r], &acc);
            __syncwarp();
        }
    }
    if (partial) block_partial(acc, partial);
}

extern "C" __global__ void __launch_bounds__(256)
csr_fused_f64(u32 nseg, u32 segs_per_warp, const u32* seg, const u64* ip, const u32* ci,
              const double* val, const double* x, double* y, double a, double b,
              const double* coef, const int* skip, double* partial) {
    csr_fused_impl<double>(nseg, segs_per_warp, seg, ip, ci, val, x, y, a, b, coef, skip, partial);
}
extern "C" __global__ void __launch_bounds__(256)
csr_fused_f32(u32 nseg, u32 segs_per_warp, const u32* seg, const u64* ip, const u32* ci,
              const float* val, const double* x, double* y, double a, double b,
              const double* coef, const int* skip, double* partial) {
    csr_fused_impl<float>(nseg, segs_per_warp, seg, ip, ci, val, x, y, a, b, coef, skip, partial);
}
