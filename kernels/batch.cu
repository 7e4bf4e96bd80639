// Blocks of k vectors for batched LSQR (src/backend/cuda/block.rs): `rows x k` values,
// row-major, entry (i, j) of member j at i * k + j, so the k values one matrix entry
// multiplies lie side by side and one pass over the matrix serves every member.
//
// The element-wise and reduction kernels run in blocks of a multiple of k threads
// (block.rs `block_threads`), so over the whole grid-stride loop thread t works on column
// t % k only; the coefficients of member j (scale factors, betas, the update's steps) come from
// a small device array of k values.

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

// partial[b * k + j] = this block's sum of (f[j] x_ij)^2 (f null: of x_ij^2); n = rows * k.
extern "C" __global__ void block_norms(unsigned long long n, int k, const double* __restrict__ x,
                                       const double* __restrict__ f, double* partial) {
    extern __shared__ double sh[];
    const int j = threadIdx.x % k;
    double s = 0.0;
    if (f) {
        const double fj = f[j];
        BLOCK_STRIDE(n) {
            const double v = x[i] * fj;
            s += v * v;
        }
    } else {
        BLOCK_STRIDE(n) s += x[i] * x[i];
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

// y_ij = a x_ij + b[j] y_ij
extern "C" __global__ void block_axpby(unsigned long long n, int k, double a,
                                       const double* __restrict__ x, const double* __restrict__ b,
                                       double* __restrict__ y) {
    const double bj = b[threadIdx.x % k];
    BLOCK_STRIDE(n) y[i] = a * x[i] + bj * y[i];
}

// LSQR's update of every member (vector.cu's lsqr_update column by column): with
// c = [t1 (k), t2 (k), inv_rho (k)], partial (per block and column) = ||inv_rho w||^2 of the old
// w; x += t1 w; var += (inv_rho w)^2 (var may be null); w = v + t2 w.
extern "C" __global__ void block_update(unsigned long long n, int k, double* __restrict__ x,
                                        double* __restrict__ w, const double* __restrict__ v,
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
        w[i] = v[i] + t2 * wi;
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

// The block product of a matrix in two parts that share its rows: G (values of type T, taken
// as they are) and R (f64 values, member j's entries times w[j]; rptr null: no R), each in CSR
// (u64 offsets, u32 columns). Y_j = alpha (G + w_j R) X_j + beta[j] Y_j, Y_j not read where
// beta[j] == 0. With F32, R's weighted entry is rounded to f32 as a single solve of member j
// stores it (a w_j, then f32), so a member's numbers are those of its f32 solve.
//
// The rows come from a list (`list`; null: rows 0..nlist), in the matrix's order, the grid's
// warps (or lane groups) on neighbouring rows at once: rows in that order (reordered for
// locality) share most of their columns, so the X rows they gather stay in L2 while the grid
// sweeps over them (measured: giving each kernel block a contiguous piece of the rows instead
// made A X 30-60 % slower on the 101M-nonzero system, k = 8 and 16).

struct Parts {
    const unsigned long long* gptr;
    const unsigned* gcols;
    const void* gvals;
    const unsigned long long* rptr;
    const unsigned* rcols;
    const double* rvals;
};

// Row `row`'s sum for member j over entries p0, p0 + step, ... of both parts.
template <typename T, bool F32>
__device__ __forceinline__ double row_sum(const Parts& a, unsigned row, int k, int j, unsigned p0,
                                          unsigned step, const double* __restrict__ x,
                                          const double* __restrict__ w) {
    const T* __restrict__ gv = (const T*)a.gvals;
    const unsigned long long gs = a.gptr[row], ge = a.gptr[row + 1];
    double acc = 0.0;
#pragma unroll 4
    for (unsigned long long p = gs + p0; p < ge; p += step)
        acc += (double)gv[p] * __ldg(&x[(unsigned long long)a.gcols[p] * k + j]);
    if (a.rptr) {
        const unsigned long long rs = a.rptr[row], re = a.rptr[row + 1];
        if (re > rs) {
            const double wj = w[j];
            for (unsigned long long p = rs + p0; p < re; p += step) {
                double v = a.rvals[p] * wj;
                if (F32) v = (double)(float)v;
                acc += v * __ldg(&x[(unsigned long long)a.rcols[p] * k + j]);
            }
        }
    }
    return acc;
}

__device__ __forceinline__ void put(double* __restrict__ y, unsigned row, int k, int j,
                                    double alpha, double acc, const double* __restrict__ beta) {
    const unsigned long long e = (unsigned long long)row * k + j;
    const double b = beta[j];
    y[e] = b == 0.0 ? alpha * acc : alpha * acc + b * y[e];
}

// Long rows: one warp a row; per chunk of up to 32 members, kw lanes (one member each) per
// entry and 32 / kw entries at once (the slots), the slots' sums added by shuffles.
template <typename T, bool F32>
__device__ __forceinline__ void spmm_long(unsigned nlist, const unsigned* __restrict__ list,
                                          int k, const Parts& a, const double* __restrict__ x,
                                          double* __restrict__ y, double alpha,
                                          const double* __restrict__ beta,
                                          const double* __restrict__ w) {
    const int lane = threadIdx.x & 31;
    const unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const unsigned nwarps = (gridDim.x * blockDim.x) >> 5;
    for (unsigned i = warp; i < nlist; i += nwarps) {
        const unsigned row = list ? list[i] : i;
        for (int j0 = 0; j0 < k; j0 += 32) {
            const int kw = min(32, k - j0);
            const int slots = 32 / kw;
            const int slot = lane / kw;
            const int j = j0 + lane % kw;
            const bool active = slot < slots;
            double acc = 0.0;
            if (active) acc = row_sum<T, F32>(a, row, k, j, slot, slots, x, w);
            for (int off = 1; off < slots; off <<= 1) {
                const double o = __shfl_down_sync(0xffffffffu, acc, off * kw);
                if ((slot % (2 * off)) == 0 && slot + off < slots) acc += o;
            }
            if (active && slot == 0) put(y, row, k, j, alpha, acc, beta);
        }
    }
}

// Short rows: a group of gw lanes (a power of two, one member each) a row, 32 / gw rows per
// warp; each lane sums its member over the row's entries in order.
template <typename T, bool F32>
__device__ __forceinline__ void spmm_short(unsigned nlist, const unsigned* __restrict__ list,
                                           int k, int gw, const Parts& a,
                                           const double* __restrict__ x, double* __restrict__ y,
                                           double alpha, const double* __restrict__ beta,
                                           const double* __restrict__ w) {
    const unsigned t = blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned groups = gridDim.x * blockDim.x / gw, g = t / gw;
    const int jl = threadIdx.x % gw;
    for (unsigned i = g; i < nlist; i += groups) {
        const unsigned row = list ? list[i] : i;
        for (int j = jl; j < k; j += gw)
            put(y, row, k, j, alpha, row_sum<T, F32>(a, row, k, j, 0, 1, x, w), beta);
    }
}

#define BLOCK_SPMM(name, T, F32)                                                               \
    extern "C" __global__ void name(unsigned nlist, const unsigned* list, int k, int gw,      \
                                    const unsigned long long* gptr, const unsigned* gcols,     \
                                    const T* gvals, const unsigned long long* rptr,            \
                                    const unsigned* rcols, const double* rvals,                \
                                    const double* x, double* y, double alpha,                  \
                                    const double* beta, const double* w) {                     \
        const Parts a = {gptr, gcols, gvals, rptr, rcols, rvals};                              \
        if (gw >= 32)                                                                          \
            spmm_long<T, F32>(nlist, list, k, a, x, y, alpha, beta, w);                        \
        else                                                                                   \
            spmm_short<T, F32>(nlist, list, k, gw, a, x, y, alpha, beta, w);                   \
    }

BLOCK_SPMM(block_spmm_f64, double, false)
BLOCK_SPMM(block_spmm_f32, float, true)
