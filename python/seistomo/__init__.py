"""seistomo from Python: LSQR, LSMR and GMRES on the CPU or a CUDA GPU with SciPy's signatures
and results, the dataset format, config runs, and model files that xarray opens.

    import seistomo
    x, istop, itn, r1norm, r2norm, anorm, acond, arnorm, xnorm, var = seistomo.lsqr(A, b)
    x, istop, itn, normr, normar, norma, conda, normx = seistomo.lsmr(A, b)
    x, info = seistomo.gmres(A, b, M="jacobi")

A is a scipy.sparse matrix or a dense array (copied once, solved natively on the CPU or GPU), or
an operator given by its products: a scipy.sparse.linalg.LinearOperator, a PyLops operator,
anything with matvec, rmatvec and shape (the solve runs natively on the CPU, calling back into
Python for each product).
    op = seistomo.Operator(A)                           # copied and set up once
    x = seistomo.lsqr(op, b, damp=0.01)[0]              # then reused by any number of solves
    ds = seistomo.open_model("out/demo/model.h5")      # xarray.Dataset (dict without xarray)
    A = seistomo.mmread("A.mtx.gz")                     # Matrix Market on every thread

The module is one process: the CPU (rayon threads) and CUDA backends, no MPI (use the
`seistomo` CLI under mpirun for that). docs/python.md walks through it.
"""

import json
import os
import re
import sys
import threading
from collections.abc import MutableMapping

import numpy as np

from . import _native as _ext

__version__ = _ext.__version__
__all__ = [
    "lsqr",
    "lsmr",
    "lcurve",
    "gmres",
    "Operator",
    "Dataset",
    "invert",
    "open_model",
    "mmread",
    "mmwrite",
    "cuda_available",
    "last_info",
    "LsqResult",
    "set_console",
]

def _flush_console():
    """Write the console lines the native code queued to sys.stdout / sys.stderr."""
    for to_err, text in _ext.console_drain():
        (sys.stderr if to_err else sys.stdout).write(text)


class _Native:
    """The native module, each function followed by writing the console lines it queued to
    Python's sys.stdout and sys.stderr (set_console)."""

    def __getattr__(self, name):
        f = getattr(_ext, name)
        if not callable(f) or isinstance(f, type):
            return f

        def call(*args, **kwargs):
            try:
                return f(*args, **kwargs)
            finally:
                _flush_console()

        return call


_native = _Native()


def set_console(where="python"):
    """Where seistomo's own messages (notes, progress, warnings of the native code) go:
    "python" (the default on import): Python's sys.stdout and sys.stderr, so that a notebook
    or a redirected sys.stdout sees them, written after each call (and while a call with
    threads= runs); "native": the process's stdout and stderr directly, as the CLI writes."""
    if where not in ("python", "native"):
        raise ValueError(f'set_console: where must be "python" or "native", not {where!r}')
    _flush_console()
    _ext.console_to_python(where == "python")


set_console("python")

class _ThreadInfo(MutableMapping):
    """A dict of its own in each thread: what the thread's last call reported."""

    def __init__(self):
        self._local = threading.local()

    def _d(self):
        if not hasattr(self._local, "d"):
            self._local.d = {}
        return self._local.d

    def __getitem__(self, k):
        return self._d()[k]

    def __setitem__(self, k, v):
        self._d()[k] = v

    def __delitem__(self, k):
        del self._d()[k]

    def __iter__(self):
        return iter(self._d())

    def __len__(self):
        return len(self._d())

    def __repr__(self):
        return repr(self._d())


#: What this thread's last lsqr/lsmr/gmres call reported beyond SciPy's tuple (backend used,
#: seconds, ...): each thread sees its own. Each call's own is also its result's .info.
last_info = _ThreadInfo()


class LsqResult(tuple):
    """SciPy's tuple (lsqr's 10 values, lsmr's 8), unpacked and indexed as SciPy's, with this
    call's own report as .info: istop, itn, stop_reason, the norms, seconds (the solve) and
    backend (what seistomo.last_info holds in this thread after the call)."""

    def __new__(cls, values, info):
        self = super().__new__(cls, values)
        self.info = info
        return self


def cuda_available():
    """(True, description) when a usable CUDA GPU is present, else (False, why not)."""
    return _native.cuda_available()


def _sparse():
    import scipy.sparse as sp

    return sp


def _check_dtype(dtype, what):
    dtype = np.dtype(dtype)
    if dtype.kind == "c":
        raise TypeError(f"{what}: complex values are not supported (dtype {dtype})")
    if dtype.kind not in "fiub":
        raise TypeError(f"{what}: dtype {dtype} is not a real number type")


def _index_array(arr, what):
    """A 1-D integer index array, or TypeError/ValueError naming it."""
    a = np.asarray(arr)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{what} must hold integers (dtype {a.dtype})")
    if a.ndim != 1:
        raise ValueError(f"{what} must be 1-D (got shape {a.shape})")
    return a


def _check_indices(idx, limit, what, dim):
    """Every index of idx in 0..limit, else a ValueError naming the first bad entry."""
    if idx.size == 0:
        return
    bad = (idx < 0) | (idx >= limit)
    if bad.any():
        k = int(np.argmax(bad))
        raise ValueError(f"{what}[{k}] = {int(idx[k])} is out of range: {dim} indices must be "
                         f"in 0..{limit - 1}")


def _check_sparse(A, what):
    """Validate a scipy.sparse matrix's own arrays before SciPy's compiled routines touch them
    (a corrupted indptr makes sort_indices/tocsr read or write out of bounds): shape, indptr
    (length, start, never decreasing, end within the stored entries), indices in range."""
    shape = A.shape
    if len(shape) != 2 or any(int(s) < 0 for s in shape):
        raise ValueError(f"{what} must be 2-D with sizes >= 0 (got shape {shape})")
    fmt = A.format
    if fmt in ("csr", "csc", "bsr"):
        blocks = A.blocksize if fmt == "bsr" else (1, 1)
        if fmt == "csc":
            major, minor, mname, dim = shape[1], shape[0], "column", "row"
        else:
            major, minor, mname, dim = shape[0] // blocks[0], shape[1] // blocks[1], "row", "column"
        indptr = _index_array(A.indptr, f"{what}.indptr")
        indices = _index_array(A.indices, f"{what}.indices")
        nstored = len(A.data)
        if len(indptr) != major + 1:
            raise ValueError(f"{what}.indptr has {len(indptr)} entries, expected {major + 1} "
                             f"({mname}s + 1)")
        if indptr[0] != 0:
            raise ValueError(f"{what}.indptr[0] = {int(indptr[0])}: it must start at 0")
        step = np.diff(indptr)
        if (step < 0).any():
            k = int(np.argmax(step < 0))
            raise ValueError(f"{what}.indptr decreases at {mname} {k} (indptr[{k}] = "
                             f"{int(indptr[k])}, indptr[{k + 1}] = {int(indptr[k + 1])})")
        end = int(indptr[-1])
        if end > len(indices) or end > nstored:
            raise ValueError(f"{what}.indptr ends at {end} but {what} stores {len(indices)} "
                             f"indices and {nstored} values")
        _check_indices(indices[:end], minor, f"{what}.indices", dim)
    elif fmt == "coo":
        row = _index_array(A.row, f"{what}.row")
        col = _index_array(A.col, f"{what}.col")
        if not (len(row) == len(col) == len(A.data)):
            raise ValueError(f"{what}: {len(row)} row indices, {len(col)} column indices and "
                             f"{len(A.data)} values")
        _check_indices(row, shape[0], f"{what}.row", "row")
        _check_indices(col, shape[1], f"{what}.col", "column")


def _csr_parts(A, what="A"):
    """(shape, indptr bytes u64, indices bytes u32, data bytes f64) of a canonical CSR copy of
    A (any scipy.sparse matrix or array, or a dense 2-D array). The matrix's arrays are checked
    here before SciPy converts or sorts them."""
    sp = _sparse()
    if sp.issparse(A):
        _check_dtype(A.dtype, what)
        _check_sparse(A, what)
        A = A.tocsr()
        if not A.has_canonical_format:
            A = A.copy()
            A.sum_duplicates()
    else:
        arr = np.asarray(A)
        if arr.dtype == object:
            raise TypeError(
                f"{what}: expected a scipy.sparse matrix, a 2-D array of real numbers, or an "
                f"operator with matvec, rmatvec and shape (got {type(A).__name__})")
        _check_dtype(arr.dtype, what)
        if arr.ndim != 2:
            raise ValueError(f"{what} must be 2-D (got shape {arr.shape})")
        A = sp.csr_matrix(arr)
    m, n = A.shape
    if m == 0 or n == 0:
        raise ValueError(f"{what} is empty ({m} x {n})")
    if n > 2**32:
        raise ValueError(f"{what} has {n} columns: more than 32-bit column indices hold")
    indptr = np.ascontiguousarray(A.indptr, dtype=np.uint64)
    indices = np.ascontiguousarray(A.indices, dtype=np.uint32)
    data = np.ascontiguousarray(A.data, dtype=np.float64)
    return (int(m), int(n)), indptr.tobytes(), indices.tobytes(), data.tobytes()


def _vec(v, what, n=None):
    arr = _vec_held(v, what)
    if n is not None and arr.shape[0] != n:
        raise ValueError(f"shape mismatch: {what} has {arr.shape[0]} entries, expected {n}")
    return arr.tobytes()


def _vec_held(v, what):
    """v as a C-contiguous, aligned float64 1-D array (v itself where it already is one, else a
    copy): the caller keeps it and passes (arr.ctypes.data, len) to a native function that
    copies it (one parallel copy of a large right-hand side instead of tobytes and another)."""
    arr = np.asarray(v)
    if arr.dtype == object:
        raise TypeError(f"{what}: dtype object is not a real number type")
    _check_dtype(arr.dtype, what)
    if arr.ndim == 2 and 1 in arr.shape:
        arr = arr.reshape(-1)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be a 1-D array (got shape {arr.shape})")
    return np.require(arr, dtype=np.float64, requirements=["C", "A"])


