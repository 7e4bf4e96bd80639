// Blocks of k vectors for batched LSQR (src/backend/cuda/block.rs): `rows x k` values,
// row-major, entry (i, j) of member j at i * k + j, so the k values one matrix entry
// multiplies lie side by side and one pass over the matrix serves every member.
//
// The element-wise and reduction kernels run in blocks of a multiple of k threads
// (block.rs `block_threads`), so over the whole grid-stride loop thread t works on column
// t % k only; the coefficients of member j (scale factors, betas, the update's steps) come from
// a small device array of k values.
//
// A block may carry a pending scale (block.rs `CudaBlock::pending`): its values are then
// p_j x_ij, formed where they are read (`p ? x * p[j] : x`: the product a block_scale would
// have stored, so every result is the same bit for bit) instead of in a pass of their own.
// Null: none.

// Value i (of column j) of a block with pending scale p (null: none).
__device__ __forceinline__ double scaled(const double* __restrict__ x, unsigned long long i,
                                         const double* __restrict__ p, int j) {
    return p ? x[i] * p[j] : x[i];
}

// Column j's partial sum of this block into partial[blockIdx.x * k + j] (blockDim.x a
// multiple of k; `sh` holds blockDim.x doubles). Every thread calls it.
__device__ __forceinline__ void column_partials(double s, int k, double* sh, double* partial) {
    sh[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x < (unsigned)k) {
        double t = 0.0;
        for (unsigned c = threadIdx.x; c < blockDim.x; c += k) t += sh[c];
        partial[(unsigned long long)blockIdx.x * k + threadIdx.x] = t;
    }
}

#define BLOCK_STRIDE(n)                                                                        \
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;   \
         i < (n); i += (unsigned long long)gridDim.x * blockDim.x)

// partial[b * k + j] = this block's sum of (f[j] x_ij)^2 (f null: of x_ij^2); n = rows * k;
// x's pending scale xp.
extern "C" __global__ void block_norms(unsigned long long n, int k, const double* __restrict__ x,
                                       const double* __restrict__ xp,
                                       const double* __restrict__ f, double* partial) {
    extern __shared__ double sh[];
    const int j = threadIdx.x % k;
    double s = 0.0;
    if (f) {
        const double fj = f[j];
        BLOCK_STRIDE(n) {
            const double v = scaled(x, i, xp, j) * fj;
            s += v * v;
        }
    } else {
        BLOCK_STRIDE(n) {
            const double v = scaled(x, i, xp, j);
            s += v * v;
        }
    }
    column_partials(s, k, sh, partial);
}

// out[j] = the sum of the `blocks` partials of column j, in block order.
extern "C" __global__ void block_sum_partials(int blocks, int k, const double* __restrict__ partial,
                                              double* __restrict__ out) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= k) return;
    double t = 0.0;
    for (int b = 0; b < blocks; ++b) t += partial[(unsigned long long)b * k + j];
    out[j] = t;
}

// x_ij = a[j] x_ij
extern "C" __global__ void block_scale(unsigned long long n, int k, double* __restrict__ x,
                                       const double* __restrict__ a) {
    const double aj = a[threadIdx.x % k];
    BLOCK_STRIDE(n) x[i] *= aj;
}

// y_ij = a x_ij + b[j] y_ij (x's pending scale xp, y's yp)
extern "C" __global__ void block_axpby(unsigned long long n, int k, double a,
                                       const double* __restrict__ x,
                                       const double* __restrict__ xp,
                                       const double* __restrict__ b, double* __restrict__ y,
                                       const double* __restrict__ yp) {
    const int j = threadIdx.x % k;
    const double bj = b[j];
    BLOCK_STRIDE(n) y[i] = a * scaled(x, i, xp, j) + bj * scaled(y, i, yp, j);
}

