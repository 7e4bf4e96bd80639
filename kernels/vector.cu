// Vector kernels of seistomo's CUDA backend: element-wise updates and deterministic
// reductions. A reduction runs in ONE launch: each block writes its partial sum, and the last
// block to finish (ticket counter) adds the partials in block order and writes the result to a
// device scalar; the grid size depends only on n, so the sum is the same on every run.

#define RED_THREADS 256

// The grid-stride loop of the reductions (blocks of RED_THREADS threads).
#define RED_STRIDE(n)                                                                           \
    for (unsigned long long i = blockIdx.x * (unsigned long long)RED_THREADS + threadIdx.x;   \
         i < (n); i += (unsigned long long)gridDim.x * RED_THREADS)

__device__ __forceinline__ double block_sum(double v, double* sh) {
    v = warp_sum(v);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) sh[w] = v;
    __syncthreads();
    double t = 0.0;
    if (threadIdx.x == 0)
        for (int i = 0; i < RED_THREADS / 32; ++i) t += sh[i];
    __syncthreads();
    return t;  // valid in thread 0
}

// Whether this block is the last of the grid to get here (ticket counter), called by every
// thread after thread 0 wrote the block's partials; the last block then sees every partial.
__device__ __forceinline__ bool last_block(unsigned* counter) {
    __shared__ bool last;
    if (threadIdx.x == 0) {
        __threadfence();
        const unsigned ticket = atomicAdd(counter, 1u);
        last = (ticket == gridDim.x - 1);
    }
    __syncthreads();
    if (!last) return false;
    __threadfence();
    return true;
}

// Sum of the blocks' partials into *out; resets *counter for the next launch.
__device__ __forceinline__ void finish_reduction(double v, double* partial, unsigned* counter,
                                                 double* out) {
    __shared__ double sh[RED_THREADS / 32];
    const double t = block_sum(v, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = t;
    if (!last_block(counter)) return;
    double s = 0.0;
    for (unsigned i = threadIdx.x; i < gridDim.x; i += RED_THREADS) s += __ldcg(&partial[i]);
    const double total = block_sum(s, sh);
    if (threadIdx.x == 0) {
        *out = total;
        *counter = 0u;
    }
}

extern "C" __global__ void __launch_bounds__(RED_THREADS)
dot(const double* __restrict__ x, const double* __restrict__ y, unsigned long long n,
    double* partial, unsigned* counter, double* out) {
    double s = 0.0;
    RED_STRIDE(n) s += x[i] * y[i];
    finish_reduction(s, partial, counter, out);
}

// s = ||inv_rho w||^2 (before the update); x += t1 w; var += (inv_rho w)^2 (var may be null);
// w = v + t2 w.
extern "C" __global__ void __launch_bounds__(RED_THREADS)
lsqr_update(double* __restrict__ x, double* __restrict__ w, const double* __restrict__ v,
            double t1, double t2, double inv_rho, double* __restrict__ var,
            unsigned long long n, double* partial, unsigned* counter, double* out) {
    double s = 0.0;
    RED_STRIDE(n) {
        const double wi = w[i];
        const double dk = inv_rho * wi;
        s += dk * dk;
        x[i] += t1 * wi;
        if (var) var[i] += dk * dk;
        w[i] = v[i] + t2 * wi;
    }
    finish_reduction(s, partial, counter, out);
}

#define GRID_STRIDE(n) \
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; \
         i < (n); i += (unsigned long long)gridDim.x * blockDim.x)

// y = a x + b y
extern "C" __global__ void axpby(unsigned long long n, double a, const double* __restrict__ x,
                                 double b, double* __restrict__ y) {
    GRID_STRIDE(n) y[i] = a * x[i] + b * y[i];
}
// y = a x
extern "C" __global__ void copy_scaled(unsigned long long n, double a, const double* __restrict__ x,
                                       double* __restrict__ y) {
    GRID_STRIDE(n) y[i] = a * x[i];
}
// x = a x
extern "C" __global__ void scale(unsigned long long n, double a, double* __restrict__ x) {
    GRID_STRIDE(n) x[i] *= a;
}
// x = value
extern "C" __global__ void fill(unsigned long long n, double value, double* __restrict__ x) {
    GRID_STRIDE(n) x[i] = value;
}
// z = x .* y
extern "C" __global__ void pmul(unsigned long long n, const double* __restrict__ x,
                                const double* __restrict__ y, double* __restrict__ z) {
    GRID_STRIDE(n) z[i] = x[i] * y[i];
}

