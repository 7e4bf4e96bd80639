"""A time limit for every test of the Python module, so that `make test` (and CI) cannot hang.

Each test has SEISTOMO_TEST_TIMEOUT seconds (default 300; the slowest takes a few). Past that,
SIGALRM raises TimeoutError in the main thread: in Python code at once, inside a seistomo solve
at its next signal check (every 50 ms), so the test fails and the run goes on. A test stuck
where signals are never looked at is ended 60 s later by faulthandler, which prints every
thread's traceback and exits: the run fails instead of hanging. With the pytest-timeout plugin
installed its own limit applies instead. Where SIGALRM does not exist (not POSIX) there is no
limit."""

import faulthandler
import os
import signal
import sys

import pytest

LIMIT = float(os.environ.get("SEISTOMO_TEST_TIMEOUT", "300"))
HARD_EXTRA = 60.0


@pytest.fixture(autouse=True)
def _time_limit(request):
    if not hasattr(signal, "SIGALRM") or request.config.pluginmanager.hasplugin("timeout"):
        yield
        return
    nodeid = request.node.nodeid

    def expired(signum, frame):
        raise TimeoutError(
            f"{nodeid}: still running after {LIMIT:g} s (the time limit, SEISTOMO_TEST_TIMEOUT)")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, LIMIT)
    faulthandler.dump_traceback_later(LIMIT + HARD_EXTRA, exit=True, file=sys.stderr)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        faulthandler.cancel_dump_traceback_later()
