#!/usr/bin/python3
"""Load a PETSc binary system written by seistomo (A.petsc: Mat, b.petsc: Vec) with MatLoad and
VecLoad, solve it with KSPLSQR (no preconditioner, rtol = TOL), print one JSON line.
    /usr/bin/python3 bench/peers/petsc_load_lsqr.py DIR [TOL]
"""
import json, os, sys
import petsc4py
petsc4py.init([])
from petsc4py import PETSc

d = sys.argv[1]
tol = float(sys.argv[2]) if len(sys.argv) > 2 else 1e-10
A = PETSc.Mat().load(PETSc.Viewer().createBinary(os.path.join(d, "A.petsc"), "r"))
b = PETSc.Vec().load(PETSc.Viewer().createBinary(os.path.join(d, "b.petsc"), "r"))
x = A.createVecRight()
ksp = PETSc.KSP().create(); ksp.setOperators(A); ksp.setType("lsqr"); ksp.getPC().setType("none")
ksp.setTolerances(rtol=tol, atol=0.0, max_it=100000)
ksp.solve(b, x)
r = b.duplicate(); A.mult(x, r); r.aypx(-1.0, b)
m, n = A.getSize()
print(json.dumps(dict(m=m, n=n, nnz=int(A.getInfo()["nz_used"]), iterations=ksp.getIterationNumber(),
                      reason=int(ksp.getConvergedReason()), rnorm=r.norm(), xnorm=x.norm())))
