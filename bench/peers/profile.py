"""Where a server's CPU goes under load: py-spy samples every process of one setup while
``wrk`` drives it, aggregated by function.

    python -m bench.peers.profile --row standin --server smso-serve --workers 2
    python -m bench.peers.profile --row standin --server litserve --workers 2

The setup is started as ``bench.peers`` starts it (the same model, images and flags), warmed
up, then driven by ``--connections`` for ``--seconds`` while ``py-spy record --subprocesses
--format raw`` samples it (``--gil``: only samples holding the GIL). Printed: the load's
requests/s and CPU ms per request (every process, from ``/proc``), and the functions with the
most samples, as the share of all samples of busy threads (``self``: the function itself;
``total``: with what it called). The raw stacks are written beside the JSON. Needs py-spy
(``pip install py-spy``: not a dependency of the project) and ``wrk``.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.lib import RESULTS, report, wrk
from bench.lib.payloads import jpegs
from bench.peers import compare, setups
from bench.peers.__main__ import ROWS, TITLES, model_for
from bench.peers.setups import PEERS, Row, Setup

#: Frames of a thread waiting, not working (py-spy's --idle is off, but a thread blocked in
#: C without releasing its frame shows so): not counted among the busy samples.
IDLE = ("select", "poll", "epoll_wait", "wait", "_wait_for_tstate_lock", "acquire", "sleep")


def _function(frame: str) -> str:
    """``"run (thread.py:58)"`` as ``"run (thread.py)"``: a function, whatever its line."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0].rsplit('/', 1)[-1]})" if where else name


def aggregate(raw: str) -> dict[str, Any]:
    """py-spy's raw (collapsed) stacks: ``frame;frame;... count`` per line. The samples, and
    the share of them in each function itself (the leaf) and anywhere on the stack."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [_function(frame) for frame in stack.split(";")]
        if frames[-1].split(" ")[0] in IDLE:
            continue
        n = int(count)
        samples += n
        own[frames[-1]] += n
        for frame in set(frames[1:]):  # the first frame is the process/thread
            total[frame] += n
    return {
        "samples": samples,
        "self": {f: n / samples for f, n in own.most_common(40)} if samples else {},
        "total": {f: n / samples for f, n in total.most_common(60)} if samples else {},
    }


def py_spy() -> str | None:
    """py-spy's executable: on the PATH, or beside this interpreter (a virtual environment's)."""
    beside = Path(sys.executable).parent / "py-spy"
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


def profile(args: argparse.Namespace) -> dict[str, Any]:
    """The setup started, warmed up, driven and sampled: the load and the profile."""
    exe = py_spy()
    row = Row(args.row, TITLES[args.row], model_for(args.row, args.models), jpegs(32))
    setup = Setup(args.server, args.workers, tuple(args.flags.split()) if args.flags else ())
    out = args.json.parent
    raw_path = out / f"profile-{args.row}-{setup.slug}{'-gil' * args.gil}.txt"
    with setups.start(setup, row, args.peers_python, out / f"profile-{setup.slug}.log") as server:
        found = setups.target(setup, server.base, row.files)
        wrk.load(found.url, found.bodies, args.connections, 3)  # warm-up
        command = [str(exe), "record", "--pid", str(server.pid), "--subprocesses", "--nonblocking"]
        command += ["--rate", "250", "--duration", str(args.seconds + 2)]
        command += ["--format", "raw", "--output", str(raw_path)] + ["--gil"] * args.gil
        spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        with server.meter() as cpu:
            load = wrk.load(found.url, found.bodies, args.connections, args.seconds)
        spy.wait(timeout=args.seconds + 60)
    compare.metered(load, cpu.result)
    text = raw_path.read_text() if raw_path.exists() else ""
    return {"setup": setup.label, "row": args.row, "load": load, "profile": aggregate(text)}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--row", choices=ROWS, default="standin")
    parser.add_argument("--server", choices=["smso-serve", *PEERS], default="smso-serve")
    parser.add_argument("--workers", type=int, default=1, help="1: smso-serve's auto")
    parser.add_argument("--flags", default="", help="smso-serve's flags, in one string")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--gil", action="store_true", help="only samples holding the GIL")
    parser.add_argument("--peers-python", type=Path, default=setups.PEERS_PYTHON)
    parser.add_argument("--models", type=Path, default=RESULTS / "peers-models")
    parser.add_argument("--json", type=Path, default=RESULTS / "peers-profile.json")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if py_spy() is None or not wrk.available():
        print("bench.peers.profile needs py-spy (pip install py-spy) and wrk", file=sys.stderr)
        return 2
    args.json.parent.mkdir(parents=True, exist_ok=True)
    result = profile(args)
    load, found = result["load"], result["profile"]
    cpu = load.get("server_cpu_ms_per_request", float("nan"))
    print(
        f"{result['setup']} on {args.row}: {load.get('requests_per_second', 0):.1f} req/s, "
        f"{cpu:.2f} CPU ms/req, {found['samples']} busy samples\n"
    )
    rows = [
        [name, f"{100 * share:.1f}", f"{100 * found['total'].get(name, share):.1f}"]
        for name, share in list(found["self"].items())[:25]
    ]
    print(report.markdown_table(["function (file)", "self %", "total %"], rows))
    report.save(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
