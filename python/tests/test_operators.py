"""seistomo.lsmr against scipy.sparse.linalg.lsmr, and operators given by their products
(LinearOperator, PyLops, duck-typed matvec/rmatvec/shape; GMRES's M as a LinearOperator or a
callable) against SciPy on the same operators. Run by `make test-python`."""

import numpy as np
import pytest
import scipy
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator, aslinearoperator, spilu
from scipy.sparse.linalg import gmres as scipy_gmres
from scipy.sparse.linalg import lsmr as scipy_lsmr
from scipy.sparse.linalg import lsqr as scipy_lsqr

import seistomo
from test_seistomo import (DATA, ILL, WELL, rel, scipy_gmres_run, system, within_2pct,
                           within_scipys_spread, x0_for)

import scipy.io as sio

TIGHT = dict(atol=1e-10, btol=1e-10, conlim=1e14)
OLD_GMRES = tuple(int(v) for v in scipy.__version__.split(".")[:2]) < (1, 12)


# LSMR's iterates amplify rounding once Ritz values converge, as LSQR's do (tests/lsmr.rs): the
# iteration count at a stopping test depends on the order of the sums. seistomo's A^T u summed
# in SciPy's order (transpose="scatter": SciPy's A.T @ u scatters A's rows in row order) stops
# within 2 % of SciPy; the default CSC transpose (four-lane column sums) within 3 % (well1033:
# 193 against 199; SciPy itself stops after 196-200 with its products perturbed by 1e-16).
LSMR_VARIANTS = {
    "defaults": {},
    "tight": dict(TIGHT, maxiter=100_000),
    "damp": dict(TIGHT, damp=0.01, maxiter=100_000),
    "x0": dict(TIGHT, maxiter=100_000, x0=True),
    "maxiter": dict(maxiter=10, damp=0.05),
    "conlim": dict(atol=1e-12, btol=1e-12, conlim=1e3),
}
LSMR_CONVERGED = {"tight", "damp", "x0", "maxiter"}


@pytest.mark.parametrize("variant", sorted(LSMR_VARIANTS))
@pytest.mark.parametrize("name", WELL + ILL)
def test_lsmr_matches_scipy(name, variant):
    A, b = system(name)
    kw = dict(LSMR_VARIANTS[variant])
    if kw.pop("x0", False):
        kw["x0"] = x0_for(A)
    # threads=2: the scatter transpose sums one buffer per thread, so the order of A^T u's sums
    # (and on illc1033 the iteration LSMR stops at, by up to 2 %) depends on the thread count;
    # pinned, the comparison is the same on every machine (docs/lsmr.md)
    ours = seistomo.lsmr(A, b, backend="cpu", transpose="scatter", threads=2, **kw)
    ref = scipy_lsmr(A, b, **kw)
    assert len(ours) == 8
    x, istop, itn, normr, normar, norma, conda, normx = ours
    assert istop == ref[1], f"{name} {variant}: istop {istop} vs SciPy {ref[1]}"
    assert within_scipys_spread(name, itn, ref[2]), (
        f"{name} {variant}: {itn} iterations vs SciPy {ref[2]}")
    assert x.shape == ref[0].shape and np.isfinite(x).all()
    d = rel(x, ref[0])
    if variant in LSMR_CONVERGED and name in WELL:
        assert d <= 1e-8, f"{name} {variant}: x differs by {d:e}"
        assert abs(normr - ref[3]) <= 1e-8 * ref[3] and abs(normx - ref[7]) <= 1e-8 * ref[7]
    elif variant in LSMR_CONVERGED:  # ill-conditioned: cond^2 eps (tests/lsmr.rs)
        assert d <= 1e-6, f"{name} {variant}: x differs by {d:e}"
    if variant == "maxiter":  # norma and conda accumulate per iteration: equal at equal itn
        assert abs(norma - ref[5]) <= 1e-8 * ref[5] and abs(conda - ref[6]) <= 1e-8 * ref[6]
        assert abs(normar - ref[4]) <= 1e-8 * ref[4]
    if kw.get("damp", 0) == 0:  # the reported residual is that of the returned x
        assert abs(np.linalg.norm(b - A @ x) - normr) <= 1e-6 * normr


