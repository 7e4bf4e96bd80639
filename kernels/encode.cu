// The split layout's column tiles encoded on the GPU from CSR rows already on the device
// (src/backend/cuda/encode.rs drives these kernels; src/sparse/tiled.rs is the CPU encoder and
// the reference: the arrays made here are the same, element for element).
//
//   enc_seg_count  warp per row: the segments of each row (one per tile it touches)
//   enc_seg_fill   warp per row: each segment's tile, row and first CSR entry (row order)
//   enc_seg_len    thread per segment: its length
//   rs_hist,       a stable least-significant-digit radix sort of u32 keys with u32 payloads,
//   rs_scatter     8 bits a pass: per-block digit counts, their exclusive scan (scan_*), then
//                  each block puts its keys in order (ranks within a warp by __match_any_sync,
//                  warps and rounds in order: the sort is stable and deterministic)
//   scan_local,    exclusive scan of u32 counts into u64 offsets: per-block scans here, the
//   scan_add       blocks' totals scanned on the host, added back
//   bounds_sorted  the first position of each key value in a sorted key array (offsets
//                  without atomics)
//   enc_gather_*   dst[i] = src[idx[i]] (u32; u64 and f64 as 8-byte words)
//   enc_seg_pos    pos[slot[s]] = s
//   enc_fill_rows  warp per segment: row entries (column in tile, end bit; value)
//   enc_col_keys   warp per segment: each entry's (chunk, column in tile) key, its segment
//                  within the chunk, its CSR entry
//   enc_fill_cols  thread per entry of the sorted column keys: segment in chunk, value
//
// Counts and positions of a sort or gather are 32-bit: the driver encodes on the GPU only
// where a rank's nonzeros, segments and (chunk, column) pairs stay below 2^32.

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;

#define ENC_WARPS 8                 // warps per block of the warp-per-item kernels
#define ENC_LCOL_END 0x8000u        // src/sparse/tiled.rs LCOL_END
#define ENC_CHUNK_SEGS 2048u        // src/sparse/tiled.rs CHUNK_SEGS
#define RS_THREADS 256
#define RS_ITEMS 8
#define RS_TILE (RS_THREADS * RS_ITEMS)  // keys per block (src/backend/cuda/encode.rs RS_TILE)
#define RS_RADIX 256
#define SC_THREADS 1024
#define SC_ITEMS 4
#define SC_TILE (SC_THREADS * SC_ITEMS)  // counts per block (src/backend/cuda/encode.rs SC_TILE)

__device__ __forceinline__ u32 enc_lane() { return threadIdx.x & 31u; }
__device__ __forceinline__ u64 enc_warp() {
    return (u64)blockIdx.x * ENC_WARPS + (threadIdx.x >> 5);
}

// Does entry j of a row starting at s open a segment (the first entry, or a new tile)?
__device__ __forceinline__ bool enc_opens(const u32* __restrict__ ci, u64 s, u64 j, u32 bits) {
    return j == s || (ci[j] >> bits) != (ci[j - 1] >> bits);
}

extern "C" __global__ void enc_seg_count(u32 m, const u64* __restrict__ ip,
                                         const u32* __restrict__ ci, u32 bits,
                                         u32* __restrict__ count) {
    const u64 r = enc_warp();
    if (r >= m) return;
    const u64 s = ip[r], e = ip[r + 1];
    u32 k = 0;
    for (u64 j0 = s; j0 < e; j0 += 32) {
        const u64 j = j0 + enc_lane();
        const bool open = j < e && enc_opens(ci, s, j, bits);
        k += __popc(__ballot_sync(0xffffffffu, open));
    }
    if (enc_lane() == 0) count[r] = k;
}

extern "C" __global__ void enc_seg_fill(u32 m, const u64* __restrict__ ip,
                                        const u32* __restrict__ ci, u32 bits,
                                        const u64* __restrict__ row_seg, u32* __restrict__ tile,
                                        u32* __restrict__ row, u64* __restrict__ start) {
    const u64 r = enc_warp();
    if (r >= m) return;
    const u64 s = ip[r], e = ip[r + 1];
    u64 k = row_seg[r];
    const u32 lt = (1u << enc_lane()) - 1u;
    for (u64 j0 = s; j0 < e; j0 += 32) {
        const u64 j = j0 + enc_lane();
        const bool open = j < e && enc_opens(ci, s, j, bits);
        const u32 b = __ballot_sync(0xffffffffu, open);
        if (open) {
            const u64 q = k + __popc(b & lt);
            tile[q] = ci[j] >> bits;
            row[q] = (u32)r;
            start[q] = j;
        }
        k += __popc(b);
    }
}