def _array(b):
    return np.frombuffer(b, dtype=np.float64).copy()


def _is_operator(A):
    """Whether A is given by its products (a LinearOperator, a PyLops operator, anything with
    matvec and shape) rather than by its entries (a sparse matrix or an array)."""
    if _sparse().issparse(A) or isinstance(A, np.ndarray):
        return False
    return hasattr(A, "matvec") and hasattr(A, "shape")


def _pylops_matrix(A):
    """A PyLops operator built only of matrices (MatrixMult), diagonals (Diagonal) and
    vertical stacks of them (VStack): the same matrix as scipy.sparse CSR, so that it runs
    natively (every backend, no Python call per product). None for anything else (it then runs
    through its products)."""
    cls = type(A)
    if not (getattr(cls, "__module__", "") or "").startswith("pylops"):
        return None
    sparse = _sparse()
    kind = cls.__name__
    try:
        if np.dtype(A.dtype).kind != "f":
            return None
        if kind == "MatrixMult":
            M = A.A
            if tuple(M.shape) != tuple(A.shape):  # otherdims: a block-diagonal repeat
                return None
            return sparse.csr_matrix(M, dtype=np.float64)
        if kind == "Diagonal":
            d = np.asarray(A.diag, dtype=np.float64).reshape(-1)
            if A.shape != (d.size, d.size):
                return None
            return sparse.diags(d, format="csr")
        if kind == "VStack":
            parts = [_pylops_matrix(op) for op in A.ops]
            if any(p is None for p in parts) or not parts:
                return None
            M = sparse.vstack(parts, format="csr")
            return M if tuple(M.shape) == tuple(A.shape) else None
    except (AttributeError, TypeError, ValueError):
        return None
    return None


class _Products:
    """An operator's products as the native solver calls them: matvec(buf) and rmatvec(buf)
    take a bytearray of float64 (viewed by NumPy without a copy) and return bytes, after
    checking what the user's operator returned (shape, real finite values; errors name it)."""

    def __init__(self, op, name, shape, transpose=True):
        self.op = op
        self.name = name
        self.m, self.n = shape
        self._mv = op.matvec if hasattr(op, "matvec") else op
        self._rmv = getattr(op, "rmatvec", None) if transpose else None

    def _out(self, y, k, what):
        y = np.asarray(y)
        if y.dtype == object or y.dtype.kind not in "fiub":
            raise TypeError(f"{self.name}.{what} returned values of dtype {y.dtype}, "
                            f"not real numbers")
        if y.ndim == 2 and y.shape[1] == 1:
            y = y[:, 0]
        if y.shape != (k,):
            raise ValueError(f"{self.name}.{what} returned an array of shape {y.shape}, "
                             f"expected ({k},)")
        y = np.ascontiguousarray(y, dtype=np.float64)
        if not np.isfinite(y).all():
            raise ValueError(f"{self.name}.{what} returned values that are not finite")
        return y.tobytes()

    def matvec(self, buf):
        return self._out(self._mv(np.frombuffer(buf, dtype=np.float64)), self.m, "matvec")

    def rmatvec(self, buf):
        return self._out(self._rmv(np.frombuffer(buf, dtype=np.float64)), self.n, "rmatvec")


def _operator(A, what="A", transpose=True):
    """A given by its products, checked: (shape, _Products)."""
    shape = getattr(A, "shape", None)
    try:
        m, n = (int(v) for v in shape)
    except (TypeError, ValueError):
        raise TypeError(f"{what}: shape must be (rows, columns), got {shape!r}") from None
    if m <= 0 or n <= 0:
        raise ValueError(f"{what} is empty ({m} x {n})")
    dtype = getattr(A, "dtype", None)
    if dtype is not None:
        try:
            kind = np.dtype(dtype).kind
        except TypeError:
            kind = "f"
        if kind == "c":
            raise TypeError(f"{what}: complex operators are not supported (dtype {dtype})")
    if transpose and not callable(getattr(A, "rmatvec", None)):
        raise TypeError(f"{what} ({type(A).__name__}) has no rmatvec: LSQR and LSMR need "
                        f"A^T y as well as A x")
    return (m, n), _Products(A, f"{what} ({type(A).__name__})", (m, n), transpose)


def _check_iter_lim(iter_lim, what):
    if iter_lim is None:
        return None
    iter_lim = int(iter_lim)
    if iter_lim < 0:
        raise ValueError(f"{what} must be >= 0 (got {iter_lim})")
    return iter_lim


#: The layout options of lsqr and lsmr with their defaults: fixed when an Operator is made.
_LAYOUT = dict(backend="auto", precision="f64", transpose="auto", lsqr_loop="auto",
               storage="auto", reorder="none")


class Operator:
    """A matrix copied and prepared once for any number of lsqr and lsmr solves.

        op = seistomo.Operator(A, backend="auto", storage="auto", reorder="none")
        for damp in (0.1, 0.03, 0.01):
            x, istop, itn, *_ = seistomo.lsqr(op, b, damp=damp)

    Operator(A, ...) does what every lsqr(A, ...) call does before its iterations, once: A (any
    scipy.sparse matrix or a dense array, as lsqr takes it) copied into the library's CSR and
    checked, the backend started, the rows laid out (storage, reordering) and the operator
    built (on a GPU: uploaded). lsqr(op, b, ...) and lsmr(op, b, ...) then only solve: b, x0,
    damp (applied by the solver, the matrix is never changed), the tolerances and callbacks may
    differ from call to call, and each result is the one lsqr(A, b, ...) with the same options
    returns (bit for bit on the CPU). backend, precision, transpose, lsqr_loop, storage and
    reorder are lsqr's options, fixed here (passing another value to lsqr(op, ...) is a
    ValueError). The operator lives on the Rust side (on a GPU, in device memory) until
    close() or until the object is collected; `with seistomo.Operator(A) as op:` closes it.

    Attributes: shape, nnz (stored nonzeros), dtype (float64), backend ("cpu" or "cuda"),
    backend_detail, storage ("csr" or "compact": what the operator stores), precision,
    ordering (the row order used, in words), setup_seconds (this constructor, the copy of A
    included), threads (its own pool of that many CPU threads; None: the process's pool) and
    closed.
    """

    def __init__(self, A, backend="auto", *, precision="f64", transpose="auto",
                 lsqr_loop="auto", storage="auto", reorder="none", threads=None):
        import time

        t = time.perf_counter()
        if isinstance(A, Operator):
            raise TypeError("A is already a seistomo.Operator: pass it to lsqr/lsmr as it is")
        if _is_operator(A):
            raise TypeError(
                f"seistomo.Operator needs a matrix's entries (a scipy.sparse matrix or an "
                f"array); {type(A).__name__} is given by its products: pass it to lsqr/lsmr "
                f"as it is")
        self._options = dict(backend=str(backend), precision=str(precision),
                             transpose=str(transpose), lsqr_loop=str(lsqr_loop),
                             storage=str(storage), reorder=str(reorder))
        shape, ip, ix, data = _csr_parts(A)
        o = self._options
        self.threads = _threads(threads)
        self._plan = _native.Plan(shape, ip, ix, data, _layout(**o), self.threads)
        _flush_console()
        del ip, ix, data
        info = self._plan.info()
        self.shape = tuple(int(v) for v in info["shape"])
        self.nnz = int(info["nnz"])
        self.backend = info["backend"]
        self.backend_detail = info["backend_detail"]
        self.storage = info["storage"]
        self.precision = info["precision"]
        self.ordering = info["ordering"]
        self.setup_seconds = time.perf_counter() - t

    dtype = np.dtype(np.float64)

    @property
    def closed(self):
        return self._plan.closed

    def close(self):
        """Free the prepared operator (and its GPU memory) now; later solves raise ValueError."""
        self._plan.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self.closed else f"{self.backend}, {self.storage}"
        return (f"seistomo.Operator(shape={self.shape}, nnz={self.nnz}, {state}, "
                f"setup {self.setup_seconds:.3g} s)")

    def _check_options(self, given):
        """The layout options of a call on this operator: the defaults or this one's values."""
        for k, v in given.items():
            if v != _LAYOUT[k] and str(v) != self._options[k]:
                raise ValueError(
                    f"{k}={v!r}: the layout options are fixed when the Operator is made (this "
                    f"one has {k}={self._options[k]!r}); make another Operator(A, {k}={v!r})")


def _layout(backend, precision, transpose, lsqr_loop, storage, reorder):
    """The layout options of lsqr, lsmr and Operator as the native side takes them: one tuple
    of strings (checked there)."""
    return (str(backend), str(precision), str(transpose), str(lsqr_loop), str(storage),
            str(reorder))


def _threads(threads):
    """threads= as the native side takes it: None (rayon's pool: RAYON_NUM_THREADS or the
    cores) or a count (checked there: 1..=4096)."""
    if threads is None:
        return None
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)):
        raise TypeError(f"threads must be an int or None (got {type(threads).__name__})")
    if threads < 1:
        raise ValueError(f"threads must be >= 1 (got {threads})")
    return int(threads)


def _callback(callback, callback_type, method):
    """The callback as the native side calls it, and whether it gets x: callback_type None
    (the iteration's scalars) or "x" (x, as an array in A's column order)."""
    if callback_type not in (None, "x"):
        raise ValueError(f"unknown callback_type {callback_type!r} (None or 'x')")
    if callback is None or callback_type is None:
        return callback, False
    return (lambda xb: callback(_array(xb))), True


def _is_cupy(v):
    """Whether v is a CuPy array or a cupyx.scipy.sparse matrix (without importing CuPy)."""
    mod = type(v).__module__ or ""
    return mod == "cupy" or mod.startswith(("cupy.", "cupyx."))


