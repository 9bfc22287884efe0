"""Code reward: sandbox containment of hostile programs, 10 hand-written problems, concurrency."""

from __future__ import annotations

import os
import shutil
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from scalerl_mega.rewards.code import extract_code, normalize_tests, score_code, stdout_matches, values_match
from scalerl_mega.rewards.sandbox import Isolation, SandboxLimits, detect_isolation, run_python

REPO = Path(__file__).resolve().parents[2]
T = "<think>let me write it</think>"


def wrap(code: str) -> str:
    return f"{T}Here is my solution:\n```python\n{code}\n```\n"


SLACK_S = 600.0
"""Wall-clock limit for programs whose expected outcome is *not* a timeout, a safety net only: they finish (or
fail) in well under a second alone, but the interpreter's start alone took over 3 s on a loaded 2-core CI machine
(a 3 s limit made the 1 GB allocation test report a timeout instead of its MemoryError)."""


def score(text: str, tests: list, **kw):
    """`score_code` with the `SLACK_S` limit unless the test sets its own."""
    return score_code(text, tests, **{"time_limit_s": SLACK_S, **kw})


def run(code: str, *, stdin: bytes = b"", **lim) -> "object":
    limits = SandboxLimits(**{"time_limit_s": SLACK_S, "memory_mb": 256, "max_processes": 8, **lim})
    return run_python({"main.py": code}, ["main.py"], stdin=stdin, limits=limits)


isolated = pytest.mark.skipif(detect_isolation() is Isolation.NONE, reason="no namespace isolation on this host")

# ---------------------------------------------------------------- hostile programs


@isolated
def test_fork_bomb_is_contained_and_leaves_no_process():
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    r = run(bomb, time_limit_s=2.0, max_processes=8, memory_mb=128)
    assert r.timed_out
    if r.uid is not None:  # root isolation: every sandbox process ran as this uid
        # killed processes may linger as zombies until the host's init reaps them; none may still run
        left = [p for p in psutil.process_iter(["uids", "status"])
                if p.info["uids"] and p.info["uids"].real == r.uid and p.info["status"] != psutil.STATUS_ZOMBIE]
        assert left == []
    res = score_code(wrap(bomb), [{"input": "", "output": "1"}], time_limit_s=2.0, memory_mb=128, max_processes=8)
    assert not res.passed and "timeout" in res.reason


@isolated
def test_process_count_limit_mild():
    # the containment mechanism itself, on something harmless: 30 sleeps, limit 8 processes
    prog = ("import subprocess\nok = 0\nfor _ in range(30):\n    try:\n        subprocess.Popen(['sleep', '1']); ok += 1\n"
            "    except OSError:\n        pass\nprint(ok)\n")
    r = run(prog, max_processes=8)
    assert r.returncode == 0
    assert 1 <= int(r.stdout) < 8


def test_infinite_loop_times_out():
    res = score_code(wrap("while True:\n    pass"), [{"input": "", "output": "1"}], time_limit_s=1.0)
    assert not res.passed and "timeout" in res.reason


def test_one_gigabyte_allocation_fails():
    code = "x = bytearray(1 << 30)\nprint(1)"
    res = score_code(wrap(code), [{"input": "", "output": "1"}], time_limit_s=SLACK_S, memory_mb=256)
    assert not res.passed and "MemoryError" in res.reason


def test_hundred_megabytes_of_stdout_is_cut():
    code = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(100):\n    sys.stdout.write(chunk)\n"
    r = run(code, max_output_bytes=1 << 20)
    assert r.output_overflow and len(r.stdout) == 1 << 20
    res = score(wrap(code), [{"input": "", "output": "x"}], max_output_bytes=1 << 20)
    assert not res.passed and "output_limit" in res.reason


@isolated
def test_cannot_read_etc_passwd():
    first_line = Path("/etc/passwd").read_text().splitlines()[0]
    code = "print(open('/etc/passwd').read().splitlines()[0])"
    res = score(wrap(code), [{"input": "", "output": first_line}])
    assert not res.passed
    r = run("import os\nprint(len(open('/etc/passwd').read()))")
    assert r.stdout.strip() == b"0"


@isolated
def test_cannot_read_project_files():
    secret = (REPO / "pyproject.toml").read_text().splitlines()[0]
    for path in [str(REPO / "pyproject.toml"), "../../pyproject.toml", "../pyproject.toml", "pyproject.toml"]:
        code = f"print(open({path!r}).read().splitlines()[0])"
        res = score(wrap(code), [{"input": "", "output": secret}])
        assert not res.passed, path
    r = run(f"import os\nprint(os.path.exists({str(REPO)!r}), os.listdir('/tmp'), os.getcwd())")
    assert r.stdout.decode().split()[:2] == ["False", "[]"], r