// LSQR's update of every member (vector.cu's lsqr_update column by column): with
// c = [t1 (k), t2 (k), inv_rho (k)], partial (per block and column) = ||inv_rho w||^2 of the old
// w; x += t1 w; var += (inv_rho w)^2 (var may be null); w = v + t2 w (v's pending scale vp).
extern "C" __global__ void block_update(unsigned long long n, int k, double* __restrict__ x,
                                        double* __restrict__ w, const double* __restrict__ v,
                                        const double* __restrict__ vp,
                                        double* __restrict__ var, const double* __restrict__ c,
                                        double* partial) {
    extern __shared__ double sh[];
    const int j = threadIdx.x % k;
    const double t1 = c[j], t2 = c[k + j], inv_rho = c[2 * k + j];
    double s = 0.0;
    BLOCK_STRIDE(n) {
        const double wi = w[i];
        const double dk = inv_rho * wi;
        s += dk * dk;
        x[i] += t1 * wi;
        if (var) var[i] += dk * dk;
        w[i] = scaled(v, i, vp, j) + t2 * wi;
    }
    column_partials(s, k, sh, partial);
}

// dst (rows x k2) = the columns keep[0..k2] of src (rows x k); n = rows * k2, blockDim.x a
// multiple of k2.
extern "C" __global__ void block_keep(unsigned long long n, int k, int k2,
                                      const double* __restrict__ src, const int* __restrict__ keep,
                                      double* __restrict__ dst) {
    const int c = threadIdx.x % k2;
    const int from = keep[c];
    BLOCK_STRIDE(n) dst[i] = src[(i / k2) * k + from];
}

// Column j of a rows x k block to or from a vector of `rows` values (to_block: into the block).
extern "C" __global__ void block_column(unsigned long long rows, int k, int j, int to_block,
                                        double* __restrict__ block, double* __restrict__ col) {
    BLOCK_STRIDE(rows) {
        const unsigned long long e = i * k + j;
        if (to_block)
            block[e] = col[i];
        else
            col[i] = block[e];
    }
}

// y_j of row `row` = alpha acc + beta_j y_j (y_j not read where beta_j == 0; y's pending
// scale yp).
__device__ __forceinline__ void put(double* __restrict__ y, unsigned row, int k, int j,
                                    double alpha, double acc, const double* __restrict__ beta,
                                    const double* __restrict__ yp) {
    const unsigned long long e = (unsigned long long)row * k + j;
    const double b = beta[j];
    y[e] = b == 0.0 ? alpha * acc : alpha * acc + b * scaled(y, e, yp, j);
}

// ---- The block product A X on column tiles (src/backend/cuda/block.rs `BlockTiles`) ----
//
// The matrix is in two parts over the same rows: G, the unweighted rows, in column tiles
// (src/sparse/tiled.rs, both halves), so the k values of X (of Y) an entry multiplies come from
// shared memory, not from L2 (a block CSR product gathers k values per entry, from an X of
// 168 MB at k = 16 on the 101M-nonzero system that does not fit the 50 MB L2: 6.7 ms for A X
// against 3.9 here); and R, the weighted rows (f64: member j's entry a w_j, rounded to f32 in an
// f32 batch as its own solve stores it), in CSR and CSR of R^T. A X in two passes:
//
//   bt_axf:  a block per chunk and group of at most BT_KB members: those members' columns of
//            X's rows in the chunk's tile (T x kb values) staged in shared memory; each group of
//            kb lanes (one lane a member) walks its share of the chunk's segments entry by
//            entry, in order, and writes each segment's sums to seg_partial[segment * k + j]
//            (tile order). The blocks of one chunk are neighbours, so its entries are read
//            from HBM once for all member groups.
//   bt_rows: a group of lanes a row: the row's segment sums in tile order, then its weighted
//            entries (R, member j's entry a w_j), then
//            y_j = alpha sum + beta_j y_j (y_j not read where beta_j == 0). Groups: k <= 32:
//            k lanes a group, 32 / k groups a warp; k > 32: a warp a group, lane l taking
//            members l, l + 32, ...

// dst[i] = load(i) for i < n, the block's threads together, BT_STAGE loads a thread in flight
// (the loads of a round issued before any is stored: a block's staging is one round trip to
// memory a round, not one a value).
#define BT_STAGE 8
template <typename Load>
__device__ __forceinline__ void bt_stage(double* __restrict__ dst, u32 n, Load load) {
    for (u32 i0 = threadIdx.x; i0 < n; i0 += BT_STAGE * blockDim.x) {
        double t[BT_STAGE];
#pragma unroll
        for (int u = 0; u < BT_STAGE; ++u) {
            const u32 i = i0 + (u32)u * blockDim.x;
            t[u] = i < n ? load(i) : 0.0;
        }
#pragma unroll
        for (int u = 0; u < BT_STAGE; ++u) {
            const u32 i = i0 + (u32)u * blockDim.x;
            if (i < n) dst[i] = t[u];
        }
    }
}

