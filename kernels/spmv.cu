// Sparse products for seistomo's CUDA backend (compiled at run time by NVRTC).
//
// A CSR matrix is cut on the host into "segments" of rows (see src/backend/cuda/operator.rs):
// a long row (more than LONG_ROW nonzeros) is a segment of its own and gets a whole warp
// ("vector" mode); runs of up to SEG_ROWS short rows with at most SEG_NNZ nonzeros together
// share one warp ("stream" mode: the warp reads the segment's nonzeros coalesced, stores the
// products in shared memory, then each lane sums one row). One warp per segment balances
// kernel rows of thousands of nonzeros against damping rows of 1-4. Row offsets are 64-bit;
// values are V = double or float, always accumulated in double. Every sum is taken in a fixed
// order: results are bitwise reproducible.

typedef unsigned long long u64;
typedef unsigned int u32;

#define WARP 32
#define WARPS_PER_BLOCK 8
#define SEG_NNZ 256
#define UNROLL 4
#define FULL_MASK 0xffffffffu

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(FULL_MASK, v, o);
    return v;
}

// The rows r0..r1 and nonzeros b..e of warp segment s (as cut in src/backend/cuda/operator.rs).
struct WarpSeg {
    u32 r0, r1;
    u64 b, e;
};
__device__ __forceinline__ WarpSeg seg_bounds(u32 s, const u32* __restrict__ seg,
                                              const u64* __restrict__ ip) {
    WarpSeg g;
    g.r0 = seg[s];
    g.r1 = seg[s + 1];
    g.b = ip[g.r0];
    g.e = ip[g.r1];
    return g;
}

// One segment per warp of WARPS_PER_BLOCK: this thread's lane, its warp in the block and the
// warp's segment; false for a warp past the last segment.
__device__ __forceinline__ bool warp_seg(u32 nseg, const u32* __restrict__ seg,
                                         const u64* __restrict__ ip, int* lane, int* wib,
                                         WarpSeg* g) {
    *lane = threadIdx.x & (WARP - 1);
    *wib = threadIdx.x / WARP;
    const u32 s = blockIdx.x * WARPS_PER_BLOCK + *wib;
    if (s >= nseg) return false;
    *g = seg_bounds(s, seg, ip);
    return true;
}

// "Vector" mode: the sum of row nonzeros b..e times x by a whole warp, in batches of UNROLL
// nonzeros per lane (all index/value loads of a batch are issued before the gathers, so a row of
// ~150 nonzeros costs about two memory latencies), then a shuffle tree; valid in lane 0.
template <typename V>
__device__ __forceinline__ double warp_row_sum(u64 b, u64 e, int lane, const u32* __restrict__ ci,
                                               const V* __restrict__ val,
                                               const double* __restrict__ x) {
    double sum = 0.0;
    for (u64 k0 = b + lane; k0 < e; k0 += UNROLL * WARP) {
        u32 c[UNROLL];
        double v[UNROLL];
#pragma unroll
        for (int j = 0; j < UNROLL; ++j) {
            const u64 k = k0 + (u64)j * WARP;
            c[j] = k < e ? __ldg(&ci[k]) : 0u;
            v[j] = k < e ? (double)__ldg(&val[k]) : 0.0;
        }
#pragma unroll
        for (int j = 0; j < UNROLL; ++j)
            if (k0 + (u64)j * WARP < e) sum += v[j] * __ldg(&x[c[j]]);
    }
    return warp_sum(sum);
}

// "Stream" mode: the warp stores the products of nonzeros b..e (at most SEG_NNZ) coalesced in
// its shared row `prod`; then the lane of row r = r0 + lane (< r1) sums its own products in
// order. Returns whether this lane has a row (its row in *r, its sum in *sum).
template <typename V>
__device__ __forceinline__ bool lane_row_sum(const WarpSeg& g, int lane, double* prod,
                                             const u64* __restrict__ ip,
                                             const u32* __restrict__ ci,
                                             const V* __restrict__ val,
                                             const double* __restrict__ x, u32* r, double* sum) {
    const u32 cnt = (u32)(g.e - g.b);
    for (u32 k = lane; k < cnt; k += WARP) prod[k] = (double)val[g.b + k] * __ldg(&x[ci[g.b + k]]);
    __syncwarp();
    *r = g.r0 + lane;
    if (*r >= g.r1) return false;
    const u32 ks = (u32)(ip[*r] - g.b), ke = (u32)(ip[*r + 1] - g.b);
    double s = 0.0;
    for (u32 k = ks; k < ke; ++k) s += prod[k];
    *sum = s;
    return true;
}

