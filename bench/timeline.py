#!/usr/bin/env python3
"""Run a command and print each line it writes (stdout and stderr together) with the seconds
since the start, then the exit time: where a run's wall time goes after report.json's `total`
(outputs, fsync, process teardown). Usage: timeline.py CMD [ARGS...]"""
import subprocess
import sys
import time

t0 = time.perf_counter()
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                     bufsize=1)
for line in p.stdout:
    print(f"{time.perf_counter() - t0:8.3f}  {line.rstrip()}", flush=True)
rc = p.wait()
print(f"{time.perf_counter() - t0:8.3f}  exit {rc}")
sys.exit(rc)