def _from_cupy(A, b, x0):
    """CuPy inputs: b and x0 to the host (vectors pass through the host as in every solve), A
    kept on the GPU (a dense CuPy array made a cupyx CSR matrix there). Returns (A, b, x0,
    whether the caller gave CuPy objects: then x and var go back as CuPy arrays)."""
    if not (_is_cupy(A) or _is_cupy(b) or _is_cupy(x0)):
        return A, b, x0, False
    import cupy

    if _is_cupy(A) and isinstance(A, cupy.ndarray):
        import cupyx.scipy.sparse as csp

        if A.ndim != 2:
            raise ValueError(f"A must be 2-D (got a CuPy array of shape {A.shape})")
        A = csp.csr_matrix(A)
    host = lambda v: cupy.asnumpy(v) if isinstance(v, cupy.ndarray) else v
    return A, host(b), host(x0), True


def _to_cupy(r, as_cupy):
    """A result's x and var (the first and, for lsqr, last entries) as CuPy arrays."""
    if not as_cupy:
        return r
    import cupy

    vals = list(r)
    vals[0] = cupy.asarray(vals[0])
    if len(vals) == 10:
        vals[9] = cupy.asarray(vals[9])
    return LsqResult(tuple(vals), r.info)


def _lsq_device(method, A, b, tol, iter_lim, calc_var, x0, backend, precision, callback,
                callback_every, layout, threads, callback_x):
    """lsqr / lsmr on a CuPy sparse matrix: A and its transpose (`A.T.tocsr()`, made by CuPy on
    the GPU) handed over by their device addresses and copied on the GPU into the library's
    storage (CSR with the explicit transpose, the device LSQR loop); the matrix never passes
    through the host. Returns (shape, the native result)."""
    import cupy

    transpose, lsqr_loop, storage, reorder = layout
    if backend not in ("auto", "cuda"):
        raise ValueError(f"backend={backend!r}: a CuPy matrix lies on the GPU and runs on the "
                         f"CUDA backend (A.get() gives it on the host for backend='cpu')")
    for k, v, ok in (("transpose", transpose, ("auto", "csc")), ("storage", storage,
                     ("auto", "csr")), ("reorder", reorder, ("none",))):
        if v not in ok:
            raise ValueError(f"{k}={v!r}: a CuPy matrix runs as CSR with its transpose as CuPy "
                             f"makes it ({k} {' or '.join(repr(o) for o in ok)})")
    if threads is not None or callback_x:
        raise ValueError("threads= and callback_type='x' are for matrices on the host; a CuPy "
                         "matrix runs without them")
    if precision not in ("f64", "f32"):
        raise ValueError(f"unknown precision '{precision}' (f64, f32)")
    A = A.tocsr()
    kind = A.dtype.kind
    if kind == "c":
        raise TypeError(f"A: complex values are not supported (dtype {A.dtype})")
    if kind not in "fiub":
        raise TypeError(f"A: dtype {A.dtype} is not a real number type")
    want = cupy.float32 if (precision == "f32" or A.dtype == cupy.float32) else cupy.float64
    if A.dtype != want:
        A = A.astype(want)
    if not A.has_canonical_format:
        A = A.copy()
        A.sum_duplicates()  # each row's columns sorted, repeats summed (on the GPU)
    AT = A.T.tocsr()  # the transpose by CuPy (cuSPARSE) on the GPU: rows sorted per column
    m, n = A.shape
    held = []  # the arrays whose addresses the native side reads, held until it returns

    def parts(M):
        """M's device addresses, its offsets as int32/int64 and columns as int32 (converted
        copies where M has other types: the caller's matrix is never changed)."""
        ip = M.indptr if M.indptr.dtype in (cupy.int32, cupy.int64) else M.indptr.astype(
            cupy.int64)
        ix = M.indices if M.indices.dtype == cupy.int32 else M.indices.astype(cupy.int32)
        held.extend((ip, ix, M.data))
        return (int(ip.data.ptr), int(ip.dtype.itemsize), int(ix.data.ptr) if M.nnz else 0,
                int(M.data.data.ptr) if M.nnz else 0)

    pa, pat = parts(A), parts(AT)
    bb = _vec(b, "b", m)
    x0b = None if x0 is None else _vec(x0, "x0", n)
    cupy.cuda.get_current_stream().synchronize()  # CuPy's work on A, AT and the copies done
    prec = "f32" if want == cupy.float32 else "f64"
    r = _native.lsqr_device((m, n), int(A.nnz), pa, pat, prec,
                            int(cupy.cuda.Device().id), bb, tol, iter_lim, bool(calc_var),
                            x0b, str(lsqr_loop), callback, int(callback_every), method)
    del A, AT, held  # held until the native call returned
    return (m, n), r


def _lsq(method, A, b, damp, atol, btol, conlim, iter_lim, calc_var, x0, backend, precision,
         callback, callback_every, transpose, lsqr_loop, storage, reorder, threads=None,
         callback_x=False):
    """The native LSQR or LSMR on A's entries, on a prepared Operator, or, for an operator
    given by its products, on its products. With callback_x a matrix goes through an Operator
    made for the call (the same stages: the result is the plain call's), whose solve loop
    shows x to the callback."""
    native = _pylops_matrix(A)
    if native is not None:
        shape, r = _lsq(method, native, b, damp, atol, btol, conlim, iter_lim, calc_var, x0,
                        backend, precision, callback, callback_every, transpose, lsqr_loop,
                        storage, reorder, threads, callback_x)
        note = f" (the PyLops {type(A).__name__}'s matrices, run natively)"
        r["backend"] += note
        r["info"]["backend"] += note
        last_info["backend"] = r["info"]["backend"]
        return shape, r
    if _is_cupy(A):
        tol = (float(damp), float(atol), float(btol), float(conlim))
        shape, r = _lsq_device(method, A, b, tol, iter_lim, calc_var, x0, backend, precision,
                               callback, callback_every,
                               (transpose, lsqr_loop, storage, reorder), threads, callback_x)
        r["info"] = {k: v for k, v in r.items() if k not in ("x", "var")}
        last_info.clear()
        last_info.update(r["info"])
        return shape, r
    if callback_x and not isinstance(A, Operator) and not _is_operator(A):
        with Operator(A, backend, precision=precision, transpose=transpose,
                      lsqr_loop=lsqr_loop, storage=storage, reorder=reorder,
                      threads=threads) as op:
            return _lsq(method, op, b, damp, atol, btol, conlim, iter_lim, calc_var, x0,
                        backend, precision, callback, callback_every, transpose, lsqr_loop,
                        storage, reorder, threads, callback_x)
    tol = (float(damp), float(atol), float(btol), float(conlim))
    if isinstance(A, Operator):
        A._check_options(dict(backend=backend, precision=precision, transpose=transpose,
                              lsqr_loop=lsqr_loop, storage=storage, reorder=reorder))
        if threads is not None and _threads(threads) != A.threads:
            raise ValueError(f"threads={threads}: an Operator's threads are fixed when it is "
                             f"made (this one has threads={A.threads}); make another "
                             f"Operator(A, threads={threads})")
        bv = _vec_held(b, "b")  # held here for the call: the native side reads its address
        x0b = None if x0 is None else _vec(x0, "x0")
        try:
            r = A._plan.solve(method, (bv.ctypes.data, bv.shape[0]), tol, iter_lim,
                              bool(calc_var), x0b, callback, int(callback_every),
                              bool(callback_x))
        finally:
            _flush_console()
        shape = A.shape
    elif _is_operator(A):
        shape, prods = _operator(A)
        bb = _vec(b, "b")
        x0b = None if x0 is None else _vec(x0, "x0")
        r = _native.lsq_operator(prods, shape, bb, method, tol, iter_lim, bool(calc_var), x0b,
                                 str(backend), callback, int(callback_every),
                                 _threads(threads), bool(callback_x))
    else:
        shape, ip, ix, data = _csr_parts(A)
        bb = _vec(b, "b")
        x0b = None if x0 is None else _vec(x0, "x0")
        layout = _layout(backend, precision, transpose, lsqr_loop, storage, reorder)
        try:
            r = _native.lsqr(shape, ip, ix, data, bb, tol, iter_lim, bool(calc_var), x0b,
                             layout, callback, int(callback_every), method, _threads(threads))
        except BaseException as e:
            # Ctrl-C or a callback's exception: the iterate it stopped at, in A's columns
            if isinstance(getattr(e, "x", None), bytes):
                e.x = _array(e.x)
            raise
    if iter_lim == 0 and r["itn"] == 0:
        r["istop"] = 0  # SciPy's loop never runs, so its istop stays 0
    r["info"] = {k: v for k, v in r.items() if k not in ("x", "var")}
    last_info.clear()
    last_info.update(r["info"])
    return shape, r


