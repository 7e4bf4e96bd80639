"""The Python module against SciPy (lsqr, gmres), its input handling, its errors, datasets,
config runs and model files read by xarray/netCDF. Run by `make test` (python/README section in
docs/python.md); needs numpy, scipy, pytest, and for the model tests xarray + h5netcdf."""

import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
import scipy
import scipy.io as sio
import scipy.sparse as sp
from scipy.sparse.linalg import gmres as scipy_gmres
from scipy.sparse.linalg import lsqr as scipy_lsqr

import seistomo

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "datasets"
HAS_GPU = seistomo.cuda_available()[0]


def rel(x, y):
    return np.linalg.norm(np.asarray(x) - np.asarray(y)) / max(np.linalg.norm(y), 1e-300)


def vector(path):
    if str(path).endswith(".txt"):
        return np.loadtxt(path, comments="#")
    v = sio.mmread(str(path))
    return np.asarray(v.todense() if sp.issparse(v) else v, dtype=np.float64).ravel()


_cache = {}


def system(name):
    """(A csr, b) of a bundled least-squares system: datasets/lsq/NAME or australia's
    [G; 0.015 R], [d; 0] (the Rust tests' tests/common/mod.rs::system)."""
    if name not in _cache:
        if name == "australia":
            a = DATA / "australia"
            G = sio.mmread(str(a / "G.mtx.gz")).tocsr()
            R = sio.mmread(str(a / "R.mtx.gz")).tocsr()
            d = vector(a / "d.txt")
            A = sp.vstack([G, 0.015 * R]).tocsr()
            b = np.concatenate([d, np.zeros(R.shape[0])])
        else:
            A = sio.mmread(str(DATA / "lsq" / f"{name}.mtx.gz")).tocsr()
            b = vector(DATA / "lsq" / f"{name}_rhs1.mtx.gz")
        A.sum_duplicates()
        _cache[name] = (A, b)
    return _cache[name]


WELL = ["well1033", "well1850", "australia"]
ILL = ["illc1033", "illc1850"]


def x0_for(A):
    rng = np.random.default_rng(7)
    return 1e-3 * rng.standard_normal(A.shape[1])


# Variants: SciPy's defaults, tight tolerances, damping, x0, var, conlim, iteration limit.
VARIANTS = {
    "defaults": {},
    "tight": dict(atol=1e-10, btol=1e-10, conlim=1e14, iter_lim=100_000),
    "damp": dict(damp=0.01, atol=1e-10, btol=1e-10, conlim=1e14),
    "x0": dict(atol=1e-10, btol=1e-10, conlim=1e14, iter_lim=100_000, x0=True),
    "calc_var10": dict(calc_var=True, iter_lim=10, atol=1e-10, btol=1e-10, conlim=1e14),
    "conlim": dict(atol=1e-12, btol=1e-12, conlim=1e3),
    "iter_lim": dict(iter_lim=10, damp=0.05),
}
# Where x itself is compared (1e-8 relative): solves converged to tight tolerances, and the
# first 10 iterations. LSQR's iterates in between amplify rounding once Ritz values converge
# (Lanczos' loss of orthogonality; see tests/lsqr_reference.rs): stopped there (SciPy's loose
# default tolerances, 2 n iterations on the illc systems, conlim 1e3) SciPy's own x moves by up
# to 1e-2 under a 1e-16 perturbation, so those are checked by istop, itn and the residual.
CONVERGED = {"tight", "damp", "x0"}
EARLY = {"calc_var10", "iter_lim"}


def run_both(A, b, kw):
    kw = dict(kw)
    if kw.pop("x0", False):
        kw["x0"] = x0_for(A)
    ours = seistomo.lsqr(A, b, backend="cpu", **kw)
    ref = scipy_lsqr(A, b, **kw)
    return ours, ref


def within_2pct(got, want):
    return abs(got - want) <= max(np.ceil(0.02 * want), 0)


def within_scipys_spread(name, got, want):
    """Iterations against SciPy's: within 2 % on the well-conditioned systems; on the
    ill-conditioned ones within 5 %, SciPy's own spread: its stopping iteration there moves with
    the rounding of its sums (docs/lsmr.md: illc1033's LSMR stops after 3389-3489 iterations with
    its products perturbed by 1e-16, and SciPy 1.10.1 stopped after 3344 on an AMD EPYC build
    machine with AVX-512, 3469 on the one the 2 % were measured on)."""
    pct = 0.05 if name in ILL else 0.02
    return abs(got - want) <= np.ceil(pct * want)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("name", WELL + ILL)