// y[r] = alpha sum + beta y[r] (beta == 0: y is not read), then times d[r] when d is not null
// (a diagonal preconditioner applied to the product's rows: d[r] * t, the same product as
// vector.cu's pmul of the unscaled result).
__device__ __forceinline__ void spmv_store(double* __restrict__ y, u32 r, double sum, double alpha,
                                           double beta, const double* __restrict__ d) {
    double out = (beta == 0.0) ? alpha * sum : alpha * sum + beta * y[r];
    if (d) out = d[r] * out;
    y[r] = out;
}

// y = d .* (alpha A x + beta y) (beta == 0: y is not read; d null: no scaling).
template <typename V>
__device__ __forceinline__ void spmv_impl(u32 nseg, const u32* __restrict__ seg,
                                          const u64* __restrict__ ip, const u32* __restrict__ ci,
                                          const V* __restrict__ val, const double* __restrict__ x,
                                          double* __restrict__ y, double alpha, double beta,
                                          const double* __restrict__ d) {
    __shared__ double prod[WARPS_PER_BLOCK][SEG_NNZ];
    int lane, wib;
    WarpSeg g;
    if (!warp_seg(nseg, seg, ip, &lane, &wib, &g)) return;
    if (g.r1 - g.r0 == 1) {
        const double sum = warp_row_sum(g.b, g.e, lane, ci, val, x);
        if (lane == 0) spmv_store(y, g.r0, sum, alpha, beta, d);
    } else {
        u32 r;
        double sum;
        if (lane_row_sum(g, lane, prod[wib], ip, ci, val, x, &r, &sum))
            spmv_store(y, r, sum, alpha, beta, d);
    }
}

// x[col] += alpha * A[row, col] * y[row] with f64 atomics (the paper's GPU-IV): A^T y straight
// from the CSR rows, no second copy. x must be scaled by beta beforehand.
template <typename V>
__device__ __forceinline__ void scatter_impl(u32 nseg, const u32* __restrict__ seg,
                                             const u64* __restrict__ ip,
                                             const u32* __restrict__ ci,
                                             const V* __restrict__ val,
                                             const double* __restrict__ y, double* x,
                                             double alpha) {
    __shared__ u32 offs[WARPS_PER_BLOCK][WARP + 1];
    int lane, wib;
    WarpSeg g;
    if (!warp_seg(nseg, seg, ip, &lane, &wib, &g)) return;
    const u32 r0 = g.r0, r1 = g.r1;
    const u64 b = g.b, e = g.e;
    if (r1 - r0 == 1) {
        const double yr = alpha * y[r0];
        if (yr == 0.0) return;
#pragma unroll 4
        for (u64 k = b + lane; k < e; k += WARP) atomicAdd(&x[ci[k]], (double)val[k] * yr);
    } else {
        const u32 nr = r1 - r0;
        if ((u32)lane < nr) offs[wib][lane] = (u32)(ip[r0 + lane] - b);
        if (lane == 0) offs[wib][nr] = (u32)(e - b);
        __syncwarp();
        const u32 cnt = (u32)(e - b);
        for (u32 k = lane; k < cnt; k += WARP) {
            // last row i with offs[i] <= k (rows may be empty)
            u32 lo = 0, hi = nr;  // offs[lo] <= k < offs[hi]
            while (hi - lo > 1) {
                const u32 mid = (lo + hi) >> 1;
                if (offs[wib][mid] <= k) lo = mid; else hi = mid;
            }
            atomicAdd(&x[ci[b + k]], (double)val[b + k] * (alpha * y[r0 + lo]));
        }
    }
}

extern "C" __global__ void __launch_bounds__(256)
spmv_f64(u32 nseg, const u32* seg, const u64* ip, const u32* ci, const double* val,
         const double* x, double* y, double alpha, double beta, const double* d) {
    spmv_impl<double>(nseg, seg, ip, ci, val, x, y, alpha, beta, d);
}
extern "C" __global__ void __launch_bounds__(256)
spmv_f32(u32 nseg, const u32* seg, const u64* ip, const u32* ci, const float* val,
         const double* x, double* y, double alpha, double beta, const double* d) {
    spmv_impl<float>(nseg, seg, ip, ci, val, x, y, alpha, beta, d);
}
extern "C" __global__ void __launch_bounds__(256)
scatter_f64(u32 nseg, const u32* seg, const u64* ip, const u32* ci, const double* val,
            const double* y, double* x, double alpha) {
    scatter_impl<double>(nseg, seg, ip, ci, val, y, x, alpha);
}
extern "C" __global__ void __launch_bounds__(256)
scatter_f32(u32 nseg, const u32* seg, const u64* ip, const u32* ci, const float* val,
            const double* y, double* x, double alpha) {
    scatter_impl<float>(nseg, seg, ip, ci, val, y, x, alpha);
}