def lsqr(A, b, damp=0.0, atol=1e-6, btol=1e-6, conlim=1e8, iter_lim=None, show=False,
         calc_var=False, x0=None, *, backend="auto", precision="f64", callback=None,
         callback_every=1, transpose="auto", lsqr_loop="auto", storage="auto", reorder="none",
         threads=None, callback_type=None):
    """Least squares min ||b - A x||^2 + damp^2 ||x - x0||^2 by LSQR, as
    scipy.sparse.linalg.lsqr: same parameters, defaults and 10-tuple
    (x, istop, itn, r1norm, r2norm, anorm, acond, arnorm, xnorm, var).

    A: scipy.sparse matrix/array (csr, csc, coo, ...; int32/int64 indices; float32/float64) or
    a dense 2-D array; b: 1-D array (any stride), or B of shape (m, k): k solves in one batch
    on the CPU, each equal to its own (x, var (n, k); istop, itn and the norms arrays of k;
    SciPy takes one b only). damp may be a 1-D list of k dampings: k solves of b in one
    bidiagonalisation (about one solve's products), returned the same way, each equal to its
    own lsqr(A, b, damp=d, lsqr_loop="host"). backend: "auto" (CUDA when usable, else the
    CPU), "cpu" or "cuda"; precision "f32" stores the matrix values in f32 (GPU; CPU with
    compact storage). storage ("auto", "csr", "compact": 16-bit column deltas), reorder ("auto",
    "rows", "none") and lsqr_loop ("auto", "host", "device") are the CLI's options of the same
    names (docs/gpu.md). reorder defaults to "none" so that results follow SciPy's summation
    order (iterations within 2 %); reorder="auto" (the CLI's default) is 1.2-1.5x faster on large
    GPU systems. x comes back in the original order.
    A may also be an operator given by its products: a scipy.sparse.linalg.LinearOperator, a
    PyLops operator, anything with matvec, rmatvec and shape. Then the solve runs on the CPU
    backend, natively, and calls A.matvec / A.rmatvec in Python for each product (precision,
    storage, reorder, transpose and lsqr_loop do not apply; backend "cuda" is an error).
    A may be a seistomo.Operator: A copied and set up once, reused by every call (its layout
    options are fixed when it is made; the result is the plain call's).
    callback(itn, r1norm, r2norm, anorm, acond, arnorm, xnorm) runs every `callback_every`
    iterations (with callback_type="x": callback(x), x a copy of the iterate in A's column
    order); an exception it raises (and Ctrl-C, as KeyboardInterrupt) stops the solve, and on a
    matrix without threads= the exception carries the iterate it stopped at: e.x (A's column
    order) and e.itn, what iter_lim=e.itn returns.
    threads: CPU threads for this call (None: rayon's pool, RAYON_NUM_THREADS or the cores).
    Returns SciPy's tuple (a LsqResult: a tuple) with this call's own report as .info
    (backend used, solve seconds, stop reason); seistomo.last_info holds the last call's.
    """
    iter_lim = _check_iter_lim(iter_lim, "iter_lim")
    if iter_lim == 0:  # as the CLI and the config (LSMR's maxiter=0 is SciPy's, kept)
        raise ValueError("iter_lim must be >= 1 (got 0)")
    A, b, x0, as_cupy = _from_cupy(A, b, x0)
    if np.ndim(damp) == 1:
        return _lsqr_damps(A, b, damp, atol, btol, conlim, iter_lim, show, calc_var, x0,
                           backend, precision, callback,
                           (transpose, lsqr_loop, storage, reorder), threads, as_cupy)
    if _columns(b):
        return _lsqr_columns(A, np.asarray(b), damp, atol, btol, conlim, iter_lim, show,
                             calc_var, x0, backend, precision, callback,
                             (transpose, lsqr_loop, storage, reorder), threads, as_cupy)
    callback, cb_x = _callback(callback, callback_type, "lsqr")
    table = None
    if show:
        table = _LsqrTable(A, b, damp, atol, btol, conlim, iter_lim, calc_var, x0)
        if not cb_x:  # the table needs every iteration's norms (callback_type="x": none)
            callback, callback_every = table.watch(callback, callback_every), 1
    shape, r = _lsq("lsqr", A, b, damp, atol, btol, conlim, iter_lim, calc_var, x0, backend,
                    precision, callback, callback_every, transpose, lsqr_loop, storage, reorder,
                    threads, cb_x)
    x = _array(r["x"])
    var = _array(r["var"]) if r["var"] is not None else np.zeros(shape[1])
    if table is not None:
        table.finish(r)
    return _to_cupy(LsqResult((x, int(r["istop"]), int(r["itn"]), r["r1norm"], r["r2norm"],
                               r["anorm"], r["acond"], r["arnorm"], r["xnorm"], var), r["info"]),
                    as_cupy)


class _Table:
    """What lsqr's and lsmr's show=True tables share: the callback that prints each row, and
    the last row with the first closing lines."""

    def watch(self, callback, every):
        """A callback for every iteration that prints its row and calls the caller's one every
        `every` iterations."""
        every = max(int(every), 1)

        def cb(itn, *norms):
            self.row(itn, *norms)
            if callback is not None and itn % every == 0:
                callback(itn, *norms)
        return cb

    def close(self, name, r, second_norm):
        self.row(int(r["itn"]), r["r1norm"], second_norm, r["anorm"], r["acond"], r["arnorm"],
                 r["xnorm"], last=True)
        print(" ")
        print(f"{name} finished")
        print(r["stop_reason"])
        print(f"(seistomo, {r['backend']})")


class _LsqrTable(_Table):
    """lsqr's show=True: SciPy's header, its table of iterations (the same rows: the first 10,
    the last 10 before iter_lim, every one when n <= 40 or near a stopping test, and the last)
    printed as the solve goes, and its closing lines. SciPy's x[0] column is left out: the
    native loop hands Python the norms, not x."""

    def __init__(self, A, b, damp, atol, btol, conlim, iter_lim, calc_var, x0=None):
        m, n = (int(v) for v in A.shape)
        self.n, self.atol, self.btol = n, float(atol), float(btol)
        self.ctol = 1.0 / conlim if conlim > 0 else 0.0
        self.iter_lim = 2 * n if iter_lim is None else int(iter_lim)
        bv = np.asarray(b, dtype=np.float64).reshape(-1)
        self.bnorm = float(np.linalg.norm(bv))
        self.last = None
        print(" ")
        print("LSQR            Least-squares solution of  Ax = b")
        print(f"The matrix A has {m} rows and {n} columns")
        print(f"damp = {damp:20.14e}   calc_var = {int(bool(calc_var)):8g}")
        print(f"atol = {atol:8.2e}                 conlim = {conlim:8.2e}")
        print(f"btol = {btol:8.2e}               iter_lim = {self.iter_lim:8g}")
        print(" ")
        print("   Itn      r1norm     r2norm   Compatible    LS      Norm A   Cond A")
        # Iteration 0 (the native loop reports from iteration 1): beta = ||b - A x0||, and
        # SciPy's test2 = alpha / beta with alpha = ||A^T r0|| / beta, where A allows it.
        r0 = bv if x0 is None else bv - _apply(A, np.asarray(x0, dtype=np.float64), False)
        beta = float(np.linalg.norm(r0)) if r0 is not None else self.bnorm
        atr = _apply(A, r0, True) if r0 is not None and beta > 0 else None
        test2 = "" if atr is None else f" {float(np.linalg.norm(atr)) / beta ** 2:8.1e}"
        test1 = 1.0 if beta > 0 else 0.0
        print(f"{0:6g}  {beta:10.3e} {beta:10.3e}   {test1:8.1e}{test2}")
        self.last = 0

    def row(self, itn, r1norm, r2norm, anorm, acond, arnorm, xnorm, last=False):
        rnorm = r1norm
        test1 = rnorm / self.bnorm if self.bnorm > 0 else 0.0
        if anorm > 0 and rnorm > 0:
            test2 = arnorm / (anorm * rnorm)
        else:
            test2 = arnorm / (rnorm * rnorm) if rnorm > 0 else 0.0
        test3 = 1.0 / acond if acond > 0 else 0.0
        rtol = self.btol + self.atol * anorm * xnorm / self.bnorm if self.bnorm > 0 else 0.0
        show = (last or itn == 0 or self.n <= 40 or itn <= 10 or itn >= self.iter_lim - 10
                or test3 <= 2 * self.ctol or test2 <= 10 * self.atol or test1 <= 10 * rtol)
        if show and itn != self.last:
            tail = "" if itn == 0 else f" {anorm:8.1e} {acond:8.1e}"
            print(f"{itn:6g}  {r1norm:10.3e} {r2norm:10.3e}   {test1:8.1e} {test2:8.1e}{tail}")
            self.last = itn

    def finish(self, r):
        self.close("LSQR", r, r["r2norm"])
        print(" ")
        print(f"istop ={int(r['istop']):8g}   r1norm ={r['r1norm']:8.1e}   "
              f"anorm ={r['anorm']:8.1e}   arnorm ={r['arnorm']:8.1e}")
        print(f"itn   ={int(r['itn']):8g}   r2norm ={r['r2norm']:8.1e}   "
              f"acond ={r['acond']:8.1e}   xnorm  ={r['xnorm']:8.1e}")
        print(" ")


class _LsmrTable(_Table):
    """lsmr's show=True as SciPy prints it: the header, the table of iterations (the same rows:
    every one when n <= 40, the first and last 10, every 10th, near a stopping test and the
    last; the heading again every 20 rows) as the solve goes, and the closing lines. SciPy's
    x(1) column is left out: the native loop hands Python the norms, not x."""

    HEADING = "   itn      norm r    norm Ar  compatible   LS      norm A   cond A"

    def __init__(self, A, b, damp, atol, btol, conlim, maxiter, x0=None):
        m, n = (int(v) for v in A.shape)
        self.n, self.atol, self.btol = n, float(atol), float(btol)
        self.ctol = 1.0 / conlim if conlim > 0 else 0.0
        self.maxiter = min(m, n) if maxiter is None else int(maxiter)
        bv = np.asarray(b, dtype=np.float64).reshape(-1)
        self.bnorm = float(np.linalg.norm(bv))
        # rows since the heading, as SciPy's pcount (the heading again after 20)
        self.count, self.last, self.headed = 0, None, False
        print(" ")
        print("LSMR            Least-squares solution of  Ax = b\n")
        print(f"The matrix A has {m} rows and {n} columns")
        print(f"damp = {damp:20.14e}\n")
        print(f"atol = {atol:8.2e}                 conlim = {conlim:8.2e}\n")
        print(f"btol = {btol:8.2e}             maxiter = {self.maxiter:8g}\n")
        # Iteration 0 (the native loop reports from iteration 1): normr = beta = ||b - A x0||,
        # test2 = alpha / beta with alpha = ||A^T r0|| / beta, where A allows it.
        r0 = bv if x0 is None else _apply(A, np.asarray(x0, dtype=np.float64), False)
        if r0 is not None and x0 is not None:
            r0 = bv - r0
        beta = float(np.linalg.norm(r0)) if r0 is not None else self.bnorm
        atr = _apply(A, r0, True) if r0 is not None and beta > 0 else None
        if atr is None or beta == 0:
            return
        alpha = float(np.linalg.norm(atr)) / beta
        print(" ")
        print(self.HEADING)
        print(f"{0:6g} {beta:10.3e} {alpha * beta:10.3e}  {1.0:8.1e} {alpha / beta:8.1e}")
        self.last, self.headed = 0, True

    def row(self, itn, normr, _normr, norma, conda, normar, normx, last=False):
        test1 = normr / self.bnorm if self.bnorm > 0 else 0.0
        test2 = normar / (norma * normr) if norma > 0 and normr > 0 else 0.0
        test3 = 1.0 / conda if conda > 0 else 0.0
        rtol = self.btol + self.atol * norma * normx / self.bnorm if self.bnorm > 0 else 0.0
        show = (last or self.n <= 40 or itn <= 10 or itn >= self.maxiter - 10 or itn % 10 == 0
                or test3 <= 1.1 * self.ctol or test2 <= 1.1 * self.atol or test1 <= 1.1 * rtol)
        if not show or itn == self.last:
            return
        if not self.headed or self.count >= 20:
            print(" ")
            print(self.HEADING)
            self.count, self.headed = 0, True
        self.count += 1
        print(f"{itn:6g} {normr:10.3e} {normar:10.3e}  {test1:8.1e} {test2:8.1e}"
              f" {norma:8.1e} {conda:8.1e}")
        self.last = itn

    def finish(self, r):
        self.close("LSMR", r, r["r1norm"])
        print(f"istop ={int(r['istop']):8g}    normr ={r['r1norm']:8.1e}")
        print(f"    normA ={r['anorm']:8.1e}    normAr ={r['arnorm']:8.1e}")
        print(f"itn   ={int(r['itn']):8g}    condA ={r['acond']:8.1e}")
        print(f"    normx ={r['xnorm']:8.1e}")