def test_lsqr_matches_scipy(name, variant):
    A, b = system(name)
    ours, ref = run_both(A, b, VARIANTS[variant])
    assert len(ours) == 10
    x, istop, itn, r1, r2, anorm, acond, arnorm, xnorm, var = ours
    assert istop == ref[1], f"{name} {variant}: istop {istop} vs SciPy {ref[1]}"
    assert within_2pct(itn, ref[2]), f"{name} {variant}: {itn} iterations vs SciPy {ref[2]}"
    assert x.shape == ref[0].shape and var.shape == ref[9].shape
    assert np.isfinite(x).all()
    d = rel(x, ref[0])
    if variant in CONVERGED or variant in EARLY:
        assert d <= 1e-8, f"{name} {variant}: x differs by {d:e}"
        assert abs(r1 - ref[3]) <= 1e-8 * abs(ref[3])
        assert abs(xnorm - ref[8]) <= 1e-8 * ref[8]
    if variant in EARLY:  # anorm and acond accumulate per iteration: equal at equal itn
        assert abs(anorm - ref[5]) <= 1e-8 * ref[5] and abs(acond - ref[6]) <= 1e-8 * ref[6]
    elif variant == "defaults" and name in WELL:
        assert d <= 1e-6, f"{name} {variant}: x differs by {d:e}"
        assert abs(r1 - ref[3]) <= 1e-8 * ref[3]
    # The reported residual is that of the returned x.
    if VARIANTS[variant].get("damp", 0) == 0:
        assert abs(np.linalg.norm(b - A @ x) - r1) <= 1e-6 * r1
    if VARIANTS[variant].get("calc_var"):
        # After 10 iterations var agrees tightly (tests/lsqr_features.rs: 1e-10).
        assert rel(var, ref[9]) <= 1e-10
    else:
        assert not var.any() and not ref[9].any()


@pytest.mark.parametrize("name", WELL)
def test_lsqr_var_at_convergence(name):
    A, b = system(name)
    kw = dict(atol=1e-10, btol=1e-10, conlim=1e14, calc_var=True)
    ours, ref = run_both(A, b, kw)
    assert ours[1] == ref[1] and within_2pct(ours[2], ref[2])
    # var amplifies rounding once Ritz values converge: tests/lsqr_features.rs allows 2e-2.
    assert rel(ours[9], ref[9]) <= 2e-2
    assert (ours[9] >= 0).all()


def test_lsqr_edge_cases_like_scipy():
    A = sp.random(30, 10, density=0.5, random_state=1, format="csr")
    b = np.ones(30)
    for M, kw in [(A, dict(iter_lim=1)), (sp.csr_matrix((30, 10)), {}),
                  (A, dict(damp=1e3)), (A, dict(conlim=0.0, atol=0.0, btol=0.0, iter_lim=40))]:
        ours, ref = seistomo.lsqr(M, b, **kw), scipy_lsqr(M, b, **kw)
        assert ours[1:3] == ref[1:3], kw
        assert rel(ours[0], ref[0]) <= 1e-8 or not ref[0].any(), kw


def test_lsqr_zero_rhs_and_show(capsys):
    A, _ = system("well1033")
    x, istop, itn, *_ = seistomo.lsqr(A, np.zeros(A.shape[0]), show=True)
    assert istop == 0 and itn == 0 and not x.any()
    assert "LSQR" in capsys.readouterr().out


def _table_rows(text):
    """The iteration numbers of lsqr's show=True table (SciPy's or seistomo's)."""
    rows, inside = [], False
    for line in text.splitlines():
        if line.strip().startswith("Itn"):
            inside = True
            continue
        if inside:
            if not line.strip():
                break
            rows.append(int(line.split()[0]))
    return rows


@pytest.mark.parametrize("kw", [dict(atol=1e-10, btol=1e-10, conlim=1e14),
                                dict(iter_lim=30, damp=0.01)])
def test_show_prints_scipys_header_and_table_rows(capsys, kw):
    A, b = system("well1033")
    got = seistomo.lsqr(A, b, show=True, backend="cpu", **kw)
    ours = capsys.readouterr().out
    ref = scipy_lsqr(A, b, show=True, **kw)
    theirs = capsys.readouterr().out
    head = lambda t: [line for line in t.splitlines() if "=" in line][:4]  # noqa: E731
    assert head(ours) == head(theirs), (ours, theirs)
    rows, ref_rows = _table_rows(ours), _table_rows(theirs)
    assert rows[:11] == list(range(11)) and rows[-1] == got[2]
    # the same rule picks the rows: nothing between the first ten and the rows near the end,
    # where the stopping tests come near (within a few iterations of SciPy's: the iteration
    # counts agree within 2 %, the test values in their rounding)
    first, ref_first = (next((r for r in x if r > 10), None) for x in (rows, ref_rows))
    if ref_first is None:
        assert first is None or first >= got[2] - 10
    else:
        # (within 5 %: SciPy's own rows move with its rounding; 184 against 191 on an AVX-512
        # build machine, where SciPy's stopping iteration moves too: docs/lsmr.md)
        assert abs(first - ref_first) <= max(3, 0.05 * ref[2]), (first, ref_first)
    assert "LSQR finished" in ours and f"itn   ={got[2]:8g}" in ours


