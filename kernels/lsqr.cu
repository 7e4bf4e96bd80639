// A device-resident LSQR iteration (src/backend/cuda/lsqr_loop.rs): the scalars live in device
// memory (LsqrState), so a block of iterations runs as one CUDA graph with no host round trip.
//
// One iteration is: products A v (compact.cu, partial sums of u^2) -> lsqr_step1 -> A^T u
// (partials of v^2) -> lsqr_step2 -> lsqr_update_dev (partials of ||w/rho||^2) -> lsqr_step3.
// The step kernels follow src/solver/lsqr.rs `lsqr_iterate` line by line (SciPy's lsqr),
// compiled without FMA contraction, so the scalar recurrences round as the host's do.
//
// u and v are kept unnormalised: u_true = su * u, v_true = sv * v (su = 1/beta, sv = 1/alpha).
// The scale factors enter the next kernel's coefficients instead of costing a pass over the
// vector; lsqr_normalize makes them true unit vectors at the end of every graph replay (so a
// checkpoint, written between replays, holds what the host loop would hold).

typedef unsigned long long u64;
typedef unsigned int u32;

#define LSQR_REC 8          // doubles per history record
#define LSQR_RECMAX 256     // records kept (index itn % LSQR_RECMAX)

// Layout shared with src/backend/cuda/lsqr_loop.rs DevState.
struct LsqrState {
    double alpha, beta, rhobar, phibar, bnorm, anorm, acond, ddnorm, res2, xnorm, xxnorm, z, cs2,
        sn2, rnorm, r1norm, r2norm, arnorm;
    double su, sv;
    double c_av[2], c_atu[2], c_upd[4];
    double phi, rho, theta, tau, psi;
    double damp, atol, btol, ctol;
    double one_zero[2];  // (1, 0): the epilogue of A^T u on several ranks (t = A^T u)
    double pad;
    long long itn, istop, iter_lim, stop_at;
    int done;      // nonzero: kernels do nothing (1 stopped, 2 paused at stop_at, 3 error)
    int skip_atu;  // nonzero: A^T u and its scalar step are skipped (done, or beta == 0)
    int error;     // 1: beta, 2: alpha, 3: a norm estimate not finite
    int pad2;
};
static_assert(sizeof(LsqrState) == 368, "LsqrState must match src/backend/cuda/lsqr_loop.rs");

#define STEP_THREADS 1024

// Sum of p[0..np) in a fixed order by one block of STEP_THREADS threads (result in thread 0):
// each thread keeps four independent partial sums (so its loads overlap), then a fixed tree.
__device__ double ordered_sum(const double* __restrict__ p, u32 np) {
    __shared__ double sh[STEP_THREADS / 32];
    double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
    u32 i = threadIdx.x;
    for (; i + 3 * STEP_THREADS < np; i += 4 * STEP_THREADS) {
        a0 += p[i];
        a1 += p[i + STEP_THREADS];
        a2 += p[i + 2 * STEP_THREADS];
        a3 += p[i + 3 * STEP_THREADS];
    }
    for (; i < np; i += STEP_THREADS) a0 += p[i];
    double s = (a0 + a1) + (a2 + a3);
    s = warp_sum(s);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = s;
    __syncthreads();
    double t = 0.0;
    if (threadIdx.x == 0)
        for (int w = 0; w < STEP_THREADS / 32; ++w) t += sh[w];
    return t;
}

__device__ __forceinline__ double sgn(double x) { return x > 0.0 ? 1.0 : (x < 0.0 ? -1.0 : 0.0); }

__device__ void sym_ortho(double a, double b, double* c, double* s, double* r) {
    if (b == 0.0) {
        *c = sgn(a);
        *s = 0.0;
        *r = fabs(a);
    } else if (a == 0.0) {
        *c = 0.0;
        *s = sgn(b);
        *r = fabs(b);
    } else if (fabs(b) > fabs(a)) {
        const double tau = a / b;
        *s = sgn(b) / sqrt(1.0 + tau * tau);
        *c = *s * tau;
        *r = b / *s;
    } else {
        const double tau = b / a;
        *c = sgn(a) / sqrt(1.0 + tau * tau);
        *s = *c * tau;
        *r = a / *c;
    }
}