extern "C" __global__ void enc_seg_len(u64 nseg, const u64* __restrict__ ip,
                                       const u64* __restrict__ row_seg,
                                       const u32* __restrict__ row, const u64* __restrict__ start,
                                       u32* __restrict__ len) {
    const u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= nseg) return;
    const u32 r = row[k];
    const u64 end = (k + 1 < row_seg[r + 1]) ? start[k + 1] : ip[r + 1];
    len[k] = (u32)(end - start[k]);
}

// counts[d * nblocks + b]: keys of block b whose digit (at `shift`) is d.
extern "C" __global__ void rs_hist(u64 n, const u32* __restrict__ keys, u32 shift, u32 nblocks,
                                   u32* __restrict__ counts) {
    __shared__ u32 h[RS_RADIX];
    for (int d = threadIdx.x; d < RS_RADIX; d += blockDim.x) h[d] = 0;
    __syncthreads();
    const u64 base = (u64)blockIdx.x * RS_TILE;
#pragma unroll
    for (int q = 0; q < RS_ITEMS; ++q) {
        const u64 i = base + (u64)q * RS_THREADS + threadIdx.x;
        if (i < n) atomicAdd(&h[(keys[i] >> shift) & (RS_RADIX - 1)], 1u);
    }
    __syncthreads();
    for (int d = threadIdx.x; d < RS_RADIX; d += blockDim.x)
        counts[(u64)d * nblocks + blockIdx.x] = h[d];
}

// Stable scatter of one pass: block b's keys with digit d go to offs[d * nblocks + b] onwards,
// in their order (rounds of RS_THREADS keys in order, threads in order within a round). `vin`
// null: the payload is the key's position.
extern "C" __global__ void rs_scatter(u64 n, const u32* __restrict__ kin,
                                      const u32* __restrict__ vin, u32* __restrict__ kout,
                                      u32* __restrict__ vout, u32 shift, u32 nblocks,
                                      const u64* __restrict__ offs) {
    __shared__ u32 run[RS_RADIX];
    __shared__ u32 wc[RS_THREADS / 32][RS_RADIX];
    const int t = threadIdx.x, w = t >> 5;
    const u32 lane = enc_lane(), lt = (1u << lane) - 1u;
    for (int d = t; d < RS_RADIX; d += RS_THREADS)
        run[d] = (u32)offs[(u64)d * nblocks + blockIdx.x];
    const u64 base = (u64)blockIdx.x * RS_TILE;
    for (int q = 0; q < RS_ITEMS; ++q) {
        for (int z = t; z < (RS_THREADS / 32) * RS_RADIX; z += RS_THREADS) (&wc[0][0])[z] = 0;
        __syncthreads();
        const u64 i = base + (u64)q * RS_THREADS + t;
        const bool in = i < n;
        const u32 key = in ? kin[i] : 0u;
        const u32 d = (key >> shift) & (RS_RADIX - 1);
        // lanes past the end each match only themselves
        const u32 peers = __match_any_sync(0xffffffffu, in ? d : RS_RADIX + lane);
        if (in && (peers & lt) == 0) wc[w][d] = __popc(peers);
        __syncthreads();
        if (in) {
            u32 pos = run[d] + __popc(peers & lt);
            for (int v = 0; v < w; ++v) pos += wc[v][d];
            kout[pos] = key;
            vout[pos] = vin ? vin[i] : (u32)i;
        }
        __syncthreads();
        for (int dd = t; dd < RS_RADIX; dd += RS_THREADS) {
            u32 add = 0;
            for (int v = 0; v < RS_THREADS / 32; ++v) add += wc[v][dd];
            run[dd] += add;
        }
        __syncthreads();
    }
}