def test_show_keeps_the_callers_callback_and_its_cadence(capsys):
    A, b = system("well1033")
    seen = []
    seistomo.lsqr(A, b, iter_lim=20, show=True, backend="cpu", callback_every=5,
                  callback=lambda itn, *norms: seen.append(itn))
    assert seen == [5, 10, 15, 20]
    assert "LSQR finished" in capsys.readouterr().out


def test_every_input_type_gives_the_same_answer():
    A, b = system("well1033")
    base = seistomo.lsqr(A, b, atol=1e-10, btol=1e-10)
    coo = A.tocoo()
    big = A.copy()
    big.indptr = big.indptr.astype(np.int64)
    big.indices = big.indices.astype(np.int64)
    b2 = np.empty(2 * len(b))
    b2[::2] = b
    inputs = {
        "csr": (A, b),
        "csc": (A.tocsc(), b),
        "coo": (coo, b),
        "coo shuffled duplicates": (
            sp.coo_matrix(
                (np.concatenate([coo.data / 2, coo.data / 2]),
                 (np.concatenate([coo.row, coo.row]), np.concatenate([coo.col, coo.col]))),
                shape=A.shape,
            ),
            b,
        ),
        "int64 indices": (big, b),
        "csr_array": (sp.csr_array(A), b),
        "dense": (A.toarray(), b),
        "non-contiguous b": (A, b2[::2]),
        "column b": (A, b.reshape(-1, 1)),
        "list b": (A, list(b)),
    }
    for what, (M, rhs) in inputs.items():
        r = seistomo.lsqr(M, rhs, atol=1e-10, btol=1e-10)
        assert r[1] == base[1] and r[2] == base[2], what
        assert rel(r[0], base[0]) <= 1e-12, what
    # float32 values: solved as the f64 matrix of the same (rounded) values.
    A32 = A.astype(np.float32)
    r = seistomo.lsqr(A32, b.astype(np.float32), atol=1e-10, btol=1e-10)
    ref = scipy_lsqr(A32.astype(np.float64), b.astype(np.float32).astype(np.float64),
                     atol=1e-10, btol=1e-10)
    assert r[1] == ref[1] and within_2pct(r[2], ref[2])
    assert rel(r[0], ref[0]) <= 1e-8
    assert r[0].dtype == np.float64


def test_bad_inputs_raise_the_right_exception():
    A, b = system("well1033")
    with pytest.raises(ValueError, match="shape mismatch"):
        seistomo.lsqr(A, b[:-1])
    with pytest.raises(ValueError, match="shape mismatch"):
        seistomo.lsqr(A, b, x0=np.zeros(A.shape[1] + 1))
    bad = A.copy()
    bad.data[3] = np.nan
    with pytest.raises(ValueError, match="not finite"):
        seistomo.lsqr(bad, b)
    bad.data[3] = np.inf
    with pytest.raises(ValueError, match="not finite"):
        seistomo.lsqr(bad, b)
    bn = b.copy()
    bn[5] = np.nan
    with pytest.raises(ValueError, match=r"b\[5\] is not finite"):
        seistomo.lsqr(A, bn)
    with pytest.raises(ValueError, match="empty"):
        seistomo.lsqr(sp.csr_matrix((0, 5)), np.zeros(0))
    with pytest.raises(ValueError, match="2-D"):
        seistomo.lsqr(np.ones(5), np.ones(5))
    with pytest.raises(ValueError, match="1-D"):  # B of columns: lsqr only (test_columns.py)
        seistomo.lsmr(A, np.ones((A.shape[0], 2)))
    with pytest.raises(ValueError, match="1-D"):
        seistomo.lsqr(A, np.ones((A.shape[0], 2, 2)))
    with pytest.raises(TypeError, match="complex"):
        seistomo.lsqr(A.astype(np.complex128), b)
    with pytest.raises(TypeError):
        seistomo.lsqr(np.array([["a", "b"]]), ["x"])
    # operators are accepted (tests/test_operators.py), complex ones are not
    with pytest.raises(TypeError, match="complex"):
        seistomo.lsqr(sp.linalg.aslinearoperator(A.astype(np.complex128)), b)
    with pytest.raises(ValueError, match="damp"):
        seistomo.lsqr(A, b, damp=-1.0)
    with pytest.raises(ValueError, match="backend"):
        seistomo.lsqr(A, b, backend="tpu")
    with pytest.raises(ValueError, match="precision"):
        seistomo.lsqr(A, b, precision="f16")
    with pytest.raises(ValueError, match="f64 values only"):
        seistomo.lsqr(A, b, backend="cpu", precision="f32", storage="csr")
    # compact storage keeps f32 values on the CPU too (f64 sums)
    x32 = seistomo.lsqr(A, b, backend="cpu", precision="f32", storage="compact")[0]
    x64 = seistomo.lsqr(A, b, backend="cpu")[0]
    assert rel(x32, x64) <= 1e-4
    with pytest.raises(ValueError, match="square"):
        seistomo.gmres(A, b)
    with pytest.raises(ValueError, match="preconditioner"):
        seistomo.gmres(sp.eye(4, format="csr"), np.ones(4), M="amg")
    with pytest.raises(TypeError, match="M must be"):
        seistomo.gmres(sp.eye(4, format="csr"), np.ones(4), M=42)
    with pytest.raises(ValueError, match="storage"):
        seistomo.gmres(sp.eye(4, format="csr"), np.ones(4), storage="ell")
    with pytest.raises(ValueError, match="row patterns"):
        seistomo.gmres(sp.eye(4, format="csr"), np.ones(4), backend="cpu", storage="compact")
    with pytest.raises(FileNotFoundError):
        seistomo.Dataset.open("/nonexistent/dataset.toml")
    with pytest.raises(FileNotFoundError):
        seistomo.invert("/nonexistent/run.toml")
    with pytest.raises(OSError):
        seistomo.open_model(str(DATA / "australia" / "d.txt"))