def _apply(A, v, transpose):
    """A v (A^T v) for lsqr's show=True table, where A is a matrix or an operator with
    matvec/rmatvec; None where it is neither (a prepared Operator)."""
    try:
        if hasattr(A, "rmatvec") and hasattr(A, "matvec"):
            out = A.rmatvec(v) if transpose else A.matvec(v)
        elif isinstance(A, Operator):
            return None
        else:
            out = (A.T @ v) if transpose else (A @ v)
        return np.asarray(out, dtype=np.float64).reshape(-1)
    except Exception:  # the table is a courtesy: never the solve's error
        return None


def _columns(b):
    """Whether b is a block of right-hand sides: 2-D with two or more columns (an (m, 1) or
    (1, m) b is one vector, as SciPy takes it)."""
    shape = getattr(b, "shape", None)
    if shape is None and isinstance(b, (list, tuple)):
        shape = np.shape(b)
    return shape is not None and len(shape) == 2 and min(shape) >= 2


def _on_gpu(backend):
    """Whether solves with `backend` run on a GPU: "cuda", or "auto" where one is usable."""
    b = str(backend)
    if b not in ("auto", "cpu", "cuda"):
        raise ValueError(f"unknown backend '{b}' (auto, cpu, cuda)")
    return b == "cuda" or (b == "auto" and cuda_available()[0])


def _lsqr_columns(A, B, damp, atol, btol, conlim, iter_lim, show, calc_var, x0, backend,
                  precision, callback, layout, threads, as_cupy):
    """lsqr for every column of B (m x k): returns lsqr's 10-tuple with a column per solve: x
    and var (n, k), istop, itn and the norms arrays of k; .info a list of the columns' reports
    (docs/python.md, "Many right-hand sides"). Where it runs:
    - the CPU (backend "cpu", or "auto" without a GPU): one batch, k LSQR recurrences sharing
      each pass over A; each column equals its own seistomo.lsqr(A, B[:, j]) on the CPU;
    - a GPU, A from gpu_batch_min_nnz() nonzeros: one batch on the GPU (its own column tiles;
      f64 or f32); each column agrees with its single GPU solve within rounding;
    - a GPU below that, or A a prepared seistomo.Operator: one solve after another on one
      operator (set up once); each column is its own lsqr(A, B[:, j]) bit for bit.
    CuPy input: B (and x and var back) as CuPy arrays; a CuPy A goes to the host for the GPU's
    batch (its tiles are made there), and is solved on the GPU column by column below it."""
    transpose, lsqr_loop, storage, reorder = layout
    if not hasattr(A, "shape"):
        A = np.asarray(A)
    k = B.shape[1]
    refused = [
        (x0 is not None, "x0"),
        (callback is not None, "callback"),
        (_is_operator(A) and not isinstance(A, Operator), "A given by its products"),
        (str(transpose) == "scatter", "transpose='scatter'"),
    ]
    for bad, what in refused:
        if bad:
            raise ValueError(f"lsqr with B of {k} columns solves them together, which does "
                             f"not take {what}: solve the columns one by one instead")
    if B.dtype == object:
        raise TypeError("B: dtype object is not a real number type")
    _check_dtype(B.dtype, "B")
    rows = A.shape[0]
    if B.shape[0] != rows:
        raise ValueError(f"shape mismatch: B has {B.shape[0]} rows but A has {rows}")
    gpu = _on_gpu(backend) if not isinstance(A, Operator) else False
    if _is_cupy(A) and not gpu:
        raise ValueError(f"backend={backend!r}: a CuPy matrix lies on the GPU and runs on the "
                         f"CUDA backend (A.get() gives it on the host for backend='cpu')")
    nnz = getattr(A, "nnz", None)
    if nnz is None and not isinstance(A, Operator):
        nnz = int(np.count_nonzero(np.asarray(A)))
    if isinstance(A, Operator) or (gpu and nnz < gpu_batch_min_nnz()):
        rs, how = _columns_one_by_one(A, B, (damp, atol, btol, conlim), iter_lim, calc_var,
                                      backend, precision, layout, threads)
    else:
        if gpu:
            if _is_cupy(A):
                A = A.get()  # the GPU's batch makes its column tiles on the host
        else:
            for bad, what in ((str(precision) != "f64", f"precision={precision!r}"),
                              (str(storage) == "compact", "storage='compact'")):
                if bad:
                    raise ValueError(
                        f"lsqr with B of {k} columns runs them as one batch on the CPU, "
                        f"which does not take {what} (f32 and the compact storage are the "
                        f"GPU's: backend='cuda'); solve the columns one by one instead")
        shape, ip, ix, data = _csr_parts(A)
        bb = np.ascontiguousarray(B.T, dtype=np.float64).tobytes()
        tol = (float(damp), float(atol), float(btol), float(conlim))
        rs = _native.lsqr_columns(bb, k, shape, ip, ix, data, tol, iter_lim, bool(calc_var),
                                  str(reorder), _threads(threads), "cuda" if gpu else "cpu",
                                  str(precision))
        how = rs[0]["backend"]
        _flush_console()
    labels = [f"column {j:4d}" for j in range(k)]
    return _many_result(rs, (rows, A.shape[1]), calc_var, ("columns", "right-hand sides", how),
                        labels, show, as_cupy)


def _many_result(rs, shape, calc_var, what, labels, show, as_cupy):
    """lsqr's 10-tuple from the native results `rs` of several solves (one column each): x and
    var (n, k), istop, itn and the norms arrays of k, .info the solves' reports, also in
    seistomo.last_info[key] beside how they ran; with show, a line a solve (`labels`). `what`
    is (key, the solves in words, how they ran)."""
    (rows, n), k, (key, words, how) = shape, len(rs), what
    X = np.stack([_array(r["x"]) for r in rs], axis=1)
    var = (np.stack([_array(r["var"]) for r in rs], axis=1) if calc_var
           else np.zeros((n, k)))
    infos = [{f: v for f, v in r.items() if f not in ("x", "var", "info")} for r in rs]
    last_info.clear()
    last_info.update({key: infos, "backend": how})
    col = lambda f, t=float: np.array([t(r[f]) for r in rs])  # noqa: E731
    if show:
        print(f"LSQR of {k} {words}; A has {rows} rows and {n} columns; {how}")
        for label, r in zip(labels, rs):
            print(f"{label}: istop ={r['istop']:3d}  itn ={r['itn']:7d}  "
                  f"r1norm ={r['r1norm']:9.2e}  arnorm ={r['arnorm']:9.2e}  "
                  f"xnorm ={r['xnorm']:9.2e}")
    out = LsqResult((X, col("istop", int), col("itn", int), col("r1norm"), col("r2norm"),
                     col("anorm"), col("acond"), col("arnorm"), col("xnorm"), var), infos)
    if as_cupy:
        import cupy

        vals = list(out)
        vals[0], vals[9] = cupy.asarray(vals[0]), cupy.asarray(vals[9])
        out = LsqResult(tuple(vals), infos)
    return out


def _lsqr_damps(A, b, damps, atol, btol, conlim, iter_lim, show, calc_var, x0, backend,
                precision, callback, layout, threads, as_cupy):
    """lsqr of one b at every damping of `damps` (SciPy takes one): one Golub-Kahan
    bidiagonalisation serves them all (it does not depend on damp), each damping with its own
    rotations, x, w and stopping tests, each equal to its own lsqr(A, b, damp=d,
    lsqr_loop="host") bit for bit (docs/python.md, "Many dampings"). Returns lsqr's 10-tuple
    with a column per damping, as B of k columns does."""
    damps = np.asarray(damps, dtype=np.float64)
    k = damps.shape[0]
    refused = [
        (k == 0, "an empty list of dampings"),
        (_columns(b) or np.ndim(b) != 1, "b other than one vector"),
        (x0 is not None, "x0"),
        (callback is not None, "callback"),
        (isinstance(A, Operator) or _is_operator(A), "A as an Operator or given by its products"),
        (_is_cupy(A), "a CuPy A"),
        (_pylops_matrix(A) is not None, "a PyLops operator"),
    ]
    for bad, what in refused:
        if bad:
            raise ValueError(f"lsqr with damp a list of {k} solves them in one "
                             f"bidiagonalisation, which does not take {what}")
    if not hasattr(A, "shape"):
        A = np.asarray(A)
    shape, ip, ix, data = _csr_parts(A)
    bb = _vec(b, "b")
    lay = _layout(backend, precision, *layout)
    try:
        rs = _native.lsqr_damps(shape, ip, ix, data, bb, [float(d) for d in damps],
                                (float(atol), float(btol), float(conlim)), iter_lim,
                                bool(calc_var), lay, _threads(threads))
    finally:
        _flush_console()
    labels = [f"damp {d:9.2e}" for d in damps]
    what = ("dampings", "dampings", rs[0]["backend"])
    return _many_result(rs, shape, calc_var, what, labels, show, as_cupy)


