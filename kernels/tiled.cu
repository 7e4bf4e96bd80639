// Products on column tiles (src/sparse/tiled.rs): x or y staged in shared memory per tile
// chunk, so the nonzeros gather from shared memory instead of L2. Needs compact.cu (StencilArgs,
// stencil_t_add, block_partial, fused_begin, fused_store, subwarp_sum) before it in the same
// program.
//
//   y = a A x + b y:  tiled_axf  (block per chunk: x of its tile in shared memory; the chunk's
//                                 entries as a flat stream, segment sums by a segmented scan
//                                 to seg_partial in tile order)
//                     tiled_rows (thread per row: its segment sums in tile order; epilogue)
//   x = a A^T y + b x: tiled_atu (block per chunk: y of its segments in shared memory; a
//                                 sub-warp per column of the tile; column sums to cpart)
//                      tiled_cols (thread per column: its chunks' sums in order; stencil
//                                 rows' terms; epilogue)
// The epilogues write a * sum + b * old (b == 0: old not read) and per block the sum of the
// new values squared into `partial`; (a, b) from `coef` when it is not null; nothing runs
// while *skip != 0.

#define TILED_THREADS 256
#define TILED_ROWS_PER_THREAD 4
#define TILED_ROWPASS_RPT 2     // rows per thread of tiled_rows (src/backend/cuda/tiled.rs)
#define TILED_CHUNK_SEGS 2048   // src/sparse/tiled.rs CHUNK_SEGS
#define LCOL_END 0x8000u        // a_lcol: set on the last entry of each segment (src/sparse/tiled.rs)
#define LCOL_MASK 0x7fffu       // a_lcol: the column within the tile
#ifndef AXF_MINB
#define AXF_MINB 4              // blocks per SM tiled_axf is compiled for
#endif
#define AXF_P 8                 // entries per lane per round of tiled_axf (one 16-byte u16 load)

// Sum of val[k] * staged[idx[k]] over entries e0..e1 by the S lanes of a sub-warp (lane sl takes
// every S-th entry from e0 + sl, in order), then a shuffle tree; valid in the sub-warp's first
// lane. Four entries' loads per lane are issued before their products.
template <typename V, int S>
__device__ __forceinline__ double subwarp_dot(u64 e0, u64 e1, int sl, const V* __restrict__ val,
                                              const u16* __restrict__ idx, const double* staged) {
    double sum = 0.0;
    for (u64 k0 = e0 + sl; k0 < e1; k0 += 4 * S) {
        V v[4];
        u32 c[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const u64 k = k0 + (u64)(q * S);
            const bool in = k < e1;
            v[q] = in ? __ldg(&val[k]) : (V)0;
            c[q] = in ? (u32)__ldg(&idx[k]) : 0u;
        }
#pragma unroll
        for (int q = 0; q < 4; ++q)
            if (k0 + (u64)(q * S) < e1) sum += (double)v[q] * staged[c[q]];
    }
    return subwarp_sum<S>(sum);
}

template <typename V, int S>
__device__ __forceinline__ void tiled_atu_impl(
    u32 tile_bits, u32 q0, const u32* __restrict__ chunk_seg, const u32* __restrict__ seg_row,
    const u64* __restrict__ colptr, const u16* __restrict__ lseg, const V* __restrict__ val,
    const double* __restrict__ y, double* __restrict__ cpart, const int* __restrict__ skip) {
    __shared__ double ys[TILED_CHUNK_SEGS];
    extern __shared__ u32 cps[];  // the tile's column offsets, relative to its first: T + 1
    if (skip && *skip) return;
    const u32 q = q0 + blockIdx.x;  // chunks q0.. (a piece of the columns: tiled.rs atu_range)
    const u32 T = 1u << tile_bits;
    const u64 cb = (u64)q << tile_bits;
    const u64 eb = colptr[cb];
    const u32 s0 = chunk_seg[q], ns = chunk_seg[q + 1] - s0;
    for (u32 i = threadIdx.x; i < ns; i += TILED_THREADS) ys[i] = y[seg_row[s0 + i]];
    for (u32 c = threadIdx.x; c <= T; c += TILED_THREADS) cps[c] = (u32)(colptr[cb + c] - eb);
    __syncthreads();
    const int sl = threadIdx.x & (S - 1);
    const u32 sub = threadIdx.x / S, nsub = TILED_THREADS / S;
    for (u32 base = 0; base < T; base += nsub) {
        const u32 c = base + sub;
        const bool valid = c < T;
        const u64 e0 = valid ? eb + cps[c] : 0ull, e1 = valid ? eb + cps[c + 1] : 0ull;
        const double sum = subwarp_dot<V, S>(e0, e1, sl, val, lseg, ys);
        if (valid && sl == 0) cpart[cb + c] = sum;
    }
}