@pytest.mark.skipif(HAS_GPU, reason="a CUDA GPU is present")
def test_cuda_without_a_gpu_is_a_runtime_error():
    A, b = system("well1033")
    with pytest.raises(RuntimeError, match="cuda"):
        seistomo.lsqr(A, b, backend="cuda")
    # auto falls back to the CPU and says so.
    seistomo.lsqr(A, b, backend="auto")
    assert seistomo.last_info["backend"].startswith("cpu")


@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU")
def test_cuda_matches_cpu():
    A, b = system("australia")
    kw = dict(atol=1e-10, btol=1e-10, conlim=1e14)
    c = seistomo.lsqr(A, b, backend="cpu", **kw)
    g = seistomo.lsqr(A, b, backend="cuda", **kw)
    assert g[1] == c[1] and within_2pct(g[2], c[2]) and rel(g[0], c[0]) <= 1e-8


def test_callback_and_its_exceptions():
    A, b = system("well1033")
    seen = []
    r = seistomo.lsqr(A, b, callback=lambda *a: seen.append(a), callback_every=10)
    assert [s[0] for s in seen] == list(range(10, r[2] + 1, 10))
    assert len(seen[0]) == 7 and seen[-1][1] >= r[3] * (1 - 1e-12)

    def boom(itn, *rest):
        if itn == 3:
            raise ZeroDivisionError("from the callback")

    with pytest.raises(ZeroDivisionError, match="from the callback"):
        seistomo.lsqr(A, b, callback=boom)


def second_difference(n=200_000):
    """A 1-D second difference of n unknowns (condition ~1e10) and a random b: with every
    stopping test off, LSQR would run for hundreds of thousands of iterations."""
    A = sp.diags([-np.ones(n - 1), 2 * np.ones(n), -np.ones(n - 1)], [-1, 0, 1], format="csr")
    return A, np.random.default_rng(1).standard_normal(n)


def ctrl_c_during(solve):
    """solve(callback) with SIGINT sent from another thread 0.3 s in must raise
    KeyboardInterrupt. Where SIGINT is ignored (a background job of a script: `make test &`),
    Python installs no handler and the signal would be lost: Python's own is installed for the
    duration (skipped where it cannot be). Whatever happens, the callback ends the solve after
    60 s. Returns the iterations the callback saw."""
    import time
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.default_int_handler:
        try:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        except ValueError:
            pytest.skip("SIGINT cannot be handled here (not the main thread)")
    seen = []
    deadline = time.monotonic() + 60

    def callback(itn, *rest):
        seen.append(itn)
        if time.monotonic() > deadline:
            raise TimeoutError("no KeyboardInterrupt 60 s after SIGINT was sent")

    t = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    t.start()
    try:
        with pytest.raises(KeyboardInterrupt) as caught:
            solve(callback)
    finally:
        t.cancel()
        if previous is not signal.default_int_handler:
            signal.signal(signal.SIGINT, previous)
    assert not seen or seen[-1] < 10**8
    ctrl_c_during.interrupt = caught.value
    return seen


