// A device-resident LSMR iteration (src/backend/cuda/lsmr_loop.rs), as kernels/lsqr.cu is
// LSQR's: the scalars live in device memory (LsmrState), so a block of iterations runs as one
// CUDA graph with no host round trip. Compiled in the same module, after lsqr.cu (it uses its
// ordered_sum, sym_ortho and LSQR_REC).
//
// One iteration is: A v (the operator's fused product, partial sums of u^2) -> lsmr_step1 ->
// A^T u (partials of v^2) -> lsmr_step2 (the rotations, the estimate of ||r||, ||A||, cond(A))
// -> lsmr_update (h, hbar, x; partials of ||x||^2) -> lsmr_step3 (||x||, the stopping tests,
// the history record). The step kernels follow src/solver/lsmr.rs `step` line by line
// (SciPy's lsmr), compiled without FMA contraction. u and v are kept unnormalised as in LSQR's
// loop (u_true = su u, v_true = sv v); lsmr_normalize makes them unit vectors at the end of
// every replay.

// Layout shared with src/backend/cuda/lsmr_loop.rs LsmrDevState.
struct LsmrState {
    double alpha, beta, normb;
    double zetabar, alphabar, rho, rhobar, cbar, sbar, zeta;
    double betadd, betad, rhodold, tautildeold, thetatilde, d;
    double norma2, maxrbar, minrbar, norma, conda, normx, normr, normar;
    double su, sv;
    double c_av[2], c_atu[2], c_upd[4];
    double damp, atol, btol, ctol;
    long long itn, istop, iter_lim, stop_at;
    int done;      // nonzero: kernels do nothing (1 stopped, 2 paused at stop_at, 3 error)
    int skip_atu;  // nonzero: A^T u and its scalar step are skipped (done, or beta == 0)
    int error;     // 1: beta, 2: alpha, 3: a norm estimate not finite
    int pad;
};
static_assert(sizeof(LsmrState) == 352, "LsmrState must match src/backend/cuda/lsmr_loop.rs");

__device__ __forceinline__ void lsmr_stop(LsmrState* st, int how) {
    st->done = how;
    st->skip_atu = 1;
}

#define LSMR_STEP(SUM, BODY) SOLVER_STEP(LsmrState, SUM, BODY)

// After A v: beta = ||u||; the coefficients of A^T u (lsqr.cu's bidiag_beta).
__device__ __forceinline__ void lsmr_s1(LsmrState* st, double ss) { bidiag_beta(st, ss); }
extern "C" __global__ void __launch_bounds__(STEP_THREADS)
lsmr_step1(LsmrState* gst, const double* partial, u32 np) {
    LSMR_STEP(ss, lsmr_s1(&cp, ss))
}

// After A^T u: alpha = ||v||; the rotations Qhat, Q, Qbar; the estimates of ||r||, ||A||,
// cond(A) and ||A^T r||; the coefficients of the h / hbar / x update.
__device__ __forceinline__ void lsmr_s2(LsmrState* st, double ss) {
    if (!bidiag_alpha(st, ss)) return;
    // rotations (src/solver/lsmr.rs `rotations`)
    double chat, shat, alphahat;
    sym_ortho(st->alphabar, st->damp, &chat, &shat, &alphahat);
    const double rhoold = st->rho;
    double c, s, rho;
    sym_ortho(alphahat, st->beta, &c, &s, &rho);
    st->rho = rho;
    const double thetanew = s * st->alpha;
    st->alphabar = c * st->alpha;
    const double rhobarold = st->rhobar, zetaold = st->zeta;
    const double thetabar = st->sbar * rho;
    const double rhotemp = st->cbar * rho;
    double cbar, sbar, rhobar;
    sym_ortho(st->cbar * rho, thetanew, &cbar, &sbar, &rhobar);
    st->cbar = cbar;
    st->sbar = sbar;
    st->rhobar = rhobar;
    st->zeta = cbar * st->zetabar;
    st->zetabar *= -sbar;
    // hbar = h + c_hbar hbar; x += c_x hbar; h = v_true + c_h h
    st->c_upd[0] = -(thetabar * st->rho / (rhoold * rhobarold));
    st->c_upd[1] = st->zeta / (st->rho * st->rhobar);
    st->c_upd[2] = -(thetanew / st->rho);
    st->c_upd[3] = st->sv;
    // the estimate of ||r|| (`estimate_normr`)
    const double betaacute = chat * st->betadd;
    const double betacheck = -shat * st->betadd;
    const double betahat = c * betaacute;
    st->betadd = -s * betaacute;
    const double thetatildeold = st->thetatilde;
    double ctildeold, stildeold, rhotildeold;
    sym_ortho(st->rhodold, thetabar, &ctildeold, &stildeold, &rhotildeold);
    st->thetatilde = stildeold * st->rhobar;
    st->rhodold = ctildeold * st->rhobar;
    st->betad = -stildeold * st->betad + ctildeold * betahat;
    st->tautildeold = (zetaold - thetatildeold * st->tautildeold) / rhotildeold;
    const double taud = (st->zeta - st->thetatilde * st->tautildeold) / st->rhodold;
    st->d += betacheck * betacheck;
    const double e = st->betad - taud;
    const double sq = st->d + e * e + st->betadd * st->betadd;
    if (sq < 2.2250738585072014e-308 && (e != 0.0 || st->betadd != 0.0))
        st->normr = hypot(hypot(e, st->betadd), sqrt(st->d));
    else
        st->normr = sqrt(sq);
    // ||A||: beta of this step, then alpha; cond(A) from the rotations' diagonal
    st->norma2 += st->beta * st->beta;
    st->norma = sqrt(st->norma2);
    st->norma2 += st->alpha * st->alpha;
    st->maxrbar = fmax(st->maxrbar, rhobarold);
    if (st->itn > 1) st->minrbar = fmin(st->minrbar, rhobarold);
    st->conda = fmax(st->maxrbar, rhotemp) / fmin(st->minrbar, rhotemp);
    st->normar = fabs(st->zetabar);
}
extern "C" __global__ void __launch_bounds__(STEP_THREADS)
lsmr_step2(LsmrState* gst, const double* partial, u32 np) {
    LSMR_STEP(ss, lsmr_s2(&cp, ss))
}