// The most threads a block of the tile kernels (bt_axf, bt_atu) has: 512 where a block stages
// more than 32 KiB, so that three blocks an SM (their shared memory) still make 48 warps
// (src/backend/cuda/block.rs `tile_threads`).
#define BT_TILE_THREADS 512

#define BT_KB 16  // members a block of bt_axf serves at most (src/backend/cuda/block.rs BT_KB)

// Lanes of a group (gw: at most 32), groups a warp, and this lane's group and place in it.
__device__ __forceinline__ void bt_lanes(int k, int lane, int* gw, int* groups, int* grp, int* j) {
    *gw = k < 32 ? k : 32;
    *groups = 32 / *gw;
    *grp = lane / *gw;
    *j = lane % *gw;
}

template <typename V>
__device__ __forceinline__ void bt_axf_impl(int k, u32 tile_bits, u64 ncols,
                                            const u32* __restrict__ chunk_tile,
                                            const u32* __restrict__ chunk_seg,
                                            const u64* __restrict__ seg_ent,
                                            const u16* __restrict__ lcol, const V* __restrict__ val,
                                            const double* __restrict__ x,
                                            const double* __restrict__ xp,
                                            double* __restrict__ seg_partial) {
    extern __shared__ double xs[];  // the tile's rows of X, the group's members: T x kb
    const u32 nmg = (u32)(k + BT_KB - 1) / BT_KB;
    const u32 q = blockIdx.x / nmg, jb = (blockIdx.x % nmg) * BT_KB;
    const int kb = min(BT_KB, k - (int)jb);
    const u32 T = 1u << tile_bits;
    const u64 c0 = (u64)chunk_tile[q] << tile_bits;
    bt_stage(xs, T * (u32)kb, [&](u32 i) {
        const u64 c = c0 + i / (u32)kb;
        const int j = (int)(jb + i % (u32)kb);
        return c < ncols ? scaled(x, c * (u64)k + j, xp, j) : 0.0;
    });
    __syncthreads();
    const u32 s0 = chunk_seg[q], ns = chunk_seg[q + 1] - s0;
    int gw, groups, grp, j;
    bt_lanes(kb, threadIdx.x & 31, &gw, &groups, &grp, &j);
    if (grp >= groups) return;  // lanes beyond the last whole group; no barrier follows
    const u32 ng = (blockDim.x >> 5) * groups;
    const u32 g = (threadIdx.x >> 5) * groups + grp;
    const u32 sa = (u32)(((u64)ns * g) / ng), sb = (u32)(((u64)ns * (g + 1)) / ng);
    if (sa == sb) return;
    const u64 ea = seg_ent[s0 + sa], eb = seg_ent[s0 + sb];
    u64 seg = (u64)s0 + sa;
    double acc = 0.0;
    const u64 g0 = ea & ~(u64)(AXF_P - 1);
    AxfRaw<V> cur{};
    axf_load(lcol, val, g0, cur);
    for (u64 r = g0; r < eb; r += AXF_P) {
        AxfRaw<V> nxt{};
        if (r + AXF_P < eb) axf_load(lcol, val, r + AXF_P, nxt);
        const u32 cw[4] = {cur.c.x, cur.c.y, cur.c.z, cur.c.w};
#pragma unroll
        for (int i = 0; i < AXF_P; ++i) {
            const u64 e = r + (u64)i;
            if (e < ea || e >= eb) continue;
            const u32 c = (cw[i >> 1] >> (16 * (i & 1))) & 0xffffu;
            acc += (double)cur.v[i] * xs[(c & LCOL_MASK) * (u32)kb + (u32)j];
            if (c & LCOL_END) {
                seg_partial[seg * k + jb + j] = acc;
                ++seg;
                acc = 0.0;
            }
        }
        cur = nxt;
    }
}