def test_ctrl_c_raises_keyboard_interrupt():
    # SIGINT arrives from another thread while the solve runs with the GIL released. The
    # KeyboardInterrupt carries the iterate it stopped at (.x, .itn): what iter_lim=itn gives.
    A, b = second_difference()
    ctrl_c_during(lambda cb: seistomo.lsqr(A, b, atol=0, btol=0, conlim=0, iter_lim=10**8,
                                           callback=cb, callback_every=1000))
    e = ctrl_c_during.interrupt
    assert e.itn >= 1 and e.x.shape == (A.shape[1],)
    again = seistomo.lsqr(A, b, atol=0, btol=0, conlim=0, iter_lim=e.itn, backend="auto")
    assert np.array_equal(e.x, again[0]) or rel(e.x, again[0]) <= 1e-12


def test_a_callbacks_exception_carries_the_iterate():
    A, b = system("well1033")

    def stop(itn, *norms):
        if itn == 17:
            raise RuntimeError("enough")

    for reorder in ("none", "auto"):
        with pytest.raises(RuntimeError, match="enough") as caught:
            seistomo.lsqr(A, b, backend="cpu", callback=stop, reorder=reorder)
        e = caught.value
        want = seistomo.lsqr(A, b, backend="cpu", iter_lim=17, reorder=reorder)
        assert e.itn == 17 and np.array_equal(e.x, want[0]), reorder
    with pytest.raises(RuntimeError) as caught:
        seistomo.lsmr(A, b, backend="cpu", callback=stop)
    want = seistomo.lsmr(A, b, backend="cpu", maxiter=17)[0]
    assert caught.value.itn == 17 and np.array_equal(caught.value.x, want)


def scipy_gmres_run(A, b, M, restart, rtol, maxiter):
    its = [0]

    def cb(_):
        its[0] += 1

    kw = dict(M=M, atol=0, restart=restart, maxiter=maxiter, callback=cb,
              callback_type="pr_norm")
    try:
        x, info = scipy_gmres(A, b, rtol=rtol, **kw)
    except TypeError:  # SciPy < 1.12 names it tol
        x, info = scipy_gmres(A, b, tol=rtol, **kw)
    return x, info, its[0]


GMRES_CASES = [
    ("convdiff16", "square_gen/convdiff16.mtx.gz", "jacobi"),
    ("convdiff16", "square_gen/convdiff16.mtx.gz", None),
    ("convdiff24", "square_gen/convdiff24.mtx.gz", "jacobi"),
    ("poisson16", "square_gen/poisson16.mtx.gz", None),
    ("west0479", "square/west0479.mtx.gz", "jacobi"),
    ("nnc1374", "square/nnc1374.mtx.gz", "jacobi"),
    ("bayer10", "square/bayer10.mtx.gz", "jacobi"),
]


@pytest.mark.skipif(
    tuple(int(v) for v in scipy.__version__.split(".")[:2]) >= (1, 12),
    reason="seistomo follows SciPy 1.10's gmres; SciPy 1.12 rewrote it",
)
@pytest.mark.parametrize("name,file,M", GMRES_CASES)
def test_gmres_matches_scipy(name, file, M):
    A = sio.mmread(str(DATA / file)).tocsr()
    A.sum_duplicates()
    n = A.shape[0]
    b = np.ones(n)
    Mop = None
    if M == "jacobi":
        d = A.diagonal()
        Mop = sp.diags(np.where(d != 0, 1 / np.where(d != 0, d, 1), 1.0))
    xs, info_s, its_s = scipy_gmres_run(A, b, Mop, 16, 1e-10, 300)
    res = seistomo.gmres(A, b, rtol=1e-10, restart=16, maxiter=300, M=M, orthog="mgs",
                         backend="cpu")
    x, info = res
    assert (info == 0) == (info_s == 0), f"{name} {M}: info {info} vs SciPy {info_s}"
    assert within_2pct(res.iterations, its_s), f"{name} {M}: {res.iterations} vs {its_s}"
    if info == 0:
        assert np.linalg.norm(b - A @ x) <= 1e-10 * np.linalg.norm(b) * (1 + 1e-6)
        assert res.relres <= 1e-10
    else:
        assert info > 0 and res.cycles == 300
    # The default orthogonalisation (cgs2) reaches the same verdict.
    r2 = seistomo.gmres(A, b, rtol=1e-10, restart=16, maxiter=300, M=M)
    assert (r2[1] == 0) == (info == 0)


