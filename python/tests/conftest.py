"""A time limit for every test of the Python module, so that `make test` (and CI) cannot hang.

Each test has SEISTOMO_TEST_TIMEOUT seconds (default 300; the slowest takes a few). Past that,
SIGALRM raises TimeoutError in the main thread: in Python code at once, inside a seistomo solve
at its next signal check (every 50 ms), so the test fails and the run goes on. A test stuck
where signals are never looked at is ended 60 s later by faulthandler, which prints every
thread's traceback and exits: the run fails instead of hanging. Where the pytest-timeout plugin
is installed and given a limit, its limit applies instead (installed without one, as on the GPU
machine's Python, it limits nothing, so this file's still does). Where SIGALRM does not exist
(not POSIX) there is no limit."""

import faulthandler
import os
import signal
import sys

import pytest

LIMIT = float(os.environ.get("SEISTOMO_TEST_TIMEOUT", "300"))
HARD_EXTRA = 60.0


def _plugin_limits(request):
    """Whether the pytest-timeout plugin limits this test: installed *and* given a limit (its
    --timeout, its ini key, PYTEST_TIMEOUT or a timeout mark). Installed alone it limits nothing,
    and this file's limit applies."""
    config = request.config
    if not config.pluginmanager.hasplugin("timeout"):
        return False
    if request.node.get_closest_marker("timeout") is not None:
        return True
    values = [os.environ.get("PYTEST_TIMEOUT")]
    for get in (config.getoption, config.getini):
        try:
            values.append(get("timeout"))
        except (ValueError, KeyError):
            pass
    for v in values:
        try:
            if v is not None and float(v) > 0:
                return True
        except (TypeError, ValueError):
            pass
    return False


@pytest.fixture(autouse=True)
def _time_limit(request):
    if not hasattr(signal, "SIGALRM") or _plugin_limits(request):
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
