#!/usr/bin/python3
"""compare_outputs.py A B: compare two bench/outputs.sh trees (absolute or relative paths).
Ignores timings, run ids, set-up phases, tuning echoes and the model file's provenance; prints
every difference and "IDENTICAL" when there is none."""
import json, os, sys, filecmp
import h5py, numpy as np
A, B = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
SKIP_KEYS = {"seconds", "ms_per_iter", "run_id", "rank_timing", "tuning", "setup_phases"}
def norm(v, root):
    if isinstance(v, bytes): v = v.decode("utf-8", "replace")
    if isinstance(v, str): return v.replace(root, "ROOT")
    a = np.asarray(v)
    if a.dtype == object: return repr([norm(x, root) for x in a.ravel().tolist()])
    return a.tobytes()
bad = 0
def say(*a):
    global bad; bad += 1; print(*a)
def strip(o):
    if isinstance(o, dict):
        return {k: strip(v) for k, v in o.items() if k not in SKIP_KEYS}
    if isinstance(o, list):
        return [strip(v) for v in o]
    return o
def h5walk(path, root):
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            for k, v in obj.attrs.items():
                if k in ("DIMENSION_LIST", "REFERENCE_LIST"): continue
                if name.startswith("provenance"): continue
                if k in ("run_id", "created", "time", "date", "history", "ms_per_iter", "rank_timing", "tuning") or k.startswith("seconds") or k.startswith("tuning") or k.startswith("setup_phases"): continue
                out[f"{name}@{k}"] = norm(v, root)
            if isinstance(obj, h5py.Dataset) and not name.startswith("provenance") and not name.endswith("seconds"):
                v = obj[()]
                if name.endswith("report_json"):
                    v = json.dumps(strip(json.loads(norm(v, root))), sort_keys=True)
                out[name] = norm(v, root)
        for k, v in f.attrs.items():
            if k in ("history", "date_created", "run_id"): continue
            out[f"/@{k}"] = norm(v, root)
        f.visititems(visit)
    return out
for root, dirs, files in os.walk(A):
    rel = os.path.relpath(root, A)
    if rel.startswith("syn") and rel.split(os.sep)[0] == "syn": continue
    for fn in files:
        if fn in ("log.txt", "seistomo-outputs.json") or fn.endswith(".toml") or fn == "A.mtx.gz": continue
        a = os.path.join(root, fn); b = os.path.join(B, rel, fn)
        if not os.path.exists(b): say("missing", b); continue
        if fn.endswith(".json"):
            ja = strip(json.loads(open(a).read().replace(A.rstrip("/"), "ROOT")))
            jb = strip(json.loads(open(b).read().replace(B.rstrip("/"), "ROOT")))
            if ja != jb:
                for k in sorted(set(ja) | set(jb)):
                    if ja.get(k) != jb.get(k): say(f"{rel}/{fn}: {k}: {ja.get(k)!r} != {jb.get(k)!r}")
        elif fn.endswith(".h5"):
            ha, hb = h5walk(a, A.rstrip("/")), h5walk(b, B.rstrip("/"))
            for k in sorted(set(ha) | set(hb)):
                if ha.get(k) != hb.get(k): say(f"{rel}/{fn}: {k} differs")
        elif fn.endswith(".csv") and "history" in fn:
            la = [l.rsplit(",", 1)[0] for l in open(a)]; lb = [l.rsplit(",", 1)[0] for l in open(b)]
            if la != lb: say(f"{rel}/{fn} differs (beyond the seconds column)")
        elif not filecmp.cmp(a, b, shallow=False):
            say(f"{rel}/{fn} differs")
print("IDENTICAL" if bad == 0 else f"{bad} differences")