@isolated
def test_cannot_write_outside_scratch(tmp_path):
    targets = [str(REPO / f"escape_{os.getpid()}"), str(tmp_path / "escape"), f"/run/lock/scalerl_{os.getpid()}",
               f"/var/lock/scalerl_{os.getpid()}", f"/var/tmp/scalerl_{os.getpid()}", f"/run/scalerl_{os.getpid()}", f"/etc/scalerl_{os.getpid()}",
               f"/usr/scalerl_{os.getpid()}", f"/scalerl_{os.getpid()}", f"/mnt/scalerl_{os.getpid()}"]
    code = "import sys\nfor p in sys.stdin.read().split():\n    try:\n        open(p, 'w').write('x')\n        print('WROTE')\n" \
           "    except OSError:\n        print('BLOCKED')\nopen('inside.txt', 'w').write('ok')\nprint(open('inside.txt').read())\n"
    r = run(code, stdin=" ".join(targets).encode())
    assert r.stdout.decode().split() == ["BLOCKED"] * len(targets) + ["ok"], r
    for t in targets:
        assert not Path(t).exists(), t


@isolated
def test_private_tmp_writes_do_not_persist_on_host():
    # /tmp, /var/tmp-style scratch and /dev/shm are private tmpfs: writable inside, gone afterwards
    names = [f"/tmp/scalerl_escape_{os.getpid()}", f"/dev/shm/scalerl_escape_{os.getpid()}",
             f"/mnt/work/scalerl_escape_{os.getpid()}"]
    code = "import sys\nfor p in sys.stdin.read().split():\n    open(p, 'w').write('x')\n    print(open(p).read())\n"
    r = run(code, stdin=" ".join(names).encode())
    assert r.stdout.decode().split() == ["x"] * len(names), r
    for n in names:
        assert not Path(n).exists(), n
    # and a second run does not see the first run's files
    r2 = run("import os\nprint(sorted(os.listdir('/tmp')), sorted(os.listdir('/dev/shm')), sorted(os.listdir('.')))")
    assert r2.stdout.decode().split() == ["[]", "[]", "['main.py']"], r2


@isolated
def test_host_runtime_dirs_and_datasets_are_not_visible(tmp_path):
    # a dataset in a top-level directory that nobody listed (here: under the host's /tmp and the checkout)
    data = tmp_path / "dataset.jsonl"
    data.write_text('{"expected": "SECRET"}\n')
    probes = [str(data), str(tmp_path), "/run", "/var", "/var/tmp", "/run/lock", "/home", "/root", "/work",
              str(REPO), "/sys", "/etc/passwd", "/etc/hostname"]
    code = ("import os, sys\nfor p in sys.stdin.read().split():\n    try:\n"
            "        print(p, 'FILE' if os.path.isfile(p) and os.path.getsize(p) else 'DIR' if os.path.isdir(p) "
            "and os.listdir(p) else 'NONE')\n    except OSError:\n        print(p, 'NONE')\n")
    r = run(code, stdin=" ".join(probes).encode())
    seen = dict(line.split() for line in r.stdout.decode().splitlines())
    assert seen == {p: "NONE" for p in probes}, r
    assert os.path.isdir("/run") and os.path.isdir("/var")  # the probe is meaningful: they exist on the host


@isolated
def test_dataset_in_an_unlisted_top_level_directory_is_not_readable():
    top = Path(f"/scalerl_dataset_{os.getpid()}")
    try:
        top.mkdir()
    except OSError:
        pytest.skip("cannot create a top-level directory here")
    try:
        (top / "train.jsonl").write_text('{"tests": [{"input": "", "output": "SECRET"}]}\n')
        tests = [{"input": "", "output": "SECRET"}]
        cheat = f"print(open({str(top / 'train.jsonl')!r}).read().split('output\": \"')[1].split('\"')[0])"
        res = score(wrap(cheat), tests)
        assert not res.passed and "FileNotFoundError" in res.reason, res
    finally:
        shutil.rmtree(top)