// ---- GMRES: batched Gram-Schmidt kernels and ILU(0) Jacobi sweeps ----
// Up to MULTI_MAX basis vectors per launch, passed by value (pointers and coefficients live in
// the kernel's parameter space: no pointer table to upload).
#define MULTI_MAX 32
struct VecPtrs {
    const double* p[MULTI_MAX];
};
struct Coefs {
    double c[MULTI_MAX];
};

// Coefficients come by value in `c`, or from device memory at `cdev` when it is not null (the
// scalars of GMRES's device-resident Arnoldi cycle, src/solver/gmres.rs): the same values, so
// the same arithmetic.
// mode 0: out[j] = V_j . w                     (k outputs)
// mode 1: w -= sum_j c_j V_j; out[j] = V_j . w (k outputs; CGS2's update fused with its 2nd pass)
// mode 2: w -= sum_j c_j V_j; out[0] = w . w   (1 output)
// The update subtracts c_0 V_0 first, then c_1 V_1, ... (the CPU backend's order, bit for bit
// without FMA contraction). Partial sums: partial[j * gridDim.x + block]; the last block adds
// them in block order (deterministic, as `dot`).
//
// One kernel per capacity K (1, 2, 4, 8, 16, 32 vectors; k <= K): each thread keeps K sums and K
// loaded values in registers, so a launch for a few vectors is not held to the occupancy of 32
// (with one 32-wide kernel, 2 vectors over 2.1M rows took 98 us, 0.9 TB/s, on an H100). The
// arithmetic is the same for every K: results do not depend on which kernel ran.
template <int K>
__device__ __forceinline__ void multi_dot_k(const VecPtrs& V, int k, const Coefs& c,
                                            const double* __restrict__ cdev, int mode,
                                            double* __restrict__ w, unsigned long long n,
                                            double* partial, unsigned* counter, double* out) {
    double s[K], cc[K];
#pragma unroll
    for (int j = 0; j < K; ++j) {
        s[j] = 0.0;
        cc[j] = (mode != 0 && j < k) ? (cdev ? cdev[j] : c.c[j]) : 0.0;
    }
    RED_STRIDE(n) {
        double v[K];
#pragma unroll
        for (int j = 0; j < K; ++j)
            if (j < k) v[j] = V.p[j][i];
        double wi = w[i];
        if (mode != 0) {
#pragma unroll
            for (int j = 0; j < K; ++j)
                if (j < k) wi = wi - cc[j] * v[j];
            w[i] = wi;
        }
        if (mode == 2) {
            s[0] += wi * wi;
        } else {
#pragma unroll
            for (int j = 0; j < K; ++j)
                if (j < k) s[j] += v[j] * wi;
        }
    }
    const int nout = (mode == 2) ? 1 : k;
    __shared__ double sh[RED_THREADS / 32];
    // The block's partial of every output with ONE barrier: each warp reduces its K sums by
    // shuffle trees and leaves them in shared memory, then thread j adds output j's warp sums
    // in warp order (the same tree for every output as block_sum's).
    __shared__ double shk[RED_THREADS / 32][K];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
#pragma unroll
    for (int j = 0; j < K; ++j) {
        if (j < nout) {
            const double t = warp_sum(s[j]);
            if (lane == 0) shk[wid][j] = t;
        }
    }
    __syncthreads();
    if (threadIdx.x < (unsigned)nout) {
        double t = 0.0;
        for (int w = 0; w < RED_THREADS / 32; ++w) t += shk[w][threadIdx.x];
        partial[(unsigned long long)threadIdx.x * gridDim.x + blockIdx.x] = t;
        __threadfence();  // visible to the last block before this block takes its ticket
    }
    __syncthreads();
    if (!last_block(counter)) return;
    if (nout == 1) {
        double t = 0.0;
        for (unsigned b = threadIdx.x; b < gridDim.x; b += RED_THREADS) t += __ldcg(&partial[b]);
        const double total = block_sum(t, sh);
        if (threadIdx.x == 0) out[0] = total;
    } else {
        // A warp per output (the outputs in parallel, not one after another while the rest of
        // the GPU waits): lane l adds partials l, l + 32, ... in order, then the warp's tree.
        for (int j = wid; j < nout; j += RED_THREADS / 32) {
            const double* pj = partial + (unsigned long long)j * gridDim.x;
            double t = 0.0;
#pragma unroll 8
            for (unsigned b = lane; b < gridDim.x; b += 32) t += __ldcg(&pj[b]);
            t = warp_sum(t);
            if (lane == 0) out[j] = t;
        }
    }
    if (threadIdx.x == 0) *counter = 0u;
}

