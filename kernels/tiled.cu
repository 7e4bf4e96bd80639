// Products on column tiles (src/sparse/tiled.rs): x or y staged in shared memory per tile
// chunk, so the nonzeros gather from shared memory instead of L2. Needs compact.cu (StencilArgs,
// stencil_t_add, block_partial, fused_begin, fused_store, subwarp_sum) before it in the same
// program.
//
//   y = a A x + b y:  tiled_ax   (block per chunk: x of its tile in shared memory; a sub-warp
//                                 per segment; segment sums to seg_partial in row order)
//                     tiled_rows (thread per row: its segment sums in tile order; epilogue)
//   x = a A^T y + b x: tiled_atu (block per chunk: y of its segments in shared memory; a
//                                 sub-warp per column of the tile; column sums to cpart)
//                      tiled_cols (thread per column: its chunks' sums in order; stencil
//                                 rows' terms; epilogue)
// The epilogues write a * sum + b * old (b == 0: old not read) and per block the sum of the
// new values squared into `partial`; (a, b) from `coef` when it is not null; nothing runs
// while *skip != 0.

#define TILED_THREADS 256
#define TILED_ROWS_PER_THREAD 16
#define TILED_CHUNK_SEGS 2048   // src/sparse/tiled.rs CHUNK_SEGS

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
__device__ __forceinline__ void tiled_ax_impl(
    u32 tile_bits, u64 ncols, const u32* __restrict__ chunk_tile, const u32* __restrict__ chunk_seg,
    const u64* __restrict__ seg_ent, const u32* __restrict__ seg_slot, const u16* __restrict__ lcol,
    const V* __restrict__ val, const double* __restrict__ x, double* __restrict__ seg_partial,
    const int* __restrict__ skip) {
    extern __shared__ double xs[];
    if (skip && *skip) return;
    const u32 q = blockIdx.x;
    const u32 T = 1u << tile_bits;
    const u64 c0 = (u64)chunk_tile[q] << tile_bits;
    for (u32 i = threadIdx.x; i < T; i += TILED_THREADS) {
        const u64 j = c0 + i;
        xs[i] = j < ncols ? x[j] : 0.0;
    }
    __syncthreads();
    const u32 s0 = chunk_seg[q], s1 = chunk_seg[q + 1];
    const int sl = threadIdx.x & (S - 1);
    const u32 sub = threadIdx.x / S, nsub = TILED_THREADS / S;
    for (u32 base = s0; base < s1; base += nsub) {
        const u32 s = base + sub;
        const bool valid = s < s1;
        const u64 e0 = valid ? seg_ent[s] : 0ull, e1 = valid ? seg_ent[s + 1] : 0ull;
        const double sum = subwarp_dot<V, S>(e0, e1, sl, val, lcol, xs);
        if (valid && sl == 0) seg_partial[seg_slot[s]] = sum;
    }
}

template <typename V, int S>
__device__ __forceinline__ void tiled_atu_impl(
    u32 tile_bits, const u32* __restrict__ chunk_seg, const u32* __restrict__ seg_row,
    const u64* __restrict__ colptr, const u16* __restrict__ lseg, const V* __restrict__ val,
    const double* __restrict__ y, double* __restrict__ cpart, const int* __restrict__ skip) {
    __shared__ double ys[TILED_CHUNK_SEGS];
    extern __shared__ u32 cps[];  // the tile's column offsets, relative to its first: T + 1
    if (skip && *skip) return;
    const u32 q = blockIdx.x;
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

#define TILED_KERNELS(SUF, V, S)                                                                \
    extern "C" __global__ void __launch_bounds__(TILED_THREADS)                                 \
        tiled_ax_##SUF(u32 tile_bits, u64 ncols, const u32* chunk_tile, const u32* chunk_seg,   \
                       const u64* seg_ent, const u32* seg_slot, const u16* lcol, const V* val,  \
                       const double* x, double* seg_partial, const int* skip) {                 \
        tiled_ax_impl<V, S>(tile_bits, ncols, chunk_tile, chunk_seg, seg_ent, seg_slot, lcol,   \
                            val, x, seg_partial, skip);                                         \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(TILED_THREADS)                                 \
        tiled_atu_##SUF(u32 tile_bits, const u32* chunk_seg, const u32* seg_row,                \
                        const u64* colptr, const u16* lseg, const V* val, const double* y,      \
                        double* cpart, const int* skip) {                                       \
        tiled_atu_impl<V, S>(tile_bits, chunk_seg, seg_row, colptr, lseg, val, y, cpart, skip); \
    }

TILED_KERNELS(s32_f64, double, 32)
TILED_KERNELS(s16_f64, double, 16)
TILED_KERNELS(s8_f64, double, 8)
TILED_KERNELS(s4_f64, double, 4)
TILED_KERNELS(s32_f32, float, 32)
TILED_KERNELS(s16_f32, float, 16)
TILED_KERNELS(s8_f32, float, 8)
TILED_KERNELS(s4_f32, float, 4)

// y[r] = a * (sum of row r's segment partials, in tile order) + b * y[r].
extern "C" __global__ void __launch_bounds__(TILED_THREADS)
tiled_rows(u32 nrows, const u64* __restrict__ row_seg, const double* __restrict__ seg_partial,
           double* __restrict__ y, double a, double b, const double* __restrict__ coef,
           const int* __restrict__ skip, double* __restrict__ partial) {
    if (!fused_begin(skip, coef, &a, &b)) return;
    double acc = 0.0;
    for (int t = 0; t < TILED_ROWS_PER_THREAD; ++t) {
        const u64 r = ((u64)blockIdx.x * TILED_ROWS_PER_THREAD + t) * TILED_THREADS + threadIdx.x;
        if (r >= nrows) break;
        double s = 0.0;
        for (u64 k = row_seg[r]; k < row_seg[r + 1]; ++k) s += seg_partial[k];
        fused_store(s, a, b, &y[r], &acc);
    }
    if (partial) block_partial(acc, partial);
}

// x[j] = a * (sum of column j's chunk sums, in chunk order, then the stencil rows' terms)
// + b * x[j].
extern "C" __global__ void __launch_bounds__(TILED_THREADS)
tiled_cols(u32 ncols, u32 tile_bits, const u32* __restrict__ tile_chunk,
           const double* __restrict__ cpart, double* __restrict__ x, double a, double b,
           const double* __restrict__ coef, const int* __restrict__ skip,
           double* __restrict__ partial, StencilArgs st, const double* __restrict__ yd,
           int has_stencil) {
    if (!fused_begin(skip, coef, &a, &b)) return;
    const u32 mask = (1u << tile_bits) - 1;
    double acc = 0.0;
    for (int t = 0; t < TILED_ROWS_PER_THREAD; ++t) {
        const u64 j = ((u64)blockIdx.x * TILED_ROWS_PER_THREAD + t) * TILED_THREADS + threadIdx.x;
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