def _columns_one_by_one(A, B, tol, iter_lim, calc_var, backend, precision, layout, threads):
    """B's columns solved one after another on one operator: A itself where it is a prepared
    Operator or a CuPy matrix (which stays on the GPU), else an Operator made here, once.
    Returns the columns' native results and how they ran, in words."""
    transpose, lsqr_loop, storage, reorder = layout
    damp, atol, btol, conlim = tol

    def each(op):
        return [_lsq("lsqr", op, np.ascontiguousarray(B[:, j]), damp, atol, btol, conlim,
                     iter_lim, calc_var, None, backend, precision, None, 1, transpose,
                     lsqr_loop, storage, reorder, threads)[1] for j in range(B.shape[1])]

    if isinstance(A, Operator) or _is_cupy(A):
        rs = each(A)
    else:
        with Operator(A, backend, precision=precision, transpose=transpose,
                      lsqr_loop=lsqr_loop, storage=storage, reorder=reorder,
                      threads=threads) as op:
            rs = each(op)
    why = ("a prepared Operator" if isinstance(A, Operator) else
           f"below {gpu_batch_min_nnz() // 10**6}M nonzeros a GPU solves them one after another"
           f" faster than as one batch")
    return rs, f"{rs[0]['backend']}; {B.shape[1]} columns one after another ({why})"


def gpu_batch_min_nnz():
    """Nonzeros from which a GPU solves many right-hand sides (lsqr(A, B)) or an L-curve's
    weights (lcurve) as one batch; below it one solve after another (measured faster there:
    docs/performance.md, "Batched LSQR on the GPU")."""
    return int(_native.gpu_batch_min_nnz())


def lcurve(G, d, R, weights, damp=0.0, atol=1e-8, btol=1e-8, conlim=1e8, iter_lim=None, *,
           reorder="none", threads=None, gcv_probes=1, noise=None, noise_tau=1.0,
           backend="auto", precision="f64"):
    """The L-curve of min ||G x - d||^2 + w^2 ||R x||^2 (+ damp^2 ||x||^2) over `weights`, by
    LSQR on [G; w R] x = [d; 0] for every weight in one batch: one pass over the matrix per
    iteration serves every weight still running (what `seistomo lcurve` runs). On the CPU each
    weight's solution is the one seistomo.lsqr(vstack([G, w R]), [d; 0]) gives there, bit for
    bit. backend "auto" runs on a GPU where one is usable: there, as the CLI does, one batch
    from gpu_batch_min_nnz() nonzeros of [G; R] (f64, or f32 with precision="f32"), one solve
    after another below it; a GPU's points agree with the CPU's within rounding.

    G (m x n), R (p x n): scipy.sparse matrices or 2-D arrays; d: m values; weights: w >= 0.
    Three rules choose a weight, as `seistomo lcurve` and `invert`'s `[solver] weight` do
    (docs/lsqr.md): the corner (maximum curvature of the log-log curve), GCV (generalised
    cross-validation, its trace by `gcv_probes` random probes per weight solved in the same
    batch; 0: no GCV) and the discrepancy principle (with `noise`, the data's standard
    deviation sigma: the weight whose ||G x - d|| is noise_tau sqrt(m) sigma).
    Returns a dict: "weights", "residual_norm" (||G x - d||), "model_norm" (||R x||),
    "curvature" (NaN at the ends), "trace" and "gcv" (NaN without probes), "corner", "gcv_min",
    "discrepancy" (each a weight, or None where the rule finds none), "x" (n x k, a column per
    weight), "istop" and "itn" (arrays of k) and "info" (each weight's report)."""
    weights = [float(w) for w in np.atleast_1d(np.asarray(weights, dtype=np.float64))]
    if not weights:
        raise ValueError("weights: give at least one")
    iter_lim = _check_iter_lim(iter_lim, "iter_lim")
    if not (isinstance(gcv_probes, (int, np.integer)) and 0 <= gcv_probes <= 64):
        raise ValueError(f"gcv_probes must be an integer from 0 to 64 (got {gcv_probes!r})")
    # CuPy input goes to the host: the batch makes its layout there (x comes back on the host)
    G, R, d = (v.get() if _is_cupy(v) else v for v in (G, R, d))
    g, r = _csr_parts(G, "G"), _csr_parts(R, "R")
    db = _vec(d, "d")
    m = len(db) // 8
    target = None
    if noise is not None:
        if not (np.isfinite(noise) and noise > 0 and np.isfinite(noise_tau) and noise_tau > 0):
            raise ValueError(f"noise and noise_tau must be finite and > 0 (got {noise!r}, "
                             f"{noise_tau!r})")
        target = float(noise_tau) * float(np.sqrt(m)) * float(noise)
    tol = (float(damp), float(atol), float(btol), float(conlim))
    rs, (corner, gcv_min, discrepancy) = _native.lcurve_batch(
        g, r, db, weights, tol, iter_lim, str(reorder), _threads(threads), int(gcv_probes),
        target, "cuda" if _on_gpu(backend) else "cpu", str(precision))
    _flush_console()
    infos = [{key: v for key, v in x.items() if key not in ("x", "var")} for x in rs]
    last_info.clear()
    last_info.update({"columns": infos, "backend": rs[0]["backend"]})
    col = lambda key, t=float: np.array([t(x[key]) for x in rs])  # noqa: E731
    return {
        "weights": np.array(weights),
        "residual_norm": col("residual_norm"),
        "model_norm": col("model_norm"),
        "curvature": col("curvature"),
        "trace": col("trace"),
        "gcv": col("gcv"),
        "corner": corner,
        "gcv_min": gcv_min,
        "discrepancy": discrepancy,
        "x": np.stack([_array(x["x"]) for x in rs], axis=1),
        "istop": col("istop", int),
        "itn": col("itn", int),
        "info": infos,
    }


def lsmr(A, b, damp=0.0, atol=1e-6, btol=1e-6, conlim=1e8, maxiter=None, show=False, x0=None,
         *, backend="auto", precision="f64", callback=None, callback_every=1, transpose="auto",
         storage="auto", reorder="none", threads=None, callback_type=None):
    """Least squares min ||b - A x||^2 + damp^2 ||x - x0||^2 by LSMR (Fong & Saunders 2011), as
    scipy.sparse.linalg.lsmr: same parameters, defaults (maxiter = min(m, n)) and 8-tuple
    (x, istop, itn, normr, normar, norma, conda, normx).

    LSMR runs the same bidiagonalisation as LSQR but makes ||A^T r|| fall monotonically, so it
    can stop earlier than LSQR on the least-squares test (atol). A, b, backend, precision,
    storage, reorder, transpose and callback as for seistomo.lsqr (A a sparse matrix, an array,
    or an operator with matvec, rmatvec and shape, or a prepared seistomo.Operator, or a CuPy
    matrix); on a GPU the iterations run in LSMR's device loop (blocks of iterations as CUDA
    graphs, docs/lsmr.md). callback(itn, normr, normr, norma, conda, normar, normx) every
    `callback_every` iterations (lsqr's order of fields); with callback_type="x", callback(x)
    (x in A's column order).
    """
    maxiter = _check_iter_lim(maxiter, "maxiter")
    A, b, x0, as_cupy = _from_cupy(A, b, x0)
    callback, cb_x = _callback(callback, callback_type, "lsmr")
    table = None
    if show:
        table = _LsmrTable(A, b, damp, atol, btol, conlim, maxiter, x0)
        if not cb_x:  # the table needs every iteration's norms (callback_type="x": none)
            callback, callback_every = table.watch(callback, callback_every), 1
    shape, r = _lsq("lsmr", A, b, damp, atol, btol, conlim, maxiter, False, x0, backend,
                    precision, callback, callback_every, transpose, "auto", storage, reorder,
                    threads, cb_x)
    x = _array(r["x"])
    if table is not None:
        table.finish(r)
    return _to_cupy(LsqResult((x, int(r["istop"]), int(r["itn"]), r["r1norm"], r["arnorm"],
                               r["anorm"], r["acond"], r["xnorm"]), r["info"]), as_cupy)


class GmresResult(tuple):
    """(x, info) as scipy.sparse.linalg.gmres returns it, with the solve's numbers as
    attributes: iterations (inner, one operator application each), cycles, relres
    (||b - A x|| / ||b||), converged, reason, backend, seconds; and all of them as the dict
    .info (this call's own, as seistomo.last_info in this thread)."""

    def __new__(cls, x, info, details):
        self = super().__new__(cls, (x, info))
        for k, v in details.items():
            setattr(self, k, v)
        self.info = dict(details)
        return self


class _Callable:
    """A callable M (z = M(r)) as an operator with matvec."""

    def __init__(self, f):
        self.matvec = f


