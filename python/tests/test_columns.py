"""seistomo.lsqr(A, B) with B of k columns: k solves in one batch (SciPy takes one b). Each
column equals seistomo's own single solve bit for bit and SciPy's lsqr on that column (istop,
iterations within 2 %, x within 1e-8 at tight tolerances)."""
import numpy as np
import pytest
from scipy.sparse.linalg import lsqr as scipy_lsqr

import seistomo
from test_seistomo import HAS_GPU, rel, system, within_2pct


def block(A, k, seed=3):
    """B of k columns: the data b and k - 1 random right-hand sides of A's rows."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((A.shape[0], k))


@pytest.mark.parametrize("name,kw", [
    ("australia", dict(atol=1e-10, btol=1e-10, conlim=1e14)),
    ("well1850", dict(damp=0.01, atol=1e-10, btol=1e-10, conlim=1e14, calc_var=True)),
    ("well1033", dict(iter_lim=15)),
])
def test_columns_equal_their_single_solves_and_scipy(name, kw):
    A, b = system(name)
    B = block(A, 4)
    B[:, 0] = b
    out = seistomo.lsqr(A, B, backend="cpu", **kw)
    X, istop, itn, r1, r2, anorm, acond, arnorm, xnorm, var = out
    assert X.shape == (A.shape[1], 4) and var.shape == X.shape
    assert istop.shape == itn.shape == r1.shape == (4,)
    assert len(out.info) == 4 and "batched" in seistomo.last_info["backend"]
    for j in range(4):
        one = seistomo.lsqr(A, B[:, j], backend="cpu", **kw)
        assert np.array_equal(X[:, j], one[0]), f"{name} column {j}: not the single solve"
        assert (istop[j], itn[j]) == (one[1], one[2])
        assert (r1[j], arnorm[j], xnorm[j]) == (one[3], one[7], one[8])
        assert np.array_equal(var[:, j], one[9])
        ref = scipy_lsqr(A, B[:, j], **kw)
        assert istop[j] == ref[1], f"{name} column {j}: istop {istop[j]} vs SciPy {ref[1]}"
        assert within_2pct(itn[j], ref[2]), f"{name} column {j}: {itn[j]} vs {ref[2]}"
        if "iter_lim" in kw or kw.get("atol", 1) <= 1e-10:
            # the data's column within 1e-8; australia's random right-hand sides (far from its
            # range) differ from SciPy's x at atol 1e-10 by up to 9.7e-9 (SciPy 1.10) and
            # 1.1e-8 (SciPy 1.18)
            tol = 1e-8 if j == 0 else 3e-8
            assert rel(X[:, j], ref[0]) <= tol, f"{name} column {j}: {rel(X[:, j], ref[0])}"


def test_one_column_is_the_single_solve_and_bad_options_are_refused():
    A, b = system("well1033")
    one = seistomo.lsqr(A, b[:, None], backend="cpu")
    assert one[0].shape == (A.shape[1],) and isinstance(one[1], int)
    B = block(A, 3)
    for kw, what in [(dict(x0=np.zeros(A.shape[1])), "x0"),
                     (dict(callback=lambda *a: None), "callback"),
                     (dict(transpose="scatter"), "transpose='scatter'"),
                     (dict(backend="cpu", precision="f32"), "precision"),
                     (dict(backend="cpu", storage="compact"), "storage='compact'"),
                     (dict(backend="gpu"), "unknown backend")]:
        with pytest.raises(ValueError, match=what):
            seistomo.lsqr(A, B, **kw)
    if not HAS_GPU:  # asked for, and none here: the GPU's own error, never the CPU instead
        with pytest.raises((RuntimeError, ValueError)):
            seistomo.lsqr(A, B, backend="cuda")
        with pytest.raises((RuntimeError, ValueError)):
            seistomo.lcurve(A, b, A, [0.1], backend="cuda")
    with pytest.raises(ValueError, match="B has 5 rows"):
        seistomo.lsqr(A, B[:5], backend="cpu")
    B[2, 1] = np.nan
    with pytest.raises(ValueError):
        seistomo.lsqr(A, B, backend="cpu")


def test_lcurve_equals_its_single_solves_and_scipy():
    # seistomo.lcurve(G, d, R, weights): every weight's solve in one batch equals its own
    # seistomo.lsqr on [G; w R] bit for bit and SciPy's lsqr on it (istop, iterations within
    # 2 %, x within 1e-8); the norms are ||G x - d|| and ||R x||; the corner is the weight of
    # maximum curvature
    import scipy.io as sio
    import scipy.sparse as sp

    from test_seistomo import DATA

    a = DATA / "australia"
    G = sio.mmread(str(a / "G.mtx.gz")).tocsr()
    R = sio.mmread(str(a / "R.mtx.gz")).tocsr()
    d = np.loadtxt(a / "d.txt", comments="#")
    weights = np.logspace(-3, -1, 7)
    kw = dict(atol=1e-10, btol=1e-10, conlim=1e14)
    c = seistomo.lcurve(G, d, R, weights, backend="cpu", **kw)
    assert c["x"].shape == (G.shape[1], 7) and len(c["info"]) == 7
    assert "batched" in c["info"][0]["backend"]
    b = np.concatenate([d, np.zeros(R.shape[0])])
    for j, w in enumerate(weights):
        A = sp.vstack([G, w * R]).tocsr()
        single = seistomo.lsqr(A, b, backend="cpu", **kw)
        assert single[2] == c["itn"][j] and single[1] == c["istop"][j]
        assert np.array_equal(single[0], c["x"][:, j]), f"weight {w}"
        x = c["x"][:, j]
        assert abs(c["residual_norm"][j] - np.linalg.norm(G @ x - d)) <= 1e-12 * c["residual_norm"][j]
        assert abs(c["model_norm"][j] - np.linalg.norm(R @ x)) <= 1e-12 * c["model_norm"][j]
        if j in (3, 6):  # the weakest weights are ill-conditioned: see test_seistomo for those
            ref = scipy_lsqr(A, b, **kw)
            assert ref[1] == c["istop"][j] and within_2pct(c["itn"][j], ref[2])
            assert rel(x, ref[0]) <= 1e-8
    k = c["curvature"]
    assert np.isnan(k[0]) and np.isnan(k[-1])
    assert c["corner"] == weights[int(np.nanargmax(k))]
    # the norms trade off: more weight, a smaller model and a larger misfit
    assert np.all(np.diff(c["model_norm"]) < 0) and np.all(np.diff(c["residual_norm"]) > 0)


def test_lcurve_refuses_bad_input():
    import scipy.sparse as sp

    G, R = sp.eye(5, 3, format="csr"), sp.eye(3, format="csr")
    with pytest.raises(ValueError, match="weights must be finite"):
        seistomo.lcurve(G, np.ones(5), R, [0.1, -1.0])
    with pytest.raises(ValueError, match="shape mismatch"):
        seistomo.lcurve(G, np.ones(4), R, [0.1])
    with pytest.raises(ValueError, match="at least one"):
        seistomo.lcurve(G, np.ones(5), R, [])


def test_lcurve_gcv_and_discrepancy_on_a_synthetic_with_known_noise():
    # the CLI's rules (`seistomo lcurve`, invert's [solver] weight) from Python: the
    # discrepancy weight's ||G x - d|| is the noise's norm within 5 %, GCV picks a weight whose
    # model error is near the best of the curve
    import scipy.sparse as sp

    rng = np.random.default_rng(3)
    m, n, sigma = 600, 120, 0.05
    G = sp.random(m, n, density=0.08, random_state=5, format="csr")
    x_true = np.sin(np.linspace(0, 3 * np.pi, n))
    d = G @ x_true + sigma * rng.standard_normal(m)
    R = sp.diags([-1.0, 1.0], [0, 1], shape=(n - 1, n), format="csr")
    weights = np.logspace(-2, 1.5, 15)
    c = seistomo.lcurve(G, d, R, weights, noise=sigma, gcv_probes=4, backend="cpu")
    assert c["corner"] is not None and c["gcv_min"] is not None
    assert c["discrepancy"] is not None
    target = np.sqrt(m) * sigma
    w = c["discrepancy"]
    A = sp.vstack([G, w * R]).tocsr()
    x = seistomo.lsqr(A, np.concatenate([d, np.zeros(n - 1)]), atol=1e-8, btol=1e-8,
                      backend="cpu")[0]
    assert abs(np.linalg.norm(G @ x - d) - target) <= 0.05 * target
    # GCV: its trace estimates lie between 0 and n, the minimum's model is near the best one
    assert np.all((c["trace"] > 0) & (c["trace"] < n)) and np.all(np.isfinite(c["gcv"]))
    errs = [np.linalg.norm(c["x"][:, i] - x_true) for i in range(len(weights))]
    A = sp.vstack([G, c["gcv_min"] * R]).tocsr()
    xg = seistomo.lsqr(A, np.concatenate([d, np.zeros(n - 1)]), atol=1e-8, btol=1e-8,
                       backend="cpu")[0]
    assert np.linalg.norm(xg - x_true) <= 2.0 * min(errs)
    # without probes no GCV; the other choices and every x are unchanged
    c0 = seistomo.lcurve(G, d, R, weights, noise=sigma, gcv_probes=0, backend="cpu")
    assert c0["gcv_min"] is None and np.all(np.isnan(c0["gcv"]))
    assert c0["corner"] == c["corner"] and c0["discrepancy"] == c["discrepancy"]
    assert np.array_equal(c0["x"], c["x"])
    for bad, msg in ((dict(gcv_probes=-1), "gcv_probes"), (dict(noise=0.0), "noise"),
                     (dict(noise=0.1, noise_tau=-1.0), "noise")):
        with pytest.raises(ValueError, match=msg):
            seistomo.lcurve(G, d, R, weights, **bad)


def test_a_prepared_operator_solves_the_columns_one_after_another():
    # lsqr(op, B) on a seistomo.Operator: each column its own lsqr(op, B[:, j]), bit for bit
    A, b = system("well1850")
    B = block(A, 3)
    kw = dict(damp=0.01, atol=1e-10, btol=1e-10, conlim=1e14, calc_var=True)
    with seistomo.Operator(A, backend="cpu") as op:
        X, istop, itn, *_, var = seistomo.lsqr(op, B, **kw)
        assert "one after another (a prepared Operator)" in seistomo.last_info["backend"]
        for j in range(3):
            one = seistomo.lsqr(op, B[:, j], **kw)
            assert np.array_equal(X[:, j], one[0]) and np.array_equal(var[:, j], one[9])
            assert (istop[j], itn[j]) == (one[1], one[2])


def big_system(seed=11):
    """A tall random sparse system just above gpu_batch_min_nnz() nonzeros (well conditioned:
    LSQR converges in tens of iterations), and 3 right-hand sides."""
    import scipy.sparse as sp

    m, n = 120_000, 4_000
    per = seistomo.gpu_batch_min_nnz() // m + 2
    A = sp.random(m, n, density=per / n, random_state=seed, format="csr")
    assert A.nnz >= seistomo.gpu_batch_min_nnz()
    return A, block(A, 3, seed)


@pytest.mark.skipif(not HAS_GPU, reason="no usable CUDA GPU")
def test_columns_on_the_gpu():
    # small A: one solve after another on one GPU operator, each column its own GPU solve bit
    # for bit; from gpu_batch_min_nnz(): the GPU's batch, each column its single GPU solve
    # (istop, iterations within one, x within 1e-9; f32 within 1e-6)
    A, b = system("australia")
    B = block(A, 3)
    B[:, 0] = b
    kw = dict(atol=1e-10, btol=1e-10, conlim=1e14)
    X, istop, itn, *_ = seistomo.lsqr(A, B, backend="cuda", **kw)
    assert seistomo.last_info["backend"].startswith("cuda") and \
        "one after another" in seistomo.last_info["backend"]
    for j in range(3):
        one = seistomo.lsqr(A, B[:, j], backend="cuda", **kw)
        assert np.array_equal(X[:, j], one[0]) and (istop[j], itn[j]) == (one[1], one[2])
    A, B = big_system()
    for prec, tol in (("f64", 1e-9), ("f32", 1e-6)):
        X, istop, itn, *_ = seistomo.lsqr(A, B, precision=prec, **kw)  # auto: the GPU
        assert "cuda: batched LSQR (3 columns" in seistomo.last_info["backend"], prec
        for j in range(3):
            one = seistomo.lsqr(A, B[:, j], backend="cuda", precision=prec, **kw)
            assert istop[j] == one[1] and abs(itn[j] - one[2]) <= 1, (prec, j)
            assert rel(X[:, j], one[0]) <= tol, (prec, j, rel(X[:, j], one[0]))
            ref = scipy_lsqr(A, B[:, j], **kw)
            assert rel(X[:, j], ref[0]) <= (1e-8 if prec == "f64" else 1e-5), (prec, j)


@pytest.mark.skipif(not HAS_GPU, reason="no usable CUDA GPU")
def test_cupy_columns_come_back_on_the_gpu():
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed here")
    csp = pytest.importorskip("cupyx.scipy.sparse", reason="CuPy is not installed here")
    same = dict(backend="cuda", storage="csr", transpose="csc")
    kw = dict(atol=1e-10, btol=1e-10, conlim=1e14, calc_var=True)
    for A, B in (system("australia")[0], None), big_system():
        B = block(A, 3) if B is None else B
        got = seistomo.lsqr(csp.csr_matrix(A), cupy.asarray(B), **kw)
        assert isinstance(got[0], cupy.ndarray) and isinstance(got[9], cupy.ndarray)
        want = seistomo.lsqr(A, B, **same, **kw)
        assert np.array_equal(cupy.asnumpy(got[0]), want[0])
        assert np.array_equal(got[2], want[2])


@pytest.mark.skipif(not HAS_GPU, reason="no usable CUDA GPU")
def test_lcurve_on_the_gpu_agrees_with_the_cpu():
    # australia (below gpu_batch_min_nnz: one GPU solve after another) and the large random
    # system with first differences as R (the GPU's batch, f64 and f32): the same curve within
    # rounding and the same corner as the CPU's batch
    import scipy.io as sio
    import scipy.sparse as sp

    from test_seistomo import DATA

    a = DATA / "australia"
    G = sio.mmread(str(a / "G.mtx.gz")).tocsr()
    R = sio.mmread(str(a / "R.mtx.gz")).tocsr()
    d = np.loadtxt(a / "d.txt", comments="#")
    Gb, Bb = big_system()
    n = Gb.shape[1]
    Rb = sp.diags([-1.0, 1.0], [0, 1], shape=(n - 1, n), format="csr")
    kw = dict(atol=1e-10, btol=1e-10, conlim=1e14, gcv_probes=0)
    for (g, dd, r, weights, how), prec, tol in (
            ((G, d, R, np.logspace(-3, -1, 7), "one solve after another"), "f64", 1e-6),
            ((Gb, Bb[:, 0], Rb, np.logspace(-2, 1, 5), "batched"), "f64", 1e-9),
            ((Gb, Bb[:, 0], Rb, np.logspace(-2, 1, 5), "batched"), "f32", 1e-6)):
        gpu = seistomo.lcurve(g, dd, r, weights, backend="cuda", precision=prec, **kw)
        cpu = seistomo.lcurve(g, dd, r, weights, backend="cpu", **kw)
        assert gpu["info"][0]["backend"].startswith("cuda") and how in gpu["info"][0]["backend"]
        for key in ("residual_norm", "model_norm"):
            assert rel(gpu[key], cpu[key]) <= tol, (how, prec, key, rel(gpu[key], cpu[key]))
        assert gpu["corner"] == cpu["corner"], (how, prec)


@pytest.mark.parametrize("name,kw", [
    ("australia", dict(atol=1e-10, btol=1e-10, conlim=1e14)),
    ("well1850", dict(atol=1e-10, btol=1e-10, conlim=1e14, calc_var=True)),
    ("well1033", dict(iter_lim=15)),
])
def test_damp_list_is_one_bidiagonalisation_equal_to_each_solve_and_scipy(name, kw):
    # damp=[...]: every damping in one Golub-Kahan pass; each equals its own host-loop solve
    # bit for bit (on the CPU the host loop is the only loop) and SciPy's lsqr at that damping
    A, b = system(name)
    damps = [0.0, 1e-3, 0.05, 1.0]
    out = seistomo.lsqr(A, b, damp=damps, backend="cpu", **kw)
    X, istop, itn, r1, r2, anorm, acond, arnorm, xnorm, var = out
    assert X.shape == (A.shape[1], 4) and var.shape == X.shape and len(out.info) == 4
    assert "one bidiagonalisation" in seistomo.last_info["backend"]
    for j, d in enumerate(damps):
        one = seistomo.lsqr(A, b, damp=d, backend="cpu", **kw)
        assert np.array_equal(X[:, j], one[0]), f"{name} damp {d}: not the single solve"
        assert (istop[j], itn[j]) == (one[1], one[2])
        assert (r1[j], r2[j], anorm[j], acond[j], arnorm[j], xnorm[j]) == one[3:9]
        assert np.array_equal(var[:, j], one[9])
        ref = scipy_lsqr(A, b, damp=d, **kw)
        assert istop[j] == ref[1], f"{name} damp {d}: istop {istop[j]} vs SciPy {ref[1]}"
        assert within_2pct(itn[j], ref[2]), f"{name} damp {d}: {itn[j]} vs {ref[2]}"
        if kw.get("atol", 1) < 1e-8:
            assert rel(X[:, j], ref[0]) <= 1e-8, f"{name} damp {d}"
    # the dampings stopped apart where they converge (not at a common limit)
    if "iter_lim" not in kw:
        assert len(set(itn)) >= 2, itn


def test_damp_list_refusals():
    A, b = system("well1033")
    for kw, words in ((dict(damp=[]), "empty"), (dict(damp=[0.1, 1], x0=np.zeros(A.shape[1])), "x0"),
                      (dict(damp=[0.1, 1], callback=lambda *a: None), "callback"),
                      (dict(damp=[0.1, -1.0]), "damp")):
        with pytest.raises(ValueError, match=words):
            seistomo.lsqr(A, b, backend="cpu", **kw)
    B = np.stack([b, b], axis=1)
    with pytest.raises(ValueError, match="one vector"):
        seistomo.lsqr(A, B, damp=[0.1, 1], backend="cpu")


@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
def test_damp_list_on_the_gpu_equals_its_host_loop_solves():
    # the GPU's one pass: each damping its own host-loop GPU solve bit for bit (f64 and f32
    # compact storage), and the CPU's within rounding
    A, b = system("australia")
    damps = [1e-3, 0.05, 1.0]
    kw = dict(atol=1e-10, btol=1e-10, conlim=1e14)
    for prec, storage in (("f64", "csr"), ("f32", "compact")):
        lay = dict(backend="cuda", precision=prec, storage=storage)
        X, istop, itn, *_ = seistomo.lsqr(A, b, damp=damps, **lay, **kw)
        assert "cuda" in seistomo.last_info["backend"]
        cpu = seistomo.lsqr(A, b, damp=damps, backend="cpu", **kw)
        for j, d in enumerate(damps):
            one = seistomo.lsqr(A, b, damp=d, lsqr_loop="host", **lay, **kw)
            assert np.array_equal(X[:, j], one[0]), (prec, d)
            assert (istop[j], itn[j]) == (one[1], one[2]), (prec, d)
            e = rel(X[:, j], cpu[0][:, j])
            print(f"{prec} damp {d}: {itn[j]} its (CPU {cpu[2][j]}), x against the CPU {e:.2e}")
            assert e <= (1e-8 if prec == "f64" else 1e-6), (prec, d, e)