def test_lsmr_edge_cases_like_scipy(capsys):
    A = sp.random(30, 10, density=0.5, random_state=1, format="csr")
    b = np.ones(30)
    for M, bb, kw in [(A, b, dict(maxiter=0)), (A, b, dict(maxiter=1)),
                      (sp.csr_matrix((30, 10)), b, {}), (A, np.zeros(30), {}),
                      (A, np.zeros(30), dict(x0=np.ones(10))), (A, b, dict(damp=1e3)),
                      (A, b, dict(conlim=0.0, atol=0.0, btol=0.0, maxiter=40))]:
        ours, ref = seistomo.lsmr(M, bb, **kw), scipy_lsmr(M, bb, **kw)
        assert ours[1:3] == ref[1:3], kw
        assert rel(ours[0], ref[0]) <= 1e-8 or not ref[0].any(), kw
    seistomo.lsmr(A, b, show=True)
    assert "LSMR" in capsys.readouterr().out
    with pytest.raises(ValueError, match="maxiter"):
        seistomo.lsmr(A, b, maxiter=-1)


def test_lsmr_callback_and_report():
    A, b = system("well1033")
    seen = []
    r = seistomo.lsmr(A, b, callback=lambda *a: seen.append(a), callback_every=10)
    assert [s[0] for s in seen] == list(range(10, r[2] + 1, 10))
    assert seistomo.last_info["itn"] == r[2] and seistomo.last_info["backend"]


# Operators given by their products: SciPy and seistomo call the same products, so the
# iterations follow each other closer than on the matrix (only the norms are summed apart).
def duck(A):
    """Anything with matvec, rmatvec and shape (no LinearOperator)."""

    class Duck:
        shape = A.shape

        def matvec(self, x):
            return A @ x

        def rmatvec(self, y):
            return A.T @ y

    return Duck()


@pytest.mark.parametrize("solver", ["lsqr", "lsmr"])
@pytest.mark.parametrize("name", WELL)
@pytest.mark.parametrize("wrap", ["aslinearoperator", "duck"])
def test_operator_equals_scipy_on_the_same_operator(solver, name, wrap):
    A, b = system(name)
    op = aslinearoperator(A) if wrap == "aslinearoperator" else duck(A)
    limit = {"lsqr": "iter_lim", "lsmr": "maxiter"}[solver]
    ours = getattr(seistomo, solver)(op, b, **TIGHT, **{limit: 100_000})
    ref = {"lsqr": scipy_lsqr, "lsmr": scipy_lsmr}[solver](aslinearoperator(A), b, **TIGHT,
                                                           **{limit: 100_000})
    assert ours[1] == ref[1] and within_2pct(ours[2], ref[2]), (ours[1:3], ref[1:3])
    d = rel(ours[0], ref[0])
    assert d <= 1e-8, f"{solver} {name} {wrap}: x differs by {d:e}"
    assert "products in Python" in seistomo.last_info["backend"]


def pylops_system():
    """australia's G and d with damping rows 0.1 I: PyLops' VStack([MatrixMult(G),
    Diagonal(w)]) when PyLops is installed, else a duck-typed class with the same products."""
    a = DATA / "australia"
    G = sio.mmread(str(a / "G.mtx.gz")).tocsr()
    d = np.loadtxt(a / "d.txt", comments="#")
    n = G.shape[1]
    w = 0.1 * np.ones(n)
    b = np.concatenate([d, np.zeros(n)])
    try:
        import pylops

        op = pylops.VStack([pylops.MatrixMult(G), pylops.Diagonal(w)])
    except ImportError:

        class VStackLike:  # what VStack([MatrixMult(G), Diagonal(w)]) computes
            shape = (G.shape[0] + n, n)
            dtype = np.dtype(np.float64)

            def matvec(self, x):
                return np.concatenate([G @ x, w * x])

            def rmatvec(self, y):
                return G.T @ y[: G.shape[0]] + w * y[G.shape[0]:]

        op = VStackLike()
    return op, b


@pytest.mark.parametrize("solver", ["lsqr", "lsmr"])
def test_pylops_vstack_equals_scipy(solver):
    op, b = pylops_system()
    limit = {"lsqr": "iter_lim", "lsmr": "maxiter"}[solver]
    ours = getattr(seistomo, solver)(op, b, **TIGHT, **{limit: 100_000})
    ref = {"lsqr": scipy_lsqr, "lsmr": scipy_lsmr}[solver](op, b, **TIGHT, **{limit: 100_000})
    print(f"{type(op).__name__} {solver}: istop {ours[1]} itn {ours[2]} (SciPy {ref[1]} "
          f"{ref[2]}), x rel diff {rel(ours[0], ref[0]):.2e}")
    assert ours[1] == ref[1] and within_2pct(ours[2], ref[2])
    assert rel(ours[0], ref[0]) <= 1e-8