@isolated
def test_caller_can_hide_paths_under_visible_system_dirs():
    hidden = "/usr/share"  # visible by default (read-only system directory)
    code = "import os\nprint(len(os.listdir('/usr/share')), os.path.isdir('/usr/bin'))"
    shown = run_python({"main.py": code}, ["main.py"], limits=SandboxLimits(time_limit_s=SLACK_S))
    masked = run_python({"main.py": code}, ["main.py"], limits=SandboxLimits(time_limit_s=SLACK_S),
                        hide_paths=[hidden])
    assert shown.stdout.split()[0] != b"0" and shown.stdout.split()[1] == b"True"
    assert masked.stdout.split() == [b"0", b"True"], masked


@isolated
def test_sysv_ipc_does_not_outlive_the_run():
    # create a SysV shm segment and a semaphore set with IPC_CREAT and leave them; the host must not see them
    code = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "shm = libc.shmget(0, 1 << 20, 0o1000 | 0o666)\nsem = libc.semget(0, 1, 0o1000 | 0o666)\n"
            "print(shm, sem)\n"
            "print(open('/proc/sysvipc/shm').read().count('\\n') - 1, open('/proc/sysvipc/sem').read().count('\\n') - 1)")
    before = _sysv_ids()
    r = run(code)
    lines = r.stdout.decode().split()
    assert r.returncode == 0 and int(lines[0]) >= 0 and int(lines[1]) >= 0, r
    assert lines[2:] == ["1", "1"]  # exactly the run's own objects exist in its namespace
    assert _sysv_ids() == before


def _sysv_ids() -> tuple[set[str], set[str]]:
    def ids(kind: str) -> set[str]:
        rows = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]
        return {r.split()[1] for r in rows if r.split()}
    return ids("shm"), ids("sem")


@isolated
@pytest.mark.parametrize("where", ["/run", "/var/tmp", "/tmp"])
def test_unix_socket_on_host_is_unreachable(where):
    if not os.access(where, os.W_OK):
        pytest.skip(f"{where} not writable here")
    path = f"{where}/scalerl_sock_{os.getpid()}"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(1)
    srv.settimeout(0.2)
    try:
        code = ("import socket, sys\np = sys.stdin.read()\ns = socket.socket(socket.AF_UNIX)\ntry:\n"
                "    s.connect(p)\n    s.sendall(b'hi')\n    print('CONNECTED')\nexcept OSError:\n    print('BLOCKED')\n")
        r = run(code, stdin=path.encode())
        assert r.stdout.strip() == b"BLOCKED", r
        with pytest.raises(TimeoutError):
            srv.accept()
    finally:
        srv.close()
        os.unlink(path)


@isolated
def test_scratch_has_a_size_quota():
    # 8 MiB of scratch (files of up to 16 MiB allowed): 1 MiB chunks into /tmp stop with ENOSPC at <= 8
    code = ("import errno\nn = 0\ntry:\n    for i in range(200):\n        with open(f'/tmp/f{i}', 'wb') as f:\n"
            "            f.write(b'x' * (1 << 20))\n        n += 1\nexcept OSError as e:\n    print(errno.errorcode[e.errno])\n"
            "print(n)\n")
    r = run(code, scratch_mb=8, max_file_mb=16)
    out = r.stdout.decode().split()
    assert out[0] == "ENOSPC", r
    assert int(out[1]) <= 8


@isolated
def test_no_network():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(0.2)
    port = srv.getsockname()[1]
    got = []

    def accept():
        try:
            conn, _ = srv.accept()
            got.append(conn.recv(100))
        except OSError:
            pass

    th = threading.Thread(target=accept)
    th.start()
    code = ("import socket\ntry:\n    s = socket.create_connection(('127.0.0.1', %d), timeout=1)\n    s.sendall(b'hi')\n"
            "    print('CONNECTED')\nexcept OSError as e:\n    print('BLOCKED')\n") % port
    r = run(code)
    th.join()
    srv.close()
    assert r.stdout.strip() == b"BLOCKED"
    assert got == []
    r = run("import socket\ntry:\n    socket.create_connection(('1.1.1.1', 53), timeout=1)\n    print('CONNECTED')\n"
            "except OSError:\n    print('BLOCKED')\n")
    assert r.stdout.strip() == b"BLOCKED"


def test_environment_is_empty(monkeypatch):
    monkeypatch.setenv("SCALERL_SECRET_TOKEN", "hunter2")
    res = score(wrap("import os\nprint(os.environ.get('SCALERL_SECRET_TOKEN', 'none'))"),
                     [{"input": "", "output": "hunter2"}])
    assert not res.passed
    r = run("import os\nprint(sorted(os.environ))")
    assert "SCALERL_SECRET_TOKEN" not in r.stdout.decode()
    assert set(eval(r.stdout)) <= {"PATH", "HOME", "LANG", "LD_LIBRARY_PATH", "LC_CTYPE"}