def _gmres_precond(M, n):
    """seistomo's preconditioner named by M (None, a name), or the caller's M as _Products: a
    LinearOperator or anything with matvec, a sparse matrix or array (as SciPy, z = M @ r), or
    a callable z = M(r)."""
    if M is None:
        return "none", None
    if isinstance(M, str):
        return M, None
    sp = _sparse()
    if hasattr(M, "matvec"):
        op = M
    elif sp.issparse(M) or isinstance(M, np.ndarray):
        from scipy.sparse.linalg import aslinearoperator

        _check_dtype(M.dtype, "M")
        op = aslinearoperator(M)
    elif callable(M):
        return "none", _Products(_Callable(M), "M", (n, n), transpose=False)
    else:
        raise TypeError("M must be None, 'jacobi', 'block-ilu0', a LinearOperator (or anything "
                        f"with matvec), a sparse matrix or a callable (got {type(M).__name__})")
    shape = tuple(int(v) for v in getattr(op, "shape", (n, n)))
    if shape != (n, n):
        raise ValueError(f"M has shape {shape}; GMRES needs ({n}, {n})")
    return "none", _Products(op, f"M ({type(M).__name__})", (n, n), transpose=False)


def gmres(A, b, x0=None, *, rtol=1e-5, atol=0.0, restart=20, maxiter=None, M=None,
          callback=None, callback_type=None, orthog="cgs2", backend="auto", precision="f64",
          callback_every=1, storage="auto", threads=None):
    """Restarted GMRES with SciPy 1.10's stopping rule: returns (x, info), info = 0 when
    ||b - A x|| <= max(rtol ||b||, atol), else the number of restart cycles run (> 0).
    restart: None means 20 (SciPy's default); at most n. maxiter counts restart cycles (SciPy's
    meaning; default 10 n). M: None, "jacobi" or "block-ilu0" (seistomo's, native), or the
    caller's: a LinearOperator (PyLops, anything with matvec), a sparse matrix or array
    (z = M @ r, as SciPy) or a callable z = M(r), applied in Python; left preconditioning.
    A: a sparse matrix or array, or an operator with matvec and shape (then the CPU backend,
    products in Python). The result also carries .iterations (inner iterations), .cycles,
    .relres, .converged.
    callback_type, as SciPy 1.10's: "x": callback(x) after every cycle; "pr_norm":
    callback(preconditioned residual / ||b||) every inner iteration; "legacy": the same, and
    maxiter counts inner iterations. None (seistomo's): callback(iteration, resnorm, relres)
    every `callback_every` inner iterations.
    storage (GPU): "auto" (row patterns where the rows qualify: stencil matrices), "csr",
    "compact" (row patterns, or an error saying why not)."""
    if isinstance(A, Operator):
        raise TypeError("a seistomo.Operator is prepared for lsqr and lsmr; gmres takes the "
                        "matrix itself (or an operator with matvec)")
    native = _pylops_matrix(A)  # a PyLops operator of matrices runs as its sparse matrix
    if native is not None:
        A = native
    operator = _is_operator(A)
    if operator:
        shape, prods = _operator(A, transpose=False)
    else:
        shape, ip, ix, data = _csr_parts(A)
    if shape[0] != shape[1]:
        raise ValueError(f"GMRES needs a square matrix; A is {shape[0]} x {shape[1]}")
    n = shape[0]
    bb = _vec(b, "b", n)
    x0b = None if x0 is None else _vec(x0, "x0", n)
    pc, m_prods = _gmres_precond(M, n)
    restart = 20 if restart is None else int(restart)
    if restart < 1:
        raise ValueError(f"restart must be >= 1 (got {restart})")
    restart = min(restart, n)
    if maxiter is None:
        maxiter = 10 * n
    maxiter = int(maxiter)
    if maxiter < 1:
        raise ValueError(f"maxiter must be >= 1 (got {maxiter})")
    if callback_type not in (None, "x", "pr_norm", "legacy"):
        raise ValueError(f"unknown callback_type {callback_type!r} (None, 'x', 'pr_norm', "
                         f"'legacy')")
    if callback_type == "legacy":
        max_iter, max_cycles = maxiter, None
    else:
        max_iter, max_cycles = restart * maxiter, maxiter
    cb, cb_x = callback, False
    if callback is not None and callback_type == "x":
        cb, cb_x = (lambda xb: callback(_array(xb))), True
    elif callback is not None and callback_type in ("pr_norm", "legacy"):
        bnrm2 = float(np.linalg.norm(np.frombuffer(bb, dtype=np.float64)))
        cb = lambda _it, resnorm, _rel: callback(resnorm / bnrm2)  # noqa: E731
    limits = (float(rtol), float(atol), restart, max_iter, max_cycles, str(orthog))
    watch = (cb, int(callback_every), cb_x)
    if operator:
        r = _native.gmres_operator(prods, n, bb, x0b, limits, pc, str(backend), watch, m_prods,
                                   _threads(threads))
    else:
        r = _native.gmres(n, ip, ix, data, bb, x0b, limits, pc, str(backend), str(precision),
                          watch, str(storage), m_prods, _threads(threads))
    x = _array(r.pop("x"))
    info = 0 if r["converged"] else (maxiter if callback_type == "legacy" else int(r["cycles"]))
    last_info.clear()
    last_info.update(r)
    return GmresResult(x, info, r)


def _grid_tuple(grid):
    """A grid given as a dict (n, spacing[, origin, axes, units]; a Dataset's .grid) or a
    Dataset, as it crosses to the native side (None stays None)."""
    if grid is None:
        return None
    if isinstance(grid, Dataset):
        grid = grid.grid
        if grid is None:
            raise ValueError("grid: the dataset has no grid")
    if not isinstance(grid, dict) or "n" not in grid or "spacing" not in grid:
        raise TypeError("grid must be a dict with n and spacing (and optionally origin, axes, "
                        "units), or a seistomo.Dataset that has a grid")
    if len(grid["n"]) != 3 or len(grid["spacing"]) != 3:
        raise ValueError("grid: n and spacing need 3 values (x, y, z)")
    return (
        [int(v) for v in grid["n"]],
        [float(v) for v in grid.get("origin", (0.0, 0.0, 0.0))],
        [float(v) for v in grid["spacing"]],
        [str(v) for v in grid.get("axes", ("x", "y", "z"))],
        str(grid.get("units", "km")),
    )


class Dataset:
    """A dataset directory (docs/formats.md): Dataset.create(...) writes one from SciPy/NumPy,
    Dataset.open(path) reads its manifest; .system() loads [G; lam R], [d; 0]."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self._info = json.loads(_native.dataset_info(self.path))

    @classmethod
    def open(cls, path):
        return cls(path)

    @classmethod
    def create(cls, path, G, d, R=None, lam=1.0, grid=None, weights=None, sigma=None,
               true_model=None, name="", description=""):
        """Write G (kernel rows), d (data), optional damping rows R with weight lam, a grid
        (dict n, origin, spacing[, axes, units]), per-row weights or sigma, a true model."""
        shape, ip, ix, data = _csr_parts(G, "G")
        m, n = shape
        damping = None
        if R is not None:
            rs, rip, rix, rdata = _csr_parts(R, "R")
            if rs[1] != n:
                raise ValueError(f"shape mismatch: R has {rs[1]} columns but G has {n}")
            damping = (rs, rip, rix, rdata)
        opt = lambda v, what, k: None if v is None else _vec(v, what, k)
        _native.dataset_create(os.fspath(path), shape, ip, ix, data, _vec(d, "d", m),
                               damping, float(lam), _grid_tuple(grid), opt(weights, "weights", m),
                               opt(sigma, "sigma", m), opt(true_model, "true_model", n),
                               str(name), str(description))
        return cls(path)

    @property
    def name(self):
        return self._info.get("name", "")

    @property
    def kernel_rows(self):
        return int(self._info["kernel_rows"])

    @property
    def damping_rows(self):
        return int(self._info["damping_rows"])

    @property
    def shape(self):
        """Rows (kernel + damping) and columns of the system."""
        return (self.kernel_rows + self.damping_rows, int(self._info["columns"]))

    @property
    def nnz(self):
        """Nonzeros of the kernel rows plus the stored damping rows."""
        damp = self._info.get("damping") or {}
        return int(self._info["kernel_nnz"]) + int(damp.get("nnz", 0))

    @property
    def lam(self):
        return float(self._info["damping_weight"])

    @property
    def grid(self):
        return self._info.get("grid")

    def system(self):
        """(A, b): A a scipy.sparse.csr_matrix [G; lam R] (weights/sigma applied), b [d; 0]."""
        sp = _sparse()
        r = _native.dataset_system(self.path)
        m, n = r["shape"]
        indptr = np.frombuffer(r["indptr"], dtype=np.uint64).astype(np.int64)
        indices = np.frombuffer(r["indices"], dtype=np.uint32).astype(np.int32)
        A = sp.csr_matrix((_array(r["data"]), indices, indptr), shape=(m, n))
        return A, _array(r["b"])

    def __repr__(self):
        return f"Dataset({self.path!r}, shape={self.shape}, nnz={self.nnz})"


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _toml_key(k):
    if not isinstance(k, str):
        raise TypeError(f"config: keys must be strings (got {k!r})")
    return k if _BARE_KEY.match(k) else json.dumps(k)


def _toml_value(v, where):
    """One TOML value (strings as TOML basic strings: JSON's escapes are TOML's)."""
    if isinstance(v, (bool, np.bool_)):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        v = float(v)
        if v != v:
            return "nan"
        if v in (float("inf"), float("-inf")):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, (str, os.PathLike)):
        return json.dumps(os.fspath(v))
    if isinstance(v, (list, tuple, np.ndarray)):
        return "[" + ", ".join(_toml_value(x, where) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(x, f'{where}.{k}')}"
                               for k, x in v.items()) + "}"
    if v is None:
        raise TypeError(f"config: {where} is None (leave the key out for its default)")
    raise TypeError(f"config: {where} = {v!r}: a {type(v).__name__} is not a TOML value "
                    f"(str, int, float, bool, path, list or dict)")


def _toml(config, prefix=""):
    """A run configuration given as a dict (tables as nested dicts) in TOML."""
    lines, tables = [], []
    for k, v in config.items():
        if isinstance(v, dict):
            tables.append((k, v))
        else:
            lines.append(f"{_toml_key(k)} = {_toml_value(v, prefix + str(k))}")
    for k, v in tables:
        name = f"{prefix}{_toml_key(k)}"
        lines.append(f"\n[{name}]")
        lines.append(_toml(v, name + ".").strip("\n"))
    return "\n".join(line for line in lines if line) + "\n"


def mmread(path):
    """Read a Matrix Market matrix file as a ``scipy.sparse.csr_matrix``: what
    ``scipy.io.mmread(path).tocsr()`` gives (coordinate or array; real, integer or pattern;
    general, symmetric or skew-symmetric; duplicates summed), read as ``seistomo solve`` reads
    it: in parallel, and a ``.gz`` that seistomo wrote (``mmwrite``, ``seistomo export --format
    mtx.gz``) decoded in parallel too. Complex files are refused. A malformed file raises
    OSError naming the file and the line; a missing one FileNotFoundError."""
    sp = _sparse()
    r = _native.mtx_read(os.fspath(path))
    m, n = r["shape"]
    # writable views of the bytearrays the native side filled (offsets below 2^63; columns
    # below 2^31 viewed as int32, else widened)
    indptr = np.frombuffer(r["indptr"], dtype=np.int64)
    indices = np.frombuffer(r["indices"], dtype=np.uint32)
    indices = indices.view(np.int32) if n <= 2**31 else indices.astype(np.int64)
    data = np.frombuffer(r["data"], dtype=np.float64)
    return sp.csr_matrix((data, indices, indptr), shape=(m, n))


def mmwrite(path, A, comment=""):
    """Write ``A`` (a scipy.sparse matrix or a dense 2-D array) as a Matrix Market
    ``coordinate real general`` file, every value in its shortest round-trip form (what
    ``mmread`` and ``scipy.io.mmread`` read back exactly). A name ending in ``.gz`` is
    compressed on every thread, as gzip members that gzip and SciPy read as one stream and
    ``mmread`` decodes in parallel. The file appears complete or not at all."""
    shape, ip, ix, data = _csr_parts(A, "A")
    _native.mtx_write(os.fspath(path), shape, ip, ix, data, str(comment))


def invert(config, progress=0, resume=False, *, base_dir=None):
    """Run a configuration as `seistomo invert CONFIG` does (one process) and return its
    report (the report.json dict). Outputs go where the config's [output] says.

    config: a TOML file or a dataset directory (a path), a seistomo.Dataset (its directory:
    its invert.toml, else the defaults), or the configuration as a dict of tables, as the TOML
    file would hold it: {"dataset": {"path": "datasets/demo"}, "solver": {"atol": 1e-8},
    "output": {"dir": "out/mine"}}. A dict's relative paths are relative to base_dir (default:
    the current directory); its TOML text goes into the model file's provenance."""
    if isinstance(config, Dataset):
        config = config.path
    if isinstance(config, dict):
        base = os.path.abspath(os.fspath(base_dir) if base_dir is not None else os.getcwd())
        text = _toml(config)
        return json.loads(_native.invert_text(os.path.join(base, "<config dict>"), text,
                                              int(progress), bool(resume)))
    if base_dir is not None:
        raise ValueError("base_dir is for a config given as a dict (a file's paths are "
                         "relative to the file)")
    if not isinstance(config, (str, bytes, os.PathLike)):
        raise TypeError(f"config must be a path, a seistomo.Dataset or a dict (got "
                        f"{type(config).__name__})")
    return json.loads(_native.invert(os.fspath(config), int(progress), bool(resume)))