__device__ __forceinline__ void stop_all(LsqrState* st, int how) {
    st->done = how;
    st->skip_atu = 1;
}

// Stop with error `what` (1: beta, 2: alpha, 3: a norm estimate not finite).
__device__ __forceinline__ void stop_error(LsqrState* st, int what) {
    st->error = what;
    stop_all(st, 3);
}

// The frame of a step kernel: every thread takes part in the ordered sum of the partials (SUM);
// then thread 0, unless the loop is done, runs BODY on a register copy `cp` of the state (one
// wide load, one wide store: the scalar chain would otherwise wait on a global load per field)
// and stores it back.
#define SOLVER_STEP(STATE, SUM, BODY)                \
    const double SUM = ordered_sum(partial, np);     \
    if (threadIdx.x != 0 || gst->done) return;       \
    STATE cp = *gst;                                 \
    BODY;                                            \
    *gst = cp;
#define LSQR_STEP(SUM, BODY) SOLVER_STEP(LsqrState, SUM, BODY)

// What LSQR's and LSMR's loops share (their states have these fields): the two halves of a
// Golub-Kahan step with u and v kept unnormalised (u_true = su u, v_true = sv v), SciPy's
// stopping cascade and the history record. Each half returns 0 where a norm is not finite
// (the loop stopped with that error).

// After A v: itn + 1, beta = ||u||, the coefficients of A^T u (skipped where beta == 0).
template <typename S>
__device__ __forceinline__ int bidiag_beta(S* st, double ss) {
    st->itn += 1;
    const double beta = sqrt(ss);
    if (!isfinite(beta)) {
        st->error = 1;
        st->done = 3;
        st->skip_atu = 1;
        return 0;
    }
    st->beta = beta;
    if (beta > 0.0) {
        st->su = 1.0 / beta;
        // v = A^T u_true - beta v_true = su (A^T u) - beta sv v
        st->c_atu[0] = st->su;
        st->c_atu[1] = -(beta * st->sv);
        st->skip_atu = 0;
    } else {
        st->su = 1.0;
        st->skip_atu = 1;
    }
    return 1;
}

// After A^T u (unless skipped): alpha = ||v||.
template <typename S>
__device__ __forceinline__ int bidiag_alpha(S* st, double ss) {
    if (!st->skip_atu) {
        const double alpha = sqrt(ss);
        if (!isfinite(alpha)) {
            st->error = 2;
            st->done = 3;
            st->skip_atu = 1;
            return 0;
        }
        st->alpha = alpha;
        st->sv = alpha > 0.0 ? 1.0 / alpha : 1.0;
    }
    return 1;
}

// SciPy's stopping cascade (src/solver/bidiag.rs istop_of): later tests override earlier ones.
__device__ __forceinline__ long long stop_cascade(double test1, double test2, double test3,
                                                  double t1, double rtol, double atol,
                                                  double ctol, bool at_limit) {
    long long istop = 0;
    if (at_limit) istop = 7;
    if (1.0 + test3 <= 1.0) istop = 6;
    if (1.0 + test2 <= 1.0) istop = 5;
    if (1.0 + t1 <= 1.0) istop = 4;
    if (test3 <= ctol) istop = 3;
    if (test2 <= atol) istop = 2;
    if (test1 <= rtol) istop = 1;
    return istop;
}

// Iteration itn's history record (LSQR's fields).
__device__ __forceinline__ void write_record(double* rec, long long itn, double r1, double r2,
                                             double ar, double an, double ac, double xn) {
    double* r = rec + (itn % LSQR_RECMAX) * LSQR_REC;
    r[0] = (double)itn;
    r[1] = r1;
    r[2] = r2;
    r[3] = ar;
    r[4] = an;
    r[5] = ac;
    r[6] = xn;
    r[7] = 0.0;
}