def test_operator_errors_are_clear():
    A = sp.random(20, 8, density=0.5, random_state=2, format="csr")
    b = np.ones(20)

    class Short:
        shape = (20, 8)

        def matvec(self, x):
            return np.ones(19)

        def rmatvec(self, y):
            return np.ones(8)

    with pytest.raises(ValueError, match=r"A \(Short\)\.matvec returned an array of shape"):
        seistomo.lsqr(Short(), b)

    class Raises(Short):
        def matvec(self, x):
            raise ZeroDivisionError("inside matvec")

    with pytest.raises(ZeroDivisionError, match="inside matvec"):
        seistomo.lsmr(Raises(), b)

    class NoTranspose:
        shape = (20, 8)

        def matvec(self, x):
            return A @ x

    with pytest.raises(TypeError, match="rmatvec"):
        seistomo.lsqr(NoTranspose(), b)

    class Complex(Short):
        def rmatvec(self, y):
            return np.ones(8) * 1j

        def matvec(self, x):
            return np.ones(20)

    with pytest.raises(TypeError, match=r"rmatvec returned values of dtype complex"):
        seistomo.lsqr(Complex(), b)

    class NaNs(Short):
        def matvec(self, x):
            return np.full(20, np.nan)

    with pytest.raises(ValueError, match="not finite"):
        seistomo.lsqr(NaNs(), b)
    with pytest.raises(ValueError, match="CPU backend"):
        seistomo.lsmr(aslinearoperator(A), b, backend="cuda")
    with pytest.raises(ValueError, match="shape mismatch"):
        seistomo.lsqr(aslinearoperator(A), np.ones(19))
    # neither a matrix nor an operator: a clear TypeError, not "dtype object"
    with pytest.raises(TypeError, match="matvec, rmatvec and shape"):
        seistomo.lsqr(object(), b)


def test_every_operator_input_runs():
    A, b = system("well1033")
    x = seistomo.lsqr(A, b)[0]
    for op in [aslinearoperator(A), duck(A), LinearOperator(A.shape, matvec=lambda v: A @ v,
                                                           rmatvec=lambda v: A.T @ v)]:
        assert rel(seistomo.lsqr(op, b)[0], x) <= 1e-6


def ilu(A):
    f = spilu(A.tocsc())
    n = A.shape[0]
    return f, LinearOperator((n, n), matvec=f.solve, dtype=float)


# west0479 is left out: with ILU its iteration count is chaotic (SciPy itself takes 1217-2545
# iterations where its M is perturbed by 1e-16; 1712 unperturbed).
ILU_CASES = ["square_gen/convdiff16.mtx.gz", "square_gen/convdiff24.mtx.gz",
             "square_gen/poisson16.mtx.gz", "square/bayer10.mtx.gz"]


@pytest.mark.skipif(not OLD_GMRES, reason="seistomo follows SciPy 1.10's gmres")
@pytest.mark.parametrize("file", ILU_CASES)
def test_gmres_ilu_operator_equals_scipy_iterations(file):
    A = sio.mmread(str(DATA / file)).tocsr()
    A.sum_duplicates()
    n = A.shape[0]
    b = np.ones(n)
    f, M = ilu(A)
    xs, info_s, its_s = scipy_gmres_run(A, b, M, 16, 1e-10, 300)
    for AA, MM in [(A, M), (aslinearoperator(A), f.solve), (A, f.solve)]:
        r = seistomo.gmres(AA, b, rtol=1e-10, restart=16, maxiter=300, M=MM, orthog="mgs",
                           backend="cpu")
        assert (r[1] == 0) == (info_s == 0), f"{file}: info {r[1]} vs SciPy {info_s}"
        assert r.iterations == its_s, f"{file}: {r.iterations} iterations vs SciPy {its_s}"
        assert r.precond == "M (Python)"
        if info_s == 0:
            assert rel(r[0], xs) <= 1e-6