#: What open_model needs, all brought by `pip install "seistomo[xarray]"`.
_XARRAY_STACK = ("xarray", "h5netcdf", "h5py")


def open_model(path, *, xarray=True):
    """A model file as an xarray.Dataset (engine h5netcdf): fields with their coordinates (x,
    y, z cell centres, or lat/lon for a lattice of cells) and units. Needs xarray, h5netcdf and
    h5py (`pip install "seistomo[xarray]"`); without them an ImportError says so.
    With xarray=False (no extra needed): a dict of NumPy arrays (grid fields shaped
    (nz, ny, nx)) with the coordinates under "x", "y", "z" and the file's attributes under
    "attrs"."""
    path = os.fspath(path)
    if xarray:
        # the file first: a path that is not a model file gets its own error, extras or not
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: No such file or directory")
        meta = _native.model_info(path)  # checks that this is a seistomo model file
        missing = []
        for mod in _XARRAY_STACK:
            try:
                __import__(mod)
            except ImportError:
                missing.append(mod)
        if missing:
            raise ImportError(
                f"seistomo.open_model needs {' and '.join(missing)}, not installed here: "
                f"pip install \"seistomo[xarray]\" (xarray, h5netcdf and h5py; "
                f"\"seistomo[plot]\" adds matplotlib), or open_model(path, xarray=False) for a "
                f"dict of NumPy arrays", name=missing[0])
        import xarray as xr

        ds = xr.open_dataset(path, engine="h5netcdf")
        if not ds.data_vars:
            ds.close()
            ds = xr.open_dataset(path, engine="h5netcdf", group="model")
        ds.attrs.setdefault("stop_reason", meta["stop_reason"])
        return ds
    r = _native.model_fields(path)
    meta = r.pop("__meta__")
    out = {name: _array(data).reshape(shape) for name, (shape, data) in r.items()}
    if "grid" in meta:
        n, origin, spacing, axes, units = meta["grid"]
        for a, key in enumerate(("x", "y", "z")):
            out[key] = origin[a] + (np.arange(n[a]) + 0.5) * spacing[a]
    if "cells" in meta:
        out["cells"] = np.asarray(meta["cells"], dtype=np.float64)
        out["cell_columns"] = list(meta["cell_columns"])
    out["attrs"] = {k: v for k, v in meta.items() if k not in ("grid", "cells", "cell_columns")}
    return out


def _solution_parts(x, var, info):
    """(x, var, info as JSON, method) from an array or a result of lsqr/lsmr."""
    method = "unknown"
    if isinstance(x, LsqResult):
        r, rinfo = x, x.info
        if len(r) == 10:
            method = "lsqr"
            istop, itn, r1, r2, anorm, acond, arnorm, xnorm = r[1:9]
            if var is None:
                var = r[9]
        else:
            method = "lsmr"
            istop, itn, r1, arnorm, anorm, acond, xnorm = r[1:8]
            r2 = r1
        if info is None:
            info = dict(istop=istop, itn=itn, r1norm=r1, r2norm=r2, anorm=anorm, acond=acond,
                        arnorm=arnorm, xnorm=xnorm, seconds=rinfo.get("seconds", 0.0),
                        stop_reason=rinfo.get("stop_reason", ""))
        x = r[0]
    xa = np.asarray(x)
    if xa.ndim != 1:
        raise ValueError(f"x must be one solution (a 1-D array), not an array of shape "
                         f"{xa.shape}: write each column of lsqr(A, B) on its own")
    if info is not None:
        if not isinstance(info, dict):
            raise TypeError("info must be a dict (a result's .info, or seistomo.last_info)")
        need = dict(istop=0, itn=0, r1norm=0.0, r2norm=0.0, anorm=0.0, acond=0.0,
                    arnorm=0.0, xnorm=0.0, seconds=0.0, stop_reason="")
        info = json.dumps({k: type(v)(info.get(k, v)) for k, v in need.items()})
    n = xa.shape[0]
    return (_vec(xa, "x"), None if var is None else _vec(var, "var", n), info, method)


def write_model(path, x, grid=None, *, var=None, info=None, cells=None, unknowns="slowness",
                slowness_unit="s/km", reference=None, reference_profile=None,
                true_model=None):
    """Write a solution as a model file, as `seistomo invert` writes one: HDF5 with the derived
    fields (velocity, perturbation, ...), and for a grid its XDMF sidecar (ParaView); nothing is
    written unless every byte is (docs/model-files.md). Read it back with open_model.

    x: the solution (n values), or what seistomo.lsqr / lsmr returned (x, var and the solver's
    report are taken from it). grid: a dict (n, spacing[, origin, axes, units]; cell (i, j, k)
    is x[i + nx (j + ny k)]) or a seistomo.Dataset with a grid; cells instead: (columns, units,
    rows of bounds), e.g. (["lat_min", "lat_max", "lon_min", "lon_max"], "degrees", rows);
    neither: a bare vector. unknowns: "slowness" or "slowness_perturbation" (then a reference
    is needed); reference: a velocity or "mean" (slowness only); reference_profile: (depth,
    velocity) points with increasing depth (grids). info: a solver report (a result's .info)
    when x is a bare array. true_model: a synthetic's true model (the same quantity as x)."""
    xb, varb, info_json, method = _solution_parts(x, var, info)
    n = len(xb) // 8
    ref = None
    if isinstance(reference, str):
        if reference != "mean":
            raise ValueError(f"reference: '{reference}' is neither a velocity nor \"mean\"")
    elif reference is not None:
        ref = float(reference)
    prof = None
    if reference_profile is not None:
        prof = [[float(z), float(v)] for z, v in reference_profile]
    cl = None
    if cells is not None:
        columns, units, rows = cells
        cl = ([str(c) for c in columns], str(units),
              [[float(v) for v in row] for row in np.asarray(rows, dtype=np.float64)])
    tm = None if true_model is None else _vec(true_model, "true_model", n)
    _native.write_model(os.fspath(path), xb, varb, info_json, method, _grid_tuple(grid), cl,
                        str(unknowns), str(slowness_unit), ref, prof, tm)


def to_xarray(x, grid=None, **model):
    """A solution as an xarray.Dataset, exactly what open_model returns for the model file that
    write_model(path, x, grid, **model) writes (the same fields, coordinates and units), held in
    memory. Needs `pip install "seistomo[xarray]"`."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="seistomo-") as tmp:
        path = os.path.join(tmp, "model.h5")
        write_model(path, x, grid, **model)
        ds = open_model(path)
        try:
            return ds.load()
        finally:
            ds.close()