def test_gmres_defaults_and_x0():
    A = sio.mmread(str(DATA / "square_gen" / "poisson16.mtx.gz")).tocsr()
    b = np.arange(A.shape[0], dtype=float)
    x, info = seistomo.gmres(A, b)
    assert info == 0 and np.linalg.norm(b - A @ x) <= 1e-5 * np.linalg.norm(b)
    r = seistomo.gmres(A, b, x0=x, rtol=1e-8)
    assert r[1] == 0 and r.iterations < 200


def test_dataset_create_open_system(tmp_path):
    rng = np.random.default_rng(3)
    G = sp.random(60, 24, density=0.2, random_state=4, format="csr")
    d = rng.standard_normal(60)
    R = sp.eye(24, format="csr")
    grid = dict(n=[4, 3, 2], origin=[0, 0, 0], spacing=[1.0, 1.0, 2.0], units="km")
    ds = seistomo.Dataset.create(tmp_path / "ds", G, d, R=R, lam=0.5, grid=grid, name="t")
    again = seistomo.Dataset.open(tmp_path / "ds")
    assert again.shape == (84, 24) and again.kernel_rows == 60
    assert again.nnz == G.nnz + 24 and again.lam == 0.5 and again.name == "t"
    assert again.grid["n"] == [4, 3, 2]
    A, b = ds.system()
    want = sp.vstack([G, 0.5 * R]).tocsr()
    assert A.shape == want.shape and abs(A - want).max() <= 1e-15
    assert np.array_equal(b, np.concatenate([d, np.zeros(24)]))
    with pytest.raises(ValueError, match="shape mismatch"):
        seistomo.Dataset.create(tmp_path / "bad", G, d[:-1])
    with pytest.raises(ValueError, match="R has"):
        seistomo.Dataset.create(tmp_path / "bad", G, d, R=sp.eye(5, format="csr"))


@pytest.fixture(scope="module")
def demo_model(tmp_path_factory):
    """The demo inversion (datasets/demo/invert.toml, as `make demo` runs it) into a
    temporary directory, through seistomo.invert."""
    out = tmp_path_factory.mktemp("demo")
    text = (DATA / "demo" / "invert.toml").read_text()
    text = text.replace('path = "dataset.toml"', f'path = "{DATA / "demo" / "dataset.toml"}"')
    text = text.replace('dir = "../../out/demo"', f'dir = "{out}"')
    cfg = out / "invert.toml"
    cfg.write_text(text)
    report = seistomo.invert(cfg)
    return out, report


def test_invert_returns_the_report(demo_model):
    out, report = demo_model
    assert report["method"] == "lsqr" and report["istop"] in (1, 2)
    assert report["n"] == 16 * 16 * 8 and report["iterations"] > 0
    assert (out / "model.h5").exists() and (out / "report.json").exists()


def test_xarray_opens_the_demo_model(demo_model):
    xr = pytest.importorskip("xarray")
    pytest.importorskip("h5netcdf")
    out, _ = demo_model
    ds = xr.open_dataset(out / "model.h5", engine="h5netcdf")
    v = ds["velocity"]
    assert v.dims == ("z", "y", "x") and v.shape == (8, 16, 16)
    assert v.attrs["units"] == "km/s" and "long_name" in v.attrs
    for c, n in (("x", 16), ("y", 16), ("z", 8)):
        assert ds[c].shape == (n,) and ds[c].attrs["units"] == "km"
    assert np.allclose(ds["x"].values, np.arange(16) + 0.5)
    assert ds.attrs["Conventions"] == "CF-1.8"
    # A depth slice by coordinate, as in docs/python.md.
    assert v.sel(z=2.5).shape == (16, 16)
    # The /model group opens too, with the same dimensions, and so does the history.
    g = xr.open_dataset(out / "model.h5", engine="h5netcdf", group="model")
    assert g["solution"].dims == ("z", "y", "x")
    h = xr.open_dataset(out / "model.h5", engine="h5netcdf", group="history")
    assert h["r1norm"].dims == ("itn",)
    # seistomo.open_model gives the same Dataset.
    m = seistomo.open_model(out / "model.h5")
    assert np.array_equal(m["velocity"].values, v.values)
    # The XDMF sidecar is still written.
    assert (out / "model.xdmf").exists()


def test_ncdump_reads_the_demo_model(demo_model):
    ncdump = shutil.which("ncdump")
    if ncdump is None:
        pytest.skip("ncdump (Debian's netcdf-bin) not installed")
    out, _ = demo_model
    head = subprocess.run([ncdump, "-h", str(out / "model.h5")], capture_output=True,
                          text=True, check=True).stdout
    assert "double velocity(z, y, x)" in head and 'velocity:units = "km/s"' in head