// Row patterns (src/sparse/patterns.rs): a thread per row. Row r of slice r / PSLICE reads its
// pattern's column offsets from the table (the same few entries for a whole warp: cached) and
// its values slot by slot (a warp's loads of one slot are coalesced); PUNROLL values and gathers
// are issued before they are summed. The sum runs in column order, one product added at a time
// (no FMA: --fmad=false), as the stream mode of spmv_impl sums a short row. With `nsq` (GMRES's
// next basis vector still unnormalised in x): every gathered x is scaled by
// 1 / sqrt(max(*nsq, 0)) as copy_inv_sqrt of vector.cu would store it, and the row writes its own
// normalised entry to vout: the same numbers as copy_inv_sqrt followed by the product.
#define PSLICE 32
#ifndef PUNROLL
#define PUNROLL 8
#endif
// Blocks per SM the register budget of pattern_spmv aims at (SEISTOMO_NVRTC_DEFINES=PMINB=..):
// 8 (32 registers, no spills) measured 0.244 against 0.249 ms per GMRES step with 1 (H100).
#ifndef PMINB
#define PMINB 8
#endif
template <typename V, bool GHOSTS>
__device__ __forceinline__ void pattern_spmv_impl(u32 r0, u32 m, u32 nown,
                                                  const u64* __restrict__ sptr,
                                                  const unsigned short* __restrict__ rpat,
                                                  const u32* __restrict__ pstart,
                                                  const int* __restrict__ poff,
                                                  const V* __restrict__ val,
                                                  const double* __restrict__ x,
                                                  const double* __restrict__ gx,
                                                  double* __restrict__ y, double alpha,
                                                  double beta, const double* __restrict__ d,
                                                  const double* __restrict__ nsq,
                                                  double* __restrict__ vout) {
    // 64-bit: blockIdx.x * blockDim.x would wrap for m within a block of 2^32
    const u64 r = (u64)r0 + (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= m) return;
    const double inv = nsq ? 1.0 / sqrt(fmax(*nsq, 0.0)) : 1.0;
    const u32 p = rpat[r];
    const u32 pb = __ldg(&pstart[p]);
    const u32 len = __ldg(&pstart[p + 1]) - pb;
    const V* __restrict__ vr = val + sptr[r / PSLICE] + (r % PSLICE);
    double sum = 0.0;
    for (u32 k0 = 0; k0 < len; k0 += PUNROLL) {
        double v[PUNROLL], xv[PUNROLL];
#pragma unroll
        for (int j = 0; j < PUNROLL; ++j) {
            const u32 k = k0 + j;
            v[j] = 0.0;
            xv[j] = 0.0;
            if (k < len) {
                v[j] = (double)vr[(u64)k * PSLICE];
                const u64 c = (u64)((long long)r + __ldg(&poff[pb + k]));
                // inv == 1 without nsq: x * 1 is x exactly. With GHOSTS the columns from nown
                // on are gx's (one address chosen, one load).
                const double* at = (GHOSTS && c >= nown) ? gx + (c - nown) : x + c;
                xv[j] = inv * __ldg(at);
            }
        }
#pragma unroll
        for (int j = 0; j < PUNROLL; ++j)
            if (k0 + j < len) sum += v[j] * xv[j];
    }
    spmv_store(y, (u32)r, sum, alpha, beta, d);
    if (vout) vout[r] = inv * x[r];
}

// Rows r0..m of the patterns (x: every column); the _halo kernels read the columns from nown on
// from gx (a rank's ghosts, received into a buffer of their own).
#define PATTERN_KERNEL(NAME, V, GHOSTS)                                                          \
    extern "C" __global__ void __launch_bounds__(256, PMINB)                                     \
        NAME(u32 r0, u32 m, u32 nown, const u64* sptr, const unsigned short* rpat,              \
             const u32* pstart, const int* poff, const V* val, const double* x,                  \
             const double* gx, double* y, double alpha, double beta, const double* d,            \
             const double* nsq, double* vout) {                                                  \
        pattern_spmv_impl<V, GHOSTS>(r0, m, nown, sptr, rpat, pstart, poff, val, x, gx, y,     \
                                     alpha, beta, d, nsq, vout);                                 \
    }
PATTERN_KERNEL(pattern_spmv_f64, double, false)
PATTERN_KERNEL(pattern_spmv_f32, float, false)
PATTERN_KERNEL(pattern_spmv_halo_f64, double, true)
PATTERN_KERNEL(pattern_spmv_halo_f32, float, true)