def test_scratch_dir_is_deleted(monkeypatch):
    import scalerl_mega.rewards.sandbox as sb

    made = []
    real = sb.tempfile.mkdtemp

    def record(*a, **k):
        made.append(real(*a, **k))
        return made[-1]

    monkeypatch.setattr(sb.tempfile, "mkdtemp", record)
    r = run("open('f.txt', 'w').write('x')\nprint(open('f.txt').read())")
    assert r.stdout.strip() == b"x"
    assert len(made) == 1 and not Path(made[0]).exists()


# ---------------------------------------------------------------- 10 hand-written problems

PROBLEMS = [
    # (tests, correct solution, incorrect solution)
    ([{"input": "2 3\n", "output": "5\n"}, {"input": "-4 10\n", "output": "6\n"}],
     "a, b = map(int, input().split())\nprint(a + b)", "a, b = map(int, input().split())\nprint(a * b)"),
    ([{"input": "hello\n", "output": "olleh\n"}, {"input": "ab\n", "output": "ba"}],
     "print(input()[::-1])", "print(input())"),
    ([{"input": "5\n3 1 4 1 5\n", "output": "1 1 3 4 5\n"}],
     "input()\nprint(*sorted(map(int, input().split())))", "input()\nprint(*map(int, input().split()))"),
    ([{"input": "10\n", "output": "55\n"}, {"input": "1\n", "output": "1\n"}],
     "n = int(input())\na, b = 0, 1\nfor _ in range(n):\n    a, b = b, a + b\nprint(a)",
     "n = int(input())\nprint(n * (n + 1) // 2 if n < 5 else n)"),
    ([{"input": "3\n", "output": "1\n2\nFizz\n"}, {"input": "5\n", "output": "1\n2\nFizz\n4\nBuzz\n"}],
     "n = int(input())\nfor i in range(1, n + 1):\n    print('FizzBuzz' if i % 15 == 0 else 'Fizz' if i % 3 == 0 else 'Buzz' if i % 5 == 0 else i)",
     "n = int(input())\nfor i in range(1, n + 1):\n    print('Fizz' if i % 5 == 0 else i)"),
    ([{"input": "1 3\n", "output": "0.333333333\n"}],
     "a, b = map(int, input().split())\nprint(f'{a / b:.9f}')", "a, b = map(int, input().split())\nprint(a // b)"),
    ([{"fn_name": "two_sum", "args": [[2, 7, 11, 15], 9], "expected": [0, 1]},
      {"fn_name": "two_sum", "args": [[3, 2, 4], 6], "expected": [1, 2]}],
     "def two_sum(nums, target):\n    seen = {}\n    for i, x in enumerate(nums):\n        if target - x in seen:\n"
     "            return [seen[target - x], i]\n        seen[x] = i",
     "def two_sum(nums, target):\n    return [0, 1]"),
    ([{"fn_name": "isPalindrome", "args": ["racecar"], "expected": True},
      {"fn_name": "isPalindrome", "args": ["ab"], "expected": False}],
     "class Solution:\n    def isPalindrome(self, s):\n        return s == s[::-1]",
     "class Solution:\n    def isPalindrome(self, s):\n        return True"),
    ([{"fn_name": "mean", "args": [[1, 2, 3, 4]], "expected": 2.5}],
     "def mean(xs):\n    return sum(xs) / len(xs)", "def mean(xs):\n    return sum(xs) // len(xs)"),
    ([{"fn_name": "gcd", "args": [12, 18], "expected": 6}, {"fn_name": "gcd", "args": [7, 13], "expected": 1}],
     "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a", "def gcd(a, b):\n    return min(a, b)"),
]


@pytest.mark.parametrize("idx", range(len(PROBLEMS)))
def test_ten_problems_correct_and_incorrect(idx):
    tests, good, bad = PROBLEMS[idx]
    ok = score(wrap(good), tests)
    assert ok.passed and ok.reward == 1.0, ok
    ko = score(wrap(bad), tests)
    assert not ko.passed and ko.reward == -1.0, ko