// One lane's AXF_P consecutive row entries (an AXF_P-aligned index): 16-bit columns with the end
// bit, and values, fetched with 16-byte loads.
template <typename V>
struct AxfRaw {
    uint4 c;        // AXF_P = 8 u16
    V v[AXF_P];
};
__device__ __forceinline__ void axf_load(const u16* __restrict__ lcol, const float* __restrict__ val,
                                         u64 g, AxfRaw<float>& r) {
    r.c = __ldg(reinterpret_cast<const uint4*>(lcol + g));
    const float4 a = __ldg(reinterpret_cast<const float4*>(val + g));
    const float4 b = __ldg(reinterpret_cast<const float4*>(val + g) + 1);
    r.v[0] = a.x; r.v[1] = a.y; r.v[2] = a.z; r.v[3] = a.w;
    r.v[4] = b.x; r.v[5] = b.y; r.v[6] = b.z; r.v[7] = b.w;
}
__device__ __forceinline__ void axf_load(const u16* __restrict__ lcol, const double* __restrict__ val,
                                         u64 g, AxfRaw<double>& r) {
    r.c = __ldg(reinterpret_cast<const uint4*>(lcol + g));
#pragma unroll
    for (int h = 0; h < AXF_P / 2; ++h) {
        const double2 a = __ldg(reinterpret_cast<const double2*>(val + g) + h);
        r.v[2 * h] = a.x;
        r.v[2 * h + 1] = a.y;
    }
}