#define MULTI_DOT(K)                                                                          \
    extern "C" __global__ void __launch_bounds__(RED_THREADS)                                 \
    multi_dot_##K(VecPtrs V, int k, Coefs c, const double* cdev, int mode,                   \
                  double* __restrict__ w, unsigned long long n, double* partial,               \
                  unsigned* counter, double* out) {                                           \
        multi_dot_k<K>(V, k, c, cdev, mode, w, n, partial, counter, out);                     \
    }
MULTI_DOT(1)
MULTI_DOT(2)
MULTI_DOT(4)
MULTI_DOT(8)
MULTI_DOT(16)
MULTI_DOT(32)

// w -= sum_j c_j V_j (in j order), no reduction; c from `cdev` when it is not null.
extern "C" __global__ void multi_axpy(VecPtrs V, int k, Coefs c, const double* __restrict__ cdev,
                                      double* __restrict__ w, unsigned long long n) {
    double cc[MULTI_MAX];
#pragma unroll
    for (int j = 0; j < MULTI_MAX; ++j) cc[j] = j < k ? (cdev ? cdev[j] : c.c[j]) : 0.0;
    GRID_STRIDE(n) {
        double wi = w[i];
#pragma unroll
        for (int j = 0; j < MULTI_MAX; ++j)
            if (j < k) wi = wi - cc[j] * V.p[j][i];
        w[i] = wi;
    }
}

// y = a x with a = 1 / sqrt(max(*nsq, 0)) computed here from a device scalar (GMRES's new basis
// vector normalised by the norm its reduction left on the device): IEEE division and square
// root, so a is the host's 1.0 / nsq.max(0.0).sqrt() bit for bit.
extern "C" __global__ void copy_inv_sqrt(unsigned long long n, const double* __restrict__ nsq,
                                         const double* __restrict__ x, double* __restrict__ y) {
    const double a = 1.0 / sqrt(fmax(*nsq, 0.0));
    GRID_STRIDE(n) y[i] = a * x[i];
}

// One Jacobi sweep on a triangular factor stored without its diagonal, a thread per row:
// out[i] = (rhs[i] - sum_p val[p] x[col[p]]) * (dinv ? dinv[i] : 1), summed in row order (the
// CPU's order: bitwise equal without FMA contraction).
extern "C" __global__ void tri_sweep(unsigned long long n, const unsigned long long* __restrict__ ptr,
                                     const unsigned* __restrict__ col,
                                     const double* __restrict__ val,
                                     const double* __restrict__ rhs, const double* __restrict__ x,
                                     const double* __restrict__ dinv, double* __restrict__ out) {
    GRID_STRIDE(n) {
        double s = rhs[i];
        for (unsigned long long p = ptr[i]; p < ptr[i + 1]; ++p) s -= val[p] * x[col[p]];
        out[i] = dinv ? s * dinv[i] : s;
    }
}

// y[idx[k]] = a t[k] + b y[idx[k]] (b == 0: y is not read): the rows of a split product put
// back in place, with the same expression as the SpMV kernels' epilogue.
extern "C" __global__ void scatter_rows(unsigned long long n, const unsigned* __restrict__ idx,
                                        const double* __restrict__ t, double* __restrict__ y,
                                        double a, double b) {
    GRID_STRIDE(n) {
        const unsigned r = idx[i];
        y[r] = (b == 0.0) ? a * t[i] : a * t[i] + b * y[r];
    }
}

// out[k] = x[idx[k]] (the halo's send buffer).
extern "C" __global__ void gather(unsigned long long n, const unsigned* __restrict__ idx,
                                  const double* __restrict__ x, double* __restrict__ out) {
    GRID_STRIDE(n) out[i] = x[idx[i]];
}