// u *= su, v *= sv (true unit vectors again); the loop's `rescaled` kernel then resets the
// scales.
template <typename S>
__device__ __forceinline__ void normalize_uv(double* __restrict__ u, u64 m,
                                             double* __restrict__ v, u64 n, const S* st) {
    const double su = st->su, sv = st->sv;
    const u64 stride = (u64)gridDim.x * 256ull;
    if (su != 1.0)
        for (u64 i = blockIdx.x * 256ull + threadIdx.x; i < m; i += stride) u[i] *= su;
    if (sv != 1.0)
        for (u64 i = blockIdx.x * 256ull + threadIdx.x; i < n; i += stride) v[i] *= sv;
}

template <typename S>
__device__ __forceinline__ void rescaled(S* st) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    st->su = 1.0;
    st->sv = 1.0;
    st->c_av[0] = 1.0;
    st->c_av[1] = -st->alpha;
}

// After A v: beta = ||u||; ||A||; the coefficients of A^T u.
__device__ __forceinline__ void step1(LsqrState* st, double ss) {
    if (!bidiag_beta(st, ss) || st->beta == 0.0) return;
    const double dampsq = st->damp * st->damp;
    st->anorm =
        sqrt(st->anorm * st->anorm + st->alpha * st->alpha + st->beta * st->beta + dampsq);
}
extern "C" __global__ void __launch_bounds__(STEP_THREADS)
lsqr_step1(LsqrState* gst, const double* partial, u32 np) {
    LSQR_STEP(ss, step1(&cp, ss))
}

// After A^T u: alpha = ||v||; the two plane rotations; the coefficients of the x/w update.
__device__ __forceinline__ void step2(LsqrState* st, double ss) {
    if (!bidiag_alpha(st, ss)) return;
    const double damp = st->damp, dampsq = damp * damp;
    double rhobar1, psi;
    if (damp > 0.0) {
        rhobar1 = sqrt(st->rhobar * st->rhobar + dampsq);
        const double cs1 = st->rhobar / rhobar1;
        const double sn1 = damp / rhobar1;
        psi = sn1 * st->phibar;
        st->phibar *= cs1;
    } else {
        rhobar1 = st->rhobar;
        psi = 0.0;
    }
    double cs, sn, rho;
    sym_ortho(rhobar1, st->beta, &cs, &sn, &rho);
    const double theta = sn * st->alpha;
    st->rhobar = -cs * st->alpha;
    const double phi = cs * st->phibar;
    st->phibar *= sn;
    const double tau = sn * phi;
    st->phi = phi;
    st->rho = rho;
    st->theta = theta;
    st->tau = tau;
    st->psi = psi;
    st->c_upd[0] = phi / rho;      // t1
    st->c_upd[1] = -theta / rho;   // t2
    st->c_upd[2] = 1.0 / rho;      // inv_rho
    st->c_upd[3] = st->sv;         // v_true = sv v
}
extern "C" __global__ void __launch_bounds__(STEP_THREADS)
lsqr_step2(LsqrState* gst, const double* partial, u32 np) {
    LSQR_STEP(ss, step2(&cp, ss))
}

// s = ||w / rho||^2 (partials per block); x += t1 w; var += (w / rho)^2; w = sv v + t2 w.
extern "C" __global__ void __launch_bounds__(256)
lsqr_update_dev(double* __restrict__ x, double* __restrict__ w, const double* __restrict__ v,
                double* __restrict__ var, u64 n, const LsqrState* __restrict__ st,
                double* __restrict__ partial) {
    if (st->done) return;
    const double t1 = st->c_upd[0], t2 = st->c_upd[1], inv_rho = st->c_upd[2], sv = st->c_upd[3];
    double s = 0.0;
    for (u64 i = blockIdx.x * 256ull + threadIdx.x; i < n; i += (u64)gridDim.x * 256ull) {
        const double wi = w[i];
        const double dk = inv_rho * wi;
        s += dk * dk;
        x[i] += t1 * wi;
        if (var) var[i] += dk * dk;
        w[i] = sv * v[i] + t2 * wi;
    }
    block_partial(s, partial);  // launched with 256 threads: 8 warp sums, in order
}