def hide_modules(monkeypatch, names):
    """Imports of `names` fail from here on, as on an install without them."""
    import builtins

    real = builtins.__import__

    def hidden(name, *a, **k):
        if name.split(".")[0] in names:
            raise ImportError(f"No module named '{name}'", name=name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", hidden)


def test_open_model_without_xarray(demo_model, monkeypatch):
    # A base install (no extra): open_model says which extra brings what it needs; with
    # xarray=False it gives a dict of NumPy arrays.
    out, _ = demo_model
    cases = [(("xarray", "h5netcdf", "h5py"), "xarray and h5netcdf and h5py")]
    try:  # imported here, so that hiding h5py below hides h5py alone
        import h5netcdf  # noqa: F401
        import xarray  # noqa: F401

        cases.append((("h5py",), "needs h5py,"))
    except ImportError:  # (without them the message names them too)
        pass
    for names, named in cases:
        with monkeypatch.context() as mp:
            hide_modules(mp, names)
            with pytest.raises(ImportError, match=r'pip install "seistomo\[xarray\]"') as e:
                seistomo.open_model(out / "model.h5")
            assert named in str(e.value) and "xarray=False" in str(e.value)
            m = seistomo.open_model(out / "model.h5", xarray=False)
    assert isinstance(m, dict) and m["velocity"].shape == (8, 16, 16)
    assert np.allclose(m["z"], np.arange(8) + 0.5)
    assert m["attrs"]["velocity_unit"] == "km/s"


def test_extras_bring_what_open_model_and_the_plots_need():
    tomllib = pytest.importorskip("tomllib")
    meta = tomllib.loads((ROOT / "python" / "pyproject.toml").read_text())["project"]
    extras = meta["optional-dependencies"]
    name = lambda req: req.split(";")[0].split("[")[0].split("<")[0].split(">")[0].split("=")[0]
    need = set(seistomo._XARRAY_STACK)
    assert need <= {name(r).strip() for r in extras["xarray"]}
    assert need | {"matplotlib"} <= {name(r).strip() for r in extras["plot"]}
    assert need | {"pytest"} <= {name(r).strip() for r in extras["test"]}


def test_australia_model_has_lat_lon(tmp_path):
    xr = pytest.importorskip("xarray")
    pytest.importorskip("h5netcdf")
    text = (ROOT / "configs" / "australia-model.toml").read_text()
    text = text.replace("../datasets", str(DATA)).replace(
        'dir = "../out/australia-model"', f'dir = "{tmp_path}"')
    (tmp_path / "a.toml").write_text(text)
    seistomo.invert(tmp_path / "a.toml")
    ds = seistomo.open_model(tmp_path / "model.h5")
    v = ds["velocity"]
    assert v.dims == ("lat", "lon")
    assert ds["lat"].attrs["units"] == "degrees_north" and ds["lon"].attrs["standard_name"] == "longitude"
    assert v.attrs["units"] == "m/s"
    # Every cell of the table is one lattice box; the rest is the fill value (NaN).
    assert int(np.isfinite(v.values).sum()) == 11916
    g = xr.open_dataset(tmp_path / "model.h5", engine="h5netcdf", group="model")
    assert g["velocity"].dims == ("cell",)
    if shutil.which("ncdump"):
        head = subprocess.run(["ncdump", "-h", str(tmp_path / "model.h5")], capture_output=True,
                              text=True, check=True).stdout
        assert "double velocity(lat, lon)" in head and "velocity:_FillValue = NaN" in head


def test_ctrl_c_is_seen_where_sigint_was_ignored():
    # The situation of `make test &` in a script: the process starts with SIGINT ignored. The
    # Ctrl-C test still runs there (it installs Python's handler) and ends within its limit.
    import sys
    import time
    code = ("import signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); import pytest; "
            "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', sys.argv[1] + "
            "'::test_ctrl_c_raises_keyboard_interrupt']))")
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code, __file__], capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 passed" in r.stdout, r.stdout
    assert time.monotonic() - t < 120