// Exclusive scan of in[0..n) within blocks of SC_TILE: out[i] = sum of the block's in before i;
// bsum[b] = the block's total.
extern "C" __global__ void scan_local(u64 n, const u32* __restrict__ in, u64* __restrict__ out,
                                      u64* __restrict__ bsum) {
    __shared__ u64 wsum[SC_THREADS / 32];
    const u64 base = (u64)blockIdx.x * SC_TILE + (u64)threadIdx.x * SC_ITEMS;
    u64 v[SC_ITEMS];
    u64 mine = 0;
#pragma unroll
    for (int q = 0; q < SC_ITEMS; ++q) {
        v[q] = (base + q < n) ? (u64)in[base + q] : 0ull;
        mine += v[q];
    }
    // inclusive scan of the threads' sums within the warp, then over the warps
    const u32 lane = enc_lane();
    const int w = threadIdx.x >> 5;
    u64 inc = mine;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u64 y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= (u32)o) inc += y;
    }
    if (lane == 31) wsum[w] = inc;
    __syncthreads();
    if (w == 0) {
        u64 s = lane < SC_THREADS / 32 ? wsum[lane] : 0ull;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const u64 y = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= (u32)o) s += y;
        }
        if (lane < SC_THREADS / 32) wsum[lane] = s;  // inclusive over warps
    }
    __syncthreads();
    u64 acc = inc - mine + (w > 0 ? wsum[w - 1] : 0ull);
#pragma unroll
    for (int q = 0; q < SC_ITEMS; ++q) {
        if (base + q < n) out[base + q] = acc;
        acc += v[q];
    }
    if (threadIdx.x == SC_THREADS - 1) bsum[blockIdx.x] = wsum[SC_THREADS / 32 - 1];
}

// out[i] += boff[i / SC_TILE] (the blocks' exclusive offsets); out[n] = total.
extern "C" __global__ void scan_add(u64 n, u64* __restrict__ out, const u64* __restrict__ boff,
                                    u64 total) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] += boff[i / SC_TILE];
    if (i == n) out[n] = total;
}

// out[b] = the first position of a key >= b in keys[0..n) (ascending, every key < nbins), for
// b in 0..=nbins: thread o writes the bins from keys[o-1] + 1 to keys[o], thread n the rest.
extern "C" __global__ void bounds_sorted(u64 n, const u32* __restrict__ keys, u64 nbins,
                                         u64* __restrict__ out) {
    const u64 o = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (o > n) return;
    const u64 lo = o == 0 ? 0ull : (u64)keys[o - 1] + 1;
    const u64 hi = o == n ? nbins : (u64)keys[o];
    for (u64 b = lo; b <= hi; ++b) out[b] = o;
}

extern "C" __global__ void enc_gather_u32(u64 n, const u32* __restrict__ src,
                                          const u32* __restrict__ idx, u32* __restrict__ dst) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[idx[i]];
}

// (also f64 values, moved as their bits)
extern "C" __global__ void enc_gather_u64(u64 n, const u64* __restrict__ src,
                                          const u32* __restrict__ idx, u64* __restrict__ dst) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[idx[i]];
}

extern "C" __global__ void enc_seg_pos(u64 nseg, const u32* __restrict__ slot,
                                       u32* __restrict__ pos) {
    const u64 s = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (s < nseg) pos[slot[s]] = (u32)s;
}

// Row entries of segment s (tile order): its CSR entries from start[s], at seg_ent[s] on.
template <typename V>
__device__ __forceinline__ void enc_fill_rows_impl(u64 nseg, const u64* __restrict__ start,
                                                   const u64* __restrict__ seg_ent,
                                                   const u32* __restrict__ ci,
                                                   const double* __restrict__ val, u32 bits,
                                                   u16* __restrict__ lcol, V* __restrict__ out) {
    const u64 s = enc_warp();
    if (s >= nseg) return;
    const u64 e0 = seg_ent[s], len = seg_ent[s + 1] - e0, j0 = start[s];
    const u32 mask = (1u << bits) - 1u;
    for (u64 k = enc_lane(); k < len; k += 32) {
        const u32 c = ci[j0 + k] & mask;
        lcol[e0 + k] = (u16)(k + 1 == len ? (c | ENC_LCOL_END) : c);
        out[e0 + k] = (V)val[j0 + k];
    }
}