// After the update: the norm and condition estimates, the stopping tests, the history record,
// and the coefficients of the next A v.
__device__ __forceinline__ void step3(LsqrState* st, double dk2, double* rec) {
    const double eps = 2.220446049250313e-16;
    const double damp = st->damp, dampsq = damp * damp;
    const double rho = st->rho, phi = st->phi, theta = st->theta, psi = st->psi;
    st->ddnorm += dk2;
    const double delta = st->sn2 * rho;
    const double gambar = -st->cs2 * rho;
    const double rhs = phi - delta * st->z;
    const double zbar = rhs / gambar;
    st->xnorm = sqrt(st->xxnorm + zbar * zbar);
    const double gamma = sqrt(gambar * gambar + theta * theta);
    st->cs2 = gambar / gamma;
    st->sn2 = theta / gamma;
    st->z = rhs / gamma;
    st->xxnorm += st->z * st->z;
    st->acond = st->anorm * sqrt(st->ddnorm);
    const double res1 = st->phibar * st->phibar;
    st->res2 += psi * psi;
    st->rnorm = sqrt(res1 + st->res2);
    st->arnorm = st->alpha * fabs(st->tau);
    if (damp > 0.0) {
        const double r1sq = st->rnorm * st->rnorm - dampsq * st->xxnorm;
        st->r1norm = sqrt(fabs(r1sq));
        if (r1sq < 0.0) st->r1norm = -st->r1norm;
    } else {
        st->r1norm = st->rnorm;
    }
    st->r2norm = st->rnorm;
    const double test1 = st->rnorm / st->bnorm;
    const double test2 = st->arnorm / (st->anorm * st->rnorm + eps);
    const double test3 = 1.0 / (st->acond + eps);
    const double t1n = test1 / (1.0 + st->anorm * st->xnorm / st->bnorm);
    const double rtol = st->btol + st->atol * st->anorm * st->xnorm / st->bnorm;
    const long long istop = stop_cascade(test1, test2, test3, t1n, rtol, st->atol, st->ctol,
                                         st->itn >= st->iter_lim);
    st->istop = istop;
    write_record(rec, st->itn, st->r1norm, st->r2norm, st->arnorm, st->anorm, st->acond,
                 st->xnorm);
    if (!isfinite(st->r1norm) || !isfinite(st->arnorm) || !isfinite(st->xnorm) ||
        !isfinite(st->acond)) {
        stop_error(st, 3);
        return;
    }
    // u = A v_true - alpha u_true = sv (A v) - alpha su u
    st->c_av[0] = st->sv;
    st->c_av[1] = -(st->alpha * st->su);
    if (istop != 0)
        stop_all(st, 1);
    else if (st->itn >= st->stop_at)
        stop_all(st, 2);
}
extern "C" __global__ void __launch_bounds__(STEP_THREADS)
lsqr_step3(LsqrState* gst, const double* partial, u32 np, double* rec) {
    LSQR_STEP(dk2, step3(&cp, dk2, rec))
}

// Several ranks (NCCL inside the graph): after A v, this rank's partial sums of u^2 added in
// the fixed order into out[0], which ncclAllReduce then sums over the ranks for lsqr_step1.
extern "C" __global__ void __launch_bounds__(STEP_THREADS)
lsqr_sum(const double* __restrict__ partial, u32 np, double* __restrict__ out) {
    const double s = ordered_sum(partial, np);
    if (threadIdx.x == 0) out[0] = s;
}

// Columns of one block of the combines below (lsqr_combine, lsqr_peer_combine): a block takes
// COMBINE_COLS consecutive columns (COMBINE_PER values a thread, 256 threads) and writes its
// partial at (first column / COMBINE_COLS). So the partials of v^2, and the bits of every later
// scalar, are the same however the columns are cut into pieces (src/backend/cuda/lsqr_loop.rs:
// PIECE_ALIGN is a multiple of COMBINE_COLS, which it repeats) and whichever path summed t over
// the ranks.
#define COMBINE_PER 4
#define COMBINE_COLS (256 * COMBINE_PER)