#define BT_AXF(SUF, V)                                                                          \
    extern "C" __global__ void __launch_bounds__(BT_TILE_THREADS, 2)                            \
        bt_axf_##SUF(int k, u32 tile_bits, u64 ncols, const u32* chunk_tile,                    \
                     const u32* chunk_seg, const u64* seg_ent, const u16* lcol, const V* val,   \
                     const double* x, const double* xp, double* seg_partial) {                  \
        bt_axf_impl<V>(k, tile_bits, ncols, chunk_tile, chunk_seg, seg_ent, lcol, val, x, xp,   \
                       seg_partial);                                                            \
    }
BT_AXF(f64, double)
BT_AXF(f32, float)

// What the second passes share: the weighted entries (R for A X, R^T for A^T Y, in CSR; null
// rptr: none), the input and output blocks and the epilogue's coefficients.
struct BtTail {
    const u64* rptr;
    const u32* rcols;
    const double* rvals;
    const double* in;
    const double* in_p;  // the input's pending scale
    double* out;
    const double* out_p;  // the output's
    double alpha;
    const double* beta;
    const double* w;
};

// A second pass over `n` outputs, a lane group an output: output i of member j is `gsum(i, j)`
// (its G sums), plus its weighted entries in order (member j's entry a w_j, rounded to f32 in
// an f32 batch), then out_j = alpha sum + beta_j out_j.
template <bool F32, typename GSum>
__device__ __forceinline__ void bt_second(u32 n, int k, const BtTail& t, GSum gsum) {
    int gw, groups, grp, jl;
    bt_lanes(k, threadIdx.x & 31, &gw, &groups, &grp, &jl);
    if (grp >= groups) return;
    const u32 warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u32 nwarps = (gridDim.x * blockDim.x) >> 5;
    for (u32 i = warp * groups + grp; i < n; i += nwarps * groups) {
        const u64 ra = t.rptr ? t.rptr[i] : 0, rb = t.rptr ? t.rptr[i + 1] : 0;
        for (int j = jl; j < k; j += gw) {
            double acc = gsum(i, j);
            if (rb > ra) {
                const double wj = t.w[j];
                for (u64 p = ra; p < rb; ++p) {
                    double v = t.rvals[p] * wj;
                    if (F32) v = (double)(float)v;
                    acc += v * scaled(t.in, (u64)t.rcols[p] * k + j, t.in_p, j);
                }
            }
            put(t.out, i, k, j, t.alpha, acc, t.beta, t.out_p);
        }
    }
}

#define BT_ROWS(SUF, F32)                                                                       \
    extern "C" __global__ void __launch_bounds__(256)                                           \
        bt_rows_##SUF(u32 nrows, int k, const u64* row_seg, const u32* seg_pos,                 \
                      const double* seg_partial, const u64* rptr, const u32* rcols,              \
                      const double* rvals, const double* x, const double* xp, double* y,         \
                      const double* yp, double alpha, const double* beta, const double* w) {     \
        const BtTail t = {rptr, rcols, rvals, x, xp, y, yp, alpha, beta, w};                     \
        bt_second<F32>(nrows, k, t, [&](u32 r, int j) {                                          \
            double acc = 0.0;                                                                    \
            for (u64 s = row_seg[r]; s < row_seg[r + 1]; ++s)                                    \
                acc += seg_partial[(u64)seg_pos[s] * k + j];                                     \
            return acc;                                                                          \
        });                                                                                      \
    }
BT_ROWS(f64, false)
BT_ROWS(f32, true)

// ---- The block product A^T Y on the same column tiles (the column entries of src/sparse/tiled.rs) ----
//
//   bt_atu:  a block per chunk (at most 512 segments here: block.rs BT_CHUNK_SEGS_AT) and group
//            of at most BT_KBT members: those members' values of Y on the rows of the chunk's
//            segments (ns x kb values, one gather of kb contiguous
//            values a segment) staged in shared memory; a group of kb lanes (one lane a member)
//            a column of the tile, its entries in order; the column's sum to
//            cpart[(chunk * T + column) * k + j].
//   bt_cols: a group of lanes a column: its chunks' sums in chunk order, then its entries in the
//            weighted rows (R^T in CSR, member j's entry a w_j), then
//            x_j = alpha sum + beta_j x_j (x_j not read where beta_j == 0).