// A x's segment sums over a chunk's row entries as one flat stream: no per-segment offsets are
// read (segment ends are the end bit of a_lcol) and every load is a 16-byte vector load, the
// next round's issued before the current one is summed. A block stages its chunk's tile of x in
// shared memory; warp w takes the w-th eighth of the chunk's segments, a lane AXF_P consecutive
// entries per round. A segmented scan over the lanes (reset after each segment end) gives each
// segment's sum, which the lane holding its last entry writes to seg_partial[segment] (tile
// order: coalesced); the open segment's sum carries into the next round. The order of the
// additions is fixed by the layout (deterministic). Entry arrays are padded to a multiple of
// AXF_P (src/backend/cuda/tiled.rs).
template <typename V>
__device__ __forceinline__ void tiled_axf_impl(
    u32 tile_bits, u64 ncols, const u32* __restrict__ chunk_tile, const u32* __restrict__ chunk_seg,
    const u64* __restrict__ seg_ent, const u16* __restrict__ lcol, const V* __restrict__ val,
    const double* __restrict__ x, double* __restrict__ seg_partial, const int* __restrict__ skip) {
    extern __shared__ double xs[];  // the tile's x
    if (skip && *skip) return;
    const u32 q = blockIdx.x;
    const u32 T = 1u << tile_bits;
    const u64 c0 = (u64)chunk_tile[q] << tile_bits;
    const u32 s0 = chunk_seg[q], ns = chunk_seg[q + 1] - s0;
    for (u32 i = threadIdx.x; i < T; i += TILED_THREADS) {
        const u64 j = c0 + i;
        xs[i] = j < ncols ? x[j] : 0.0;
    }
    __syncthreads();
    const u32 lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    constexpr u32 NW = TILED_THREADS / 32;
    const u32 sa = (u32)(((u64)ns * w) / NW), sb = (u32)(((u64)ns * (w + 1)) / NW);
    if (sa == sb) return;  // warp-uniform; no barrier follows
    const u64 ea = seg_ent[s0 + sa], eb = seg_ent[s0 + sb];
    u64 seg = (u64)s0 + sa;  // the segment the next end closes
    double carry = 0.0;      // the open segment's sum from earlier rounds
    u64 g = (ea & ~(u64)(AXF_P - 1)) + (u64)lane * AXF_P;
    AxfRaw<V> cur{};
    if (g < eb) axf_load(lcol, val, g, cur);
    for (u64 g0 = ea & ~(u64)(AXF_P - 1); g0 < eb; g0 += 32 * AXF_P, g += 32 * AXF_P) {
        AxfRaw<V> nxt{};
        if (g + 32 * AXF_P < eb) axf_load(lcol, val, g + 32 * AXF_P, nxt);
        double p[AXF_P];
        u32 fl = 0;  // bit i: entry g + i ends a segment
        const u32 cw[4] = {cur.c.x, cur.c.y, cur.c.z, cur.c.w};
#pragma unroll
        for (int i = 0; i < AXF_P; ++i) {
            const u64 k = g + (u64)i;
            const u32 c = (cw[i >> 1] >> (16 * (i & 1))) & 0xffffu;
            const bool in = k >= ea && k < eb;
            p[i] = in ? (double)cur.v[i] * xs[c & LCOL_MASK] : 0.0;
            if (in && (c & LCOL_END)) fl |= 1u << i;
        }
        // The lane's tail (its entries after its last end), scanned over the lanes with a
        // reset at every lane that holds an end; the ends before each lane counted.
        double tv = 0.0;
#pragma unroll
        for (int i = 0; i < AXF_P; ++i) tv = ((fl >> i) & 1u) ? 0.0 : tv + p[i];
        int tf = fl != 0;
        u32 cnt = __popc(fl);
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const double uv = __shfl_up_sync(FULL_MASK, tv, o);
            const int uf = __shfl_up_sync(FULL_MASK, tf, o);
            const u32 uc = __shfl_up_sync(FULL_MASK, cnt, o);
            if (lane >= (u32)o) {
                if (!tf) tv = uv + tv;
                tf |= uf;
                cnt += uc;
            }
        }
        // What runs into this lane's first entry.
        const double ev1 = __shfl_up_sync(FULL_MASK, tv, 1);
        const int ef1 = __shfl_up_sync(FULL_MASK, tf, 1);
        const double ev = lane ? ev1 : 0.0;
        const int ef = lane ? ef1 : 0;
        double t = ef ? ev : carry + ev;
        u64 sidx = seg + cnt - __popc(fl);
#pragma unroll
        for (int i = 0; i < AXF_P; ++i) {
            t += p[i];
            if ((fl >> i) & 1u) {
                seg_partial[sidx++] = t;
                t = 0.0;
            }
        }
        const double lv = __shfl_sync(FULL_MASK, tv, 31);
        carry = __shfl_sync(FULL_MASK, tf, 31) ? lv : carry + lv;
        seg += __shfl_sync(FULL_MASK, cnt, 31);
        cur = nxt;
    }
}

#define TILED_KERNELS(SUF, V, S)                                                                \
    extern "C" __global__ void __launch_bounds__(TILED_THREADS)                                 \
        tiled_atu_##SUF(u32 tile_bits, u32 q0, const u32* chunk_seg, const u32* seg_row,        \
                        const u64* colptr, const u16* lseg, const V* val, const double* y,      \
                        double* cpart, const int* skip) {                                       \
        tiled_atu_impl<V, S>(tile_bits, q0, chunk_seg, seg_row, colptr, lseg, val, y, cpart,    \
                             skip);                                                             \
    }