@pytest.mark.skipif(not OLD_GMRES, reason="seistomo follows SciPy 1.10's gmres")
def test_gmres_scipy_arguments():
    A = sio.mmread(str(DATA / "square_gen" / "convdiff16.mtx.gz")).tocsr()
    n = A.shape[0]
    b = np.ones(n)
    # restart=None is SciPy's 20
    r = seistomo.gmres(A, b, restart=None, rtol=1e-8, orthog="mgs")
    assert r[1] == 0
    assert r.iterations == seistomo.gmres(A, b, restart=20, rtol=1e-8, orthog="mgs").iterations
    # callback_type: "pr_norm" and "legacy" every inner iteration (the preconditioned residual
    # over ||b||, as SciPy), "x" after every cycle
    for ct in ["pr_norm", "legacy"]:
        ours, theirs = [], []
        seistomo.gmres(A, b, rtol=1e-8, restart=16, callback=ours.append, callback_type=ct,
                       orthog="mgs")
        scipy_gmres(A, b, tol=1e-8, atol=0, restart=16, callback=theirs.append, callback_type=ct)
        assert len(ours) == len(theirs)
        assert rel(ours, theirs) <= 1e-6
    xs = []
    r = seistomo.gmres(A, b, rtol=1e-8, restart=8, callback=xs.append, callback_type="x")
    assert len(xs) == r.cycles and all(x.shape == (n,) for x in xs)
    assert rel(xs[-1], r[0]) == 0
    # legacy: maxiter counts inner iterations
    r = seistomo.gmres(A, b, rtol=1e-14, restart=8, maxiter=5, callback=lambda _: None,
                       callback_type="legacy")
    assert r.iterations == 5 and r[1] == 5
    with pytest.raises(ValueError, match="callback_type"):
        seistomo.gmres(A, b, callback=print, callback_type="resid")
    with pytest.raises(ValueError, match="needs the matrix"):
        seistomo.gmres(aslinearoperator(A), b, M="jacobi")
    with pytest.raises(ValueError, match=r"M has shape"):
        seistomo.gmres(A, b, M=sp.eye(n + 1))

    def bad_m(r):
        raise RuntimeError("M failed")

    with pytest.raises(RuntimeError, match="M failed"):
        seistomo.gmres(A, b, M=bad_m)


def _rows(text):
    """The iteration numbers of a show=True table's rows."""
    rows = []
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0].isdigit() and len(parts) >= 4 and "e" in parts[1].lower():
            rows.append(int(parts[0]))
    return rows


def test_lsmr_show_prints_scipys_table(capsys):
    # the same rows as SciPy's (iteration numbers), the heading every 20 rows, its summary
    rng = np.random.default_rng(1)
    from scipy.sparse.linalg import lsmr as scipy_lsmr

    graded = sp.diags(np.logspace(0, -4, 40))
    cases = [
        (sp.random(300, 60, density=0.05, random_state=2, format="csr") + sp.eye(300, 60), 1e-10),
        (sp.random(2000, 400, density=0.05, random_state=3, format="csr") + sp.eye(2000, 400),
         1e-10),
        # n <= 40: every row, more than 20 of them (the heading again)
        ((sp.random(500, 40, density=0.3, random_state=4, format="csr") @ graded).tocsr(), 1e-12),
    ]
    for A, tol in cases:
        m, n = A.shape
        b = rng.standard_normal(m)
        r = seistomo.lsmr(A, b, show=True, backend="cpu", atol=tol, btol=tol, conlim=1e12)
        ours = capsys.readouterr().out
        s = scipy_lsmr(A, b, show=True, atol=tol, btol=tol, conlim=1e12)
        theirs = capsys.readouterr().out
        assert r[2] == s[2] and r[1] == s[1]
        # SciPy repeats the last row after its summary: leave that copy out
        assert _rows(ours) == _rows(theirs)[:-1], (_rows(ours), _rows(theirs))
        assert ours.count("norm Ar  compatible") == theirs.count("norm Ar  compatible")
        for line in ["LSMR            Least-squares solution of  Ax = b", "LSMR finished",
                     f"The matrix A has {m} rows and {n} columns", "istop ="]:
            assert line in ours


def test_pylops_operators_of_matrices_run_natively():
    # VStack([MatrixMult(G), Diagonal(w)]) runs as its sparse matrix; an operator that is not
    # made of matrices (a derivative stencil) through its products
    pylops = pytest.importorskip("pylops")
    op, b = pylops_system()
    r = seistomo.lsqr(op, b, **TIGHT)
    assert "run natively" in r.info["backend"], r.info["backend"]
    assert "products in Python" not in r.info["backend"]
    assert seistomo.last_info["backend"] == r.info["backend"]
    d = pylops.FirstDerivative(30, dtype="float64")
    r2 = seistomo.lsqr(d, np.linspace(0.0, 1.0, 30), iter_lim=5)
    assert "products in Python" in r2.info["backend"], r2.info["backend"]
    g = seistomo.gmres(pylops.Diagonal(np.arange(1.0, 21.0)), np.ones(20))
    assert g[1] == 0 and np.allclose(g[0], 1.0 / np.arange(1.0, 21.0))