#define BT_KBT 16  // members a block of bt_atu serves at most (src/backend/cuda/block.rs BT_KBT)

template <typename V>
__device__ __forceinline__ void bt_atu_impl(int k, u32 tile_bits, const u32* __restrict__ chunk_seg,
                                            const u32* __restrict__ seg_row,
                                            const u64* __restrict__ colptr,
                                            const u16* __restrict__ lseg, const V* __restrict__ val,
                                            const double* __restrict__ y,
                                            const double* __restrict__ yp,
                                            double* __restrict__ cpart) {
    extern __shared__ double ys[];  // the chunk's segments' rows of Y, the group's members
    const u32 nmg = (u32)(k + BT_KBT - 1) / BT_KBT;
    const u32 q = blockIdx.x / nmg, jb = (blockIdx.x % nmg) * BT_KBT;
    const int kb = min(BT_KBT, k - (int)jb);
    const u32 T = 1u << tile_bits;
    const u32 s0 = chunk_seg[q], ns = chunk_seg[q + 1] - s0;
    bt_stage(ys, ns * (u32)kb, [&](u32 i) {
        const int j = (int)(jb + i % (u32)kb);
        return scaled(y, (u64)seg_row[s0 + i / (u32)kb] * k + j, yp, j);
    });
    __syncthreads();
    const u64 col0 = (u64)q << tile_bits;  // this chunk's first place in colptr and cpart
    int gw, groups, grp, j;
    bt_lanes(kb, threadIdx.x & 31, &gw, &groups, &grp, &j);
    if (grp >= groups) return;  // no barrier follows
    const u32 ng = (blockDim.x >> 5) * groups;
    for (u32 c = (threadIdx.x >> 5) * groups + grp; c < T; c += ng) {
        const u64 e0 = colptr[col0 + c], e1 = colptr[col0 + c + 1];
        double acc = 0.0;
#pragma unroll 4
        for (u64 e = e0; e < e1; ++e) acc += (double)val[e] * ys[(u32)lseg[e] * (u32)kb + (u32)j];
        cpart[(col0 + c) * k + jb + j] = acc;
    }
}

#define BT_ATU(SUF, V)                                                                          \
    extern "C" __global__ void __launch_bounds__(BT_TILE_THREADS, 3)                            \
        bt_atu_##SUF(int k, u32 tile_bits, const u32* chunk_seg, const u32* seg_row,            \
                     const u64* colptr, const u16* lseg, const V* val, const double* y,         \
                     const double* yp, double* cpart) {                                          \
        bt_atu_impl<V>(k, tile_bits, chunk_seg, seg_row, colptr, lseg, val, y, yp, cpart);      \
    }
BT_ATU(f64, double)
BT_ATU(f32, float)

#define BT_COLS(SUF, F32)                                                                       \
    extern "C" __global__ void __launch_bounds__(256)                                           \
        bt_cols_##SUF(u32 ncols, int k, u32 tile_bits, const u32* tile_chunk,                   \
                      const double* cpart, const u64* rptr, const u32* rcols,                    \
                      const double* rvals, const double* y, const double* yp, double* x,         \
                      const double* xp, double alpha, const double* beta, const double* w) {     \
        const BtTail t = {rptr, rcols, rvals, y, yp, x, xp, alpha, beta, w};                     \
        const u32 mask = (1u << tile_bits) - 1;                                                  \
        bt_second<F32>(ncols, k, t, [&](u32 c, int j) {                                          \
            const u32 tile = c >> tile_bits;                                                     \
            const u64 cc = c & mask;                                                             \
            double acc = 0.0;                                                                    \
            for (u32 q = tile_chunk[tile]; q < tile_chunk[tile + 1]; ++q)                        \
                acc += cpart[(((u64)q << tile_bits) + cc) * k + j];                              \
            return acc;                                                                          \
        });                                                                                      \
    }
BT_COLS(f64, false)
BT_COLS(f32, true)