def test_a_hung_test_fails_within_its_time_limit(tmp_path):
    # conftest.py's limit (SEISTOMO_TEST_TIMEOUT, here 2 s) on a test hung in Python and one hung
    # in a seistomo solve: both fail with TimeoutError, the others still run, the run ends.
    import sys
    import textwrap
    import time
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_hang.py").write_text(textwrap.dedent("""
        import time
        import numpy as np
        import scipy.sparse as sp
        import seistomo

        def test_hangs_in_python():
            time.sleep(600)

        def test_hangs_in_a_solve():
            n = 200_000
            A = sp.diags([-np.ones(n - 1), 2 * np.ones(n), -np.ones(n - 1)], [-1, 0, 1],
                         format="csr")
            seistomo.lsqr(A, np.ones(n), atol=0, btol=0, conlim=0, iter_lim=10**8)

        def test_after_them():
            pass
    """))
    env = dict(os.environ, SEISTOMO_TEST_TIMEOUT="2")
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(tmp_path / "test_hang.py")], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "2 failed, 1 passed" in out, out
    assert out.count("still running after 2 s") >= 2, out
    assert took < 60, f"{took:.0f} s"


def test_invert_runs_a_dataset_directory(tmp_path):
    # A dataset without a run config: `invert` takes the directory and runs the defaults, with
    # the outputs beside it (NAME-inversion), as `seistomo invert DIR` does.
    G = sp.random(60, 24, density=0.2, random_state=4, format="csr") + sp.eye(60, 24)
    x = np.linspace(1, 2, 24)
    grid = dict(n=[4, 3, 2], origin=[0, 0, 0], spacing=[1.0, 1.0, 1.0], units="km")
    seistomo.Dataset.create(tmp_path / "mine", G.tocsr(), G @ x, grid=grid)
    report = seistomo.invert(str(tmp_path / "mine"))
    assert report["istop"] in (1, 2)
    out = tmp_path / "mine-inversion"
    assert (out / "model.h5").is_file() and (out / "report.json").is_file()
    got = np.loadtxt(out / "solution.txt")
    assert rel(got, x) <= 1e-6


def test_corrupted_sparse_arrays_are_value_errors_not_crashes():
    """Issue 35: a corrupted indptr must not reach SciPy's compiled routines (a segfault in
    sort_indices); bad indices and orders get messages that say what is wrong."""
    A = sp.random(30, 10, density=0.3, random_state=2, format="csr")
    b = np.ones(30)
    bad = A.copy()
    bad.indptr[5] = 10**6
    with pytest.raises(ValueError, match="indptr"):
        seistomo.lsqr(bad, b)
    bad = A.copy()
    bad.indptr[5], bad.indptr[6] = bad.indptr[6] + 3, bad.indptr[5]
    with pytest.raises(ValueError, match=r"A.indptr decreases at row"):
        seistomo.lsqr(bad, b)
    bad = A.copy()
    bad.indices[2] = -3
    with pytest.raises(ValueError, match=r"A.indices\[2\] = -3 is out of range"):
        seistomo.lsqr(bad, b)
    bad = A.copy()
    bad.indices[2] = 10
    with pytest.raises(ValueError, match=r"= 10 is out of range: column indices must be in 0..9"):
        seistomo.lsqr(bad, b)
    bad = A.tocsc()
    bad.indptr[3] = 10**6
    with pytest.raises(ValueError, match="indptr"):
        seistomo.lsqr(bad, b)
    bad = A.tocoo()
    bad.row[0] = -1
    with pytest.raises(ValueError, match=r"A.row\[0\] = -1"):
        seistomo.lsqr(bad, b)
    sq = sp.eye(5, format="csr")
    sq.indptr[2] = 99
    with pytest.raises(ValueError, match="indptr"):
        seistomo.gmres(sq, np.ones(5))
    with pytest.raises(ValueError, match="G.indptr"):
        seistomo.Dataset.create("/nonexistent/ds", sq, np.ones(5))


def test_gmres_restart_beyond_n_is_clamped_like_scipy():
    Q = sp.diags([1.0, 2.0, 3.0], format="csr")
    q = np.ones(3)
    x, info = seistomo.gmres(Q, q, restart=100000)
    assert info == 0 and np.allclose(x, [1.0, 0.5, 1.0 / 3.0])
    with pytest.raises(ValueError, match="restart must be >= 1"):
        seistomo.gmres(Q, q, restart=0)


def test_iter_lim_zero_is_an_error_as_in_the_cli_and_the_config():
    A = sp.random(30, 10, density=0.5, random_state=1, format="csr")
    with pytest.raises(ValueError, match="iter_lim must be >= 1"):
        seistomo.lsqr(A, np.ones(30), iter_lim=0)


def test_special_files_are_refused_at_once(tmp_path):
    import time

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for p in ["/dev/zero", "/dev/urandom", str(fifo)]:
        for f in (seistomo.Dataset.open, seistomo.invert, seistomo.open_model):
            t = time.monotonic()
            with pytest.raises(OSError, match="not a regular file"):
                f(p)
            assert time.monotonic() - t < 1.0, (f, p)


def test_rayon_num_threads_is_checked_like_threads():
    import sys

    code = ("import numpy as np, scipy.sparse as sp, seistomo\n"
            "seistomo.lsqr(sp.eye(3, format='csr'), np.ones(3))\n")
    env = dict(os.environ, RAYON_NUM_THREADS="100000")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0 and "RAYON_NUM_THREADS=100000" in r.stderr, r.stderr