def test_partial_credit_fraction():
    tests = [{"input": "1\n", "output": "1\n"}, {"input": "2\n", "output": "4\n"}, {"input": "3\n", "output": "9\n"},
             {"input": "0\n", "output": "0\n"}]
    res = score(wrap("print(int(input()))"), tests, partial_credit=True)
    # passes inputs 1 and 0: 2/4 -> -1 + 2 * 0.5 = 0
    assert not res.passed and res.reward == pytest.approx(0.0)


def test_missing_code_block_and_unclosed_think():
    assert score_code("<think>no end", [{"input": "", "output": ""}]).reason == "unclosed_think"
    assert score_code(T + "print(1)", [{"input": "", "output": "1"}]).reason == "no_code_block"
    assert extract_code(T + "```python\nA\n```\ntext\n```py\nB\n```") == "B\n"


def test_thirty_two_programs_concurrently():
    tests, good, _ = PROBLEMS[0]
    slow_good = "import time\ntime.sleep(0.2)\n" + good
    with ThreadPoolExecutor(32) as ex:
        results = list(ex.map(lambda _: score_code(wrap(slow_good), tests, time_limit_s=SLACK_S), range(32)))
    assert all(r.passed for r in results), [r.reason for r in results if not r.passed]


# ---------------------------------------------------------------- test formats


def test_normalize_deepcoder_formats():
    lcb = '[{"input": "[1, 2]\\n3", "output": "[1, 2, 3]", "testtype": "functional", "metadata": {"func_name": "f"}},' \
          ' {"input": "1\\n", "output": "2\\n", "testtype": "stdin"}]'
    assert normalize_tests(lcb) == [{"fn_name": "f", "args": [[1, 2], 3], "expected": [1, 2, 3]},
                                    {"input": "1\n", "output": "2\n"}]
    taco = {"inputs": ["1\n", "2\n"], "outputs": ["1\n", "4\n"]}
    assert normalize_tests(taco) == [{"input": "1\n", "output": "1\n"}, {"input": "2\n", "output": "4\n"}]
    taco_fn = {"fn_name": "sq", "inputs": [[2], [3]], "outputs": [[4], [9]]}
    assert normalize_tests(taco_fn) == [{"fn_name": "sq", "args": [2], "expected": 4},
                                        {"fn_name": "sq", "args": [3], "expected": 9}]
    prime = [{"input": "5", "output": "25", "type": "stdin_stdout"}]
    assert normalize_tests(prime) == [{"input": "5", "output": "25"}]
    with pytest.raises(ValueError, match="tests\\[0\\]"):
        normalize_tests([{"foo": 1}])
    with pytest.raises(ValueError, match="JSON"):
        normalize_tests("[{")


def test_comparators():
    assert stdout_matches("1 2 \n3\n\n", "1 2\n3")
    assert stdout_matches("0.3333333", "0.333333333")
    assert not stdout_matches("1 2", "1 3")
    assert values_match([1, 2.0000000001], [1, 2])
    assert not values_match(True, 1)
    assert not values_match([1, 2], [1, 2, 3])


def _userns_works() -> bool:
    from scalerl_mega.rewards.sandbox import _probe_sandbox

    return _probe_sandbox(Isolation.USERNS) is None


@pytest.mark.skipif(not _userns_works(), reason="user namespaces unavailable here")
def test_userns_mode_has_the_same_filesystem_and_ipc_view(tmp_path):
    (tmp_path / "data.jsonl").write_text("SECRET\n")
    code = ("import os, ctypes\nprint(os.path.exists(os.environ.get('X', '/run')), os.path.exists('/var'), "
            "os.path.exists(%r), os.listdir('/tmp'))\n"
            "libc = ctypes.CDLL(None)\nprint(libc.shmget(0, 4096, 0o1000 | 0o666) >= 0)\n"
            "open('/tmp/x', 'w').write('y')\nprint(open('/tmp/x').read())\n") % str(tmp_path / "data.jsonl")
    before = _sysv_ids()
    r = run_python({"main.py": code}, ["main.py"], limits=SandboxLimits(time_limit_s=SLACK_S),
                   isolation=Isolation.USERNS)
    assert r.stdout.decode().split("\n")[:3] == ["False False False []", "True", "y"], r
    assert _sysv_ids() == before


def test_degraded_mode_warns_loudly(monkeypatch):
    import scalerl_mega.rewards.sandbox as sb

    monkeypatch.setattr(sb.shutil, "which", lambda name: None)
    sb.detect_isolation.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="NO network isolation, NO filesystem hiding, NO IPC isolation"):
            assert sb.detect_isolation() is Isolation.NONE
    finally:
        sb.detect_isolation.cache_clear()
