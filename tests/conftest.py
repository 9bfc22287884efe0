"""Shared pytest setup: GPU tests are skipped without CUDA; nothing heavy is imported here.

No process may outlive its test: at the end of the session each pytest process that ran
tests -- the only one, or each xdist worker -- lists its live descendants (psutil), gives them
`LEAK_GRACE_S` to exit, then SIGKILLs the survivors and fails the session naming their command lines.
Left out: processes that were already there at session start and this process's own multiprocessing
resource tracker (it exits when this interpreter does). An xdist controller runs no tests; its
workers send their findings to it (`workeroutput`), and it fails the session.
"""

from __future__ import annotations

import os
import time

import pytest

LEAK_GRACE_S = float(os.environ.get("SCALERL_LEAK_GRACE_S", "10"))
"""How long processes still running at the end of the session get to exit by themselves."""
_LEAKS_KEY = "scalerl_leaked_processes"


def pytest_collection_modifyitems(config, items):
    if not any("gpu" in item.keywords for item in items):
        return  # nothing to skip: spare the torch import
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # pragma: no cover
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs CUDA (this machine has no GPU)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def one_torch_thread():
    """Run the test with one intra-op torch thread, restoring the old count after.

    The rollout tests compare tokens and log-probs computed in different processes and threads;
    one thread keeps their reductions in one order and keeps a loaded 2-core CI box responsive.
    """
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _descendants() -> list:
    import psutil

    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:  # pragma: no cover
        return []


def _alive(proc) -> bool:
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _describe(proc) -> str:
    import psutil

    try:
        return f"pid {proc.pid}: {' '.join(proc.cmdline())[:300]}"
    except psutil.Error:
        return f"pid {proc.pid}: (gone)"


def _is_own_resource_tracker(proc) -> bool:
    import psutil

    try:
        return proc.ppid() == os.getpid() and "multiprocessing.resource_tracker" in " ".join(proc.cmdline())
    except psutil.Error:
        return False


def _is_xdist_controller(config) -> bool:
    return not hasattr(config, "workerinput") and config.pluginmanager.has_plugin("dsession")


def pytest_sessionstart(session):
    session.config._scalerl_preexisting = {p.pid for p in _descendants()}
    session.config._scalerl_leaks = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist controller: collect what a worker found."""
    leaks = getattr(node, "workeroutput", {}).get(_LEAKS_KEY) or []
    node.config._scalerl_leaks.extend(f"[{node.gateway.id}] {x}" for x in leaks)


def _leaked(config) -> list[str]:
    """This process's descendants still running after LEAK_GRACE_S (then killed), described."""
    before = getattr(config, "_scalerl_preexisting", set())
    procs = [p for p in _descendants() if p.pid not in before and not _is_own_resource_tracker(p)]
    deadline = time.monotonic() + LEAK_GRACE_S
    while (procs := [p for p in procs if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    import psutil

    found = [_describe(p) for p in procs]
    for p in procs:
        try:
            p.kill()
        except psutil.Error:  # gone meanwhile
            pass
    psutil.wait_procs(procs, timeout=5)  # reaps those that are our own children
    return found


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if not _is_xdist_controller(config):
        leaks = _leaked(config)
        if hasattr(config, "workeroutput"):  # xdist worker: the controller reports and fails
            config.workeroutput[_LEAKS_KEY] = leaks
            return
        config._scalerl_leaks.extend(leaks)
    if config._scalerl_leaks and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    leaks = getattr(config, "_scalerl_leaks", [])
    if leaks:
        terminalreporter.section("processes that outlived the tests (killed)", red=True)
        for line in leaks:
            terminalreporter.write_line(line)
        terminalreporter.write_line(f"FAILED: {len(leaks)} process(es) started by the tests outlived them "
                                    f"(still running {LEAK_GRACE_S:g} s after the session)", red=True)