TILED_KERNELS(s32_f64, double, 32)
TILED_KERNELS(s16_f64, double, 16)
TILED_KERNELS(s8_f64, double, 8)
TILED_KERNELS(s4_f64, double, 4)
TILED_KERNELS(s32_f32, float, 32)
TILED_KERNELS(s16_f32, float, 16)
TILED_KERNELS(s8_f32, float, 8)
TILED_KERNELS(s4_f32, float, 4)

#define TILED_AXF_KERNEL(SUF, V)                                                               \
    extern "C" __global__ void __launch_bounds__(TILED_THREADS, AXF_MINB)                      \
        tiled_axf_##SUF(u32 tile_bits, u64 ncols, const u32* chunk_tile, const u32* chunk_seg, \
                        const u64* seg_ent, const u16* lcol, const V* val, const double* x,    \
                        double* seg_partial, const int* skip) {                                \
        tiled_axf_impl<V>(tile_bits, ncols, chunk_tile, chunk_seg, seg_ent, lcol, val, x,      \
                          seg_partial, skip);                                                  \
    }
TILED_AXF_KERNEL(f64, double)
TILED_AXF_KERNEL(f32, float)

// y[r] = a * (sum of row r's segment partials, in tile order) + b * y[r]; row r's segments
// are seg_partial[seg_pos[k]] for k in row_seg[r]..row_seg[r + 1] (seg_pos: a segment's place
// in tile order, where tiled_axf wrote its sum). TILED_ROWPASS_RPT rows per thread.
extern "C" __global__ void __launch_bounds__(TILED_THREADS)
tiled_rows(u32 nrows, const u64* __restrict__ row_seg, const u32* __restrict__ seg_pos,
           const double* __restrict__ seg_partial, double* __restrict__ y, double a, double b,
           const double* __restrict__ coef, const int* __restrict__ skip,
           double* __restrict__ partial) {
    if (!fused_begin(skip, coef, &a, &b)) return;
    double acc = 0.0;
    for (int t = 0; t < TILED_ROWPASS_RPT; ++t) {
        const u64 r = ((u64)blockIdx.x * TILED_ROWPASS_RPT + t) * TILED_THREADS + threadIdx.x;
        if (r >= nrows) break;
        double s = 0.0;
        for (u64 k = row_seg[r]; k < row_seg[r + 1]; ++k) s += seg_partial[seg_pos[k]];
        fused_store(s, a, b, &y[r], &acc);
    }
    if (partial) block_partial(acc, partial);
}

// x[j] = a * (sum of column j's chunk sums, in chunk order, then the stencil rows' terms)
// + b * x[j], for the columns j0..ncols (j0 a multiple of TILED_THREADS *
// TILED_ROWS_PER_THREAD: block b writes partial[b] for its columns).
extern "C" __global__ void __launch_bounds__(TILED_THREADS)
tiled_cols(u32 j0, u32 ncols, u32 tile_bits, const u32* __restrict__ tile_chunk,
           const double* __restrict__ cpart, double* __restrict__ x, double a, double b,
           const double* __restrict__ coef, const int* __restrict__ skip,
           double* __restrict__ partial, StencilArgs st, const double* __restrict__ yd,
           int has_stencil) {
    if (!fused_begin(skip, coef, &a, &b)) return;
    const u32 mask = (1u << tile_bits) - 1;
    double acc = 0.0;
    for (int t = 0; t < TILED_ROWS_PER_THREAD; ++t) {
        const u64 j =
            j0 + ((u64)blockIdx.x * TILED_ROWS_PER_THREAD + t) * TILED_THREADS + threadIdx.x;
        if (j >= ncols) break;
        const u32 tile = (u32)(j >> tile_bits), c = (u32)j & mask;
        double s = 0.0;
        for (u32 q = tile_chunk[tile]; q < tile_chunk[tile + 1]; ++q)
            s += cpart[((u64)q << tile_bits) + c];
        if (has_stencil) s = stencil_t_add(st, s, (u32)j, yd);
        fused_store(s, a, b, &x[j], &acc);
    }
    if (partial) block_partial(acc, partial);
}
