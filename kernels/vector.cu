// Vector kernels of seistomo's CUDA backend: element-wise updates and deterministic
// reductions. A reduction runs in ONE launch: each block writes its partial sum, and the last
// block to finish (ticket counter) adds the partials in block order and writes the result to a
// device scalar; the grid size depends only on n, so the sum is the same on every run.

#define RED_THREADS 256

__device__ __forceinline__ double block_sum(double v, double* sh) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) sh[w] = v;
    __syncthreads();
    double t = 0.0;
    if (threadIdx.x == 0)
        for (int i = 0; i < RED_THREADS / 32; ++i) t += sh[i];
    __syncthreads();
    return t;  // valid in thread 0
}

// Sum of the blocks' partials into *out; resets *counter for the next launch.
__device__ __forceinline__ void finish_reduction(double v, double* partial, unsigned* counter,
                                                 double* out) {
    __shared__ double sh[RED_THREADS / 32];
    __shared__ bool last;
    const double t = block_sum(v, sh);
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = t;
        __threadfence();
        const unsigned ticket = atomicAdd(counter, 1u);
        last = (ticket == gridDim.x - 1);
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
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
    for (unsigned long long i = blockIdx.x * (unsigned long long)RED_THREADS + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * RED_THREADS)
        s += x[i] * y[i];
    finish_reduction(s, partial, counter, out);
}

// s = ||inv_rho w||^2 (before the update); x += t1 w; var += (inv_rho w)^2 (var may be null);
// w = v + t2 w.
extern "C" __global__ void __launch_bounds__(RED_THREADS)
lsqr_update(double* __restrict__ x, double* __restrict__ w, const double* __restrict__ v,
            double t1, double t2, double inv_rho, double* __restrict__ var,
            unsigned long long n, double* partial, unsigned* counter, double* out) {
    double s = 0.0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)RED_THREADS + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * RED_THREADS) {
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