extern "C" __global__ void enc_fill_rows_f64(u64 nseg, const u64* start, const u64* seg_ent,
                                             const u32* ci, const double* val, u32 bits,
                                             u16* lcol, double* out) {
    enc_fill_rows_impl<double>(nseg, start, seg_ent, ci, val, bits, lcol, out);
}
extern "C" __global__ void enc_fill_rows_f32(u64 nseg, const u64* start, const u64* seg_ent,
                                             const u32* ci, const double* val, u32 bits,
                                             u16* lcol, float* out) {
    enc_fill_rows_impl<float>(nseg, start, seg_ent, ci, val, bits, lcol, out);
}

// For each entry of segment s (tile order; `tile` its tile, the tile's segments from
// tile_seg[t] cut into chunks of ENC_CHUNK_SEGS from tile_chunk[t]): key (chunk << bits) |
// column in tile, the segment within the chunk, the CSR entry.
extern "C" __global__ void enc_col_keys(u64 nseg, const u32* __restrict__ tile,
                                        const u64* __restrict__ tile_seg,
                                        const u32* __restrict__ tile_chunk,
                                        const u64* __restrict__ start,
                                        const u64* __restrict__ seg_ent,
                                        const u32* __restrict__ ci, u32 bits,
                                        u32* __restrict__ key, u16* __restrict__ lseg,
                                        u32* __restrict__ ent) {
    const u64 s = enc_warp();
    if (s >= nseg) return;
    const u32 t = tile[s];
    const u64 in_tile = s - tile_seg[t];
    const u32 q = tile_chunk[t] + (u32)(in_tile / ENC_CHUNK_SEGS);
    const u16 ls = (u16)(in_tile % ENC_CHUNK_SEGS);
    const u64 e0 = seg_ent[s], len = seg_ent[s + 1] - e0, j0 = start[s];
    const u32 mask = (1u << bits) - 1u;
    for (u64 k = enc_lane(); k < len; k += 32) {
        key[e0 + k] = (q << bits) | (ci[j0 + k] & mask);
        lseg[e0 + k] = ls;
        ent[e0 + k] = (u32)(j0 + k);
    }
}

// Column entries: sorted position o holds tile-order entry p = order[o].
template <typename V>
__device__ __forceinline__ void enc_fill_cols_impl(u64 nnz, const u32* __restrict__ order,
                                                   const u16* __restrict__ lseg_t,
                                                   const u32* __restrict__ ent,
                                                   const double* __restrict__ val,
                                                   u16* __restrict__ lseg, V* __restrict__ out) {
    const u64 o = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= nnz) return;
    const u32 p = order[o];
    lseg[o] = lseg_t[p];
    out[o] = (V)val[ent[p]];
}

extern "C" __global__ void enc_fill_cols_f64(u64 nnz, const u32* order, const u16* lseg_t,
                                             const u32* ent, const double* val, u16* lseg,
                                             double* out) {
    enc_fill_cols_impl<double>(nnz, order, lseg_t, ent, val, lseg, out);
}
extern "C" __global__ void enc_fill_cols_f32(u64 nnz, const u32* order, const u16* lseg_t,
                                             const u32* ent, const double* val, u16* lseg,
                                             float* out) {
    enc_fill_cols_impl<float>(nnz, order, lseg_t, ent, val, lseg, out);
}

// The reordering of the rows (src/grid/reorder.rs) on the GPU, before the encoding: each entry's
// new row and new column as sort keys (a stable sort by column, then by row, gives the rows in
// their new order with their columns ascending), then the entries gathered in that order.
//   perm_entry_rows  warp per row: new_row[r] for each of row r's entries
//   perm_col_keys    thread per entry: new_col[ci[j]]
extern "C" __global__ void perm_entry_rows(u32 m, const u64* __restrict__ ip,
                                           const u32* __restrict__ new_row,
                                           u32* __restrict__ out) {
    const u64 r = enc_warp();
    if (r >= m) return;
    const u32 nr = new_row[r];
    for (u64 j = ip[r] + enc_lane(); j < ip[r + 1]; j += 32) out[j] = nr;
}

extern "C" __global__ void perm_col_keys(u64 nnz, const u32* __restrict__ ci,
                                         const u32* __restrict__ new_col, u32* __restrict__ out) {
    const u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (j < nnz) out[j] = new_col[ci[j]];
}