// v[i] = a t_i + b v[i] for the block's columns of [c0, c1) (b == 0: v is not read), t_i from
// T(i); the block's partial of the new v^2 into partial[c0 / COMBINE_COLS + blockIdx.x]. Every
// t_i is loaded before the first is used, so a thread's loads (from another GPU, for the peer
// path) are in flight together.
template <typename T>
__device__ __forceinline__ void combine_cols(double* __restrict__ v, u64 c0, u64 c1, double a,
                                             double b, T t, double* __restrict__ partial) {
    const u64 first = c0 + (u64)blockIdx.x * COMBINE_COLS + threadIdx.x;
    double tv[COMBINE_PER];
#pragma unroll
    for (int k = 0; k < COMBINE_PER; ++k) {
        const u64 i = first + 256ull * k;
        tv[k] = i < c1 ? t(i) : 0.0;
    }
    double s = 0.0;
#pragma unroll
    for (int k = 0; k < COMBINE_PER; ++k) {
        const u64 i = first + 256ull * k;
        if (i < c1) {
            const double vi = b == 0.0 ? a * tv[k] : a * tv[k] + b * v[i];
            v[i] = vi;
            s += vi * vi;
        }
    }
    block_partial(s, partial + c0 / COMBINE_COLS);  // 256 threads: 8 warp sums, in order
}

// Several ranks: once t = A^T u (this rank's rows) was summed over the ranks, v = c_atu[0] t +
// c_atu[1] v, as the fused product's epilogue does on one rank (c_atu[1] == 0: v is not read),
// with the partial sums of the new v^2 for lsqr_step2 (combine_cols: n / COMBINE_COLS blocks).
// Nothing while skip_atu.
extern "C" __global__ void __launch_bounds__(256)
lsqr_combine(double* __restrict__ v, const double* __restrict__ t, u64 n,
             const LsqrState* __restrict__ st, double* __restrict__ partial) {
    if (st->skip_atu) return;
    combine_cols(v, 0, n, st->c_atu[0], st->c_atu[1], [=](u64 i) { return t[i]; }, partial);
}

// u *= su, v *= sv (true unit vectors again); lsqr_rescaled then resets the scales.
extern "C" __global__ void __launch_bounds__(256)
lsqr_normalize(double* __restrict__ u, u64 m, double* __restrict__ v, u64 n,
               const LsqrState* __restrict__ st) {
    normalize_uv(u, m, v, n, st);
}

extern "C" __global__ void lsqr_rescaled(LsqrState* st) { rescaled(st); }

// ---- Several ranks on one node: the sums over the ranks through each other's memory (CUDA IPC)
//
// Every rank owns one buffer that the others have mapped (src/backend/cuda/peer.rs): a control
// block of PEER_CTRL bytes, then two slots of n + 1 doubles, used by turns: this rank's A^T u
// (t) and its part of ||u||^2. `bases` holds every rank's buffer address in rank order (its own
// included); `off` is the byte offset of an iteration's slot from a buffer's start (the same on
// every rank). Control words: [0] exchanges this rank has published, [1] exchanges it has
// finished reading (its combine ran), [3] the last piece of t it has published (exchange e's
// piece j as e * 64 + j + 1: pieces only). One exchange per iteration, either whole:
//   lsqr_peer_usq     writes ||u||^2's part after t (the first iteration of a graph replay
//                     first waits until every rank has read every earlier exchange: the slots
//                     take turns only inside a replay);
//   (A^T u into t)
//   lsqr_peer_step1   publishes (count + 1), waits for every rank's, sums ||u||^2 in rank order,
//                     then LSQR's step 1;
//   lsqr_peer_combine sums t in rank order from every buffer into v (as lsqr_combine);
// or in pieces of t's columns (tuning atu_pieces > 1), each summed while the next is made:
//   lsqr_peer_usq, lsqr_peer_step1 (the count now says only that ||u||^2's part is there);
//   for each piece j: (A^T u of its columns into t), lsqr_peer_piece (word 3 = e * 64 + j + 1),
//   and on a second stream lsqr_peer_combine of the piece, which first waits for every rank's
//   word 3 to reach it.
// A slot is written again two exchanges later, and a rank publishes an exchange only after its
// combine has read the one before, so no other wait is needed inside a replay. The sums run in
// rank order on every rank, so every rank gets the same bits (for two ranks the same as NCCL's).
// Nothing runs once the loop is done (the same on every rank). A peer that does not come within
// PEER_WAIT_NS stops the loop with error 4 instead of hanging. (The buffer's helpers, peer_wait,
// peer_slot and peer_sum_at, are kernels/peer.cu's.)