// hbar = h + c_hbar hbar; x += c_x hbar; h = sv v + c_h h; partials of ||x||^2.
extern "C" __global__ void __launch_bounds__(256)
lsmr_update(double* __restrict__ x, double* __restrict__ h, double* __restrict__ hbar,
            const double* __restrict__ v, u64 n, const LsmrState* __restrict__ st,
            double* __restrict__ partial) {
    if (st->done) return;
    const double c_hbar = st->c_upd[0], c_x = st->c_upd[1], c_h = st->c_upd[2],
                 sv = st->c_upd[3];
    double s = 0.0;
    for (u64 i = blockIdx.x * 256ull + threadIdx.x; i < n; i += (u64)gridDim.x * 256ull) {
        const double hi = h[i];
        const double hb = hi + c_hbar * hbar[i];
        hbar[i] = hb;
        const double xi = x[i] + c_x * hb;
        x[i] = xi;
        s += xi * xi;
        h[i] = sv * v[i] + c_h * hi;
    }
    block_partial(s, partial);  // launched with 256 threads: 8 warp sums, in order
}

// After the update: ||x||, the stopping tests (SciPy's cascade), the history record and the
// coefficients of the next A v.
__device__ __forceinline__ void lsmr_s3(LsmrState* st, double xx, double* rec) {
    st->normx = sqrt(xx);
    write_record(rec, st->itn, st->normr, st->normr, st->normar, st->norma, st->conda,
                 st->normx);
    if (!isfinite(st->normr) || !isfinite(st->normar) || !isfinite(st->normx) ||
        !isfinite(st->norma)) {
        st->error = 3;
        lsmr_stop(st, 3);
        return;
    }
    const double test1 = st->normr / st->normb;
    const double den = st->norma * st->normr;
    const double test2 = den != 0.0 ? st->normar / den : __longlong_as_double(0x7ff0000000000000LL);
    const double test3 = 1.0 / st->conda;
    const double t1 = test1 / (1.0 + st->norma * st->normx / st->normb);
    const double rtol = st->btol + st->atol * st->norma * st->normx / st->normb;
    const long long istop = stop_cascade(test1, test2, test3, t1, rtol, st->atol, st->ctol,
                                         st->itn >= st->iter_lim);
    st->istop = istop;
    // u = A v_true - alpha u_true = sv (A v) - alpha su u
    st->c_av[0] = st->sv;
    st->c_av[1] = -(st->alpha * st->su);
    if (istop != 0)
        lsmr_stop(st, 1);
    else if (st->itn >= st->stop_at)
        lsmr_stop(st, 2);
}
extern "C" __global__ void __launch_bounds__(STEP_THREADS)
lsmr_step3(LsmrState* gst, const double* partial, u32 np, double* rec) {
    LSMR_STEP(xx, lsmr_s3(&cp, xx, rec))
}

// u *= su, v *= sv (true unit vectors again); lsmr_rescaled then resets the scales.
extern "C" __global__ void __launch_bounds__(256)
lsmr_normalize(double* __restrict__ u, u64 m, double* __restrict__ v, u64 n,
               const LsmrState* __restrict__ st) {
    normalize_uv(u, m, v, n, st);
}

extern "C" __global__ void lsmr_rescaled(LsmrState* st) { rescaled(st); }