#define PEER_PIECES_WORD 3
#define PEER_MAX_PIECES 64ull  // tuning atu_pieces <= 64

__device__ __forceinline__ void peer_timeout(LsqrState* st) {
    st->error = 4;
    stop_all(st, 3);
}

extern "C" __global__ void __launch_bounds__(STEP_THREADS)
lsqr_peer_usq(const double* partial, u32 np, const u64* __restrict__ bases, u32 ranks, u32 me,
              u64 n, u64 off, u32 first, LsqrState* st) {
    const double s = ordered_sum(partial, np);
    if (threadIdx.x != 0 || st->done) return;
    volatile u64* mine = (volatile u64*)bases[me];
    const u64 e = mine[0];
    mine[1] = e;  // every exchange up to e read: this kernel follows this rank's combine
    if (first) {
        __threadfence_system();
        if (!peer_wait(bases, ranks, me, 1, e)) {
            peer_timeout(st);
            return;
        }
    }
    ((volatile double*)peer_slot(bases, me, off))[n] = s;
}

extern "C" __global__ void lsqr_peer_step1(LsqrState* gst, const u64* __restrict__ bases,
                                           u32 ranks, u32 me, u64 n, u64 off) {
    if (threadIdx.x != 0 || gst->done) return;
    volatile u64* mine = (volatile u64*)bases[me];
    const u64 e = mine[0] + 1;
    __threadfence_system();  // t and ||u||^2's part (earlier kernels) before the count
    mine[0] = e;
    LsqrState cp = *gst;
    if (!peer_wait(bases, ranks, me, 0, e)) {
        peer_timeout(&cp);
        *gst = cp;
        return;
    }
    double ss = ((const volatile double*)peer_slot(bases, 0, off))[n];
    for (u32 r = 1; r < ranks; ++r) ss += ((const volatile double*)peer_slot(bases, r, off))[n];
    step1(&cp, ss);
    *gst = cp;
}

// After this rank's A^T u of piece j's columns (an earlier kernel): word 3 = e * 64 + j + 1.
extern "C" __global__ void lsqr_peer_piece(const u64* __restrict__ bases, u32 me, u32 j,
                                           const LsqrState* __restrict__ st) {
    if (threadIdx.x != 0 || st->done) return;
    volatile u64* mine = (volatile u64*)bases[me];
    __threadfence_system();  // the piece's values before its count
    mine[PEER_PIECES_WORD] = mine[0] * PEER_MAX_PIECES + j + 1;
}

// v over the columns [c0, c1) from t summed in rank order (combine_cols). `piece` = j + 1 of a
// piece (the block first waits for every rank's word 3 to reach it), 0 for the whole (step1
// has waited).
extern "C" __global__ void __launch_bounds__(256)
lsqr_peer_combine(double* __restrict__ v, const u64* __restrict__ bases, u32 ranks, u32 me,
                  u64 c0, u64 c1, u64 off, u32 piece, LsqrState* st,
                  double* __restrict__ partial) {
    __shared__ int go;
    if (threadIdx.x == 0) {
        go = !((const volatile LsqrState*)st)->skip_atu;
        if (go && piece) {
            const u64 e = ((const volatile u64*)bases[me])[0];
            go = peer_wait(bases, ranks, me, PEER_PIECES_WORD, e * PEER_MAX_PIECES + piece);
            if (!go) peer_timeout(st);
        }
    }
    __syncthreads();
    if (!go) return;
    const double a = st->c_atu[0], b = st->c_atu[1];
    combine_cols(v, c0, c1, a, b, [=](u64 i) { return peer_sum_at(bases, ranks, me, off, i); },
                 partial);
}
