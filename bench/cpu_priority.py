"""``python -m bench.cpu_priority``: what each ``--export-cpu`` priority of ``bench.mvcc_cli``
leaves to PostgreSQL, on this machine's scheduler, in a few seconds.

python -m bench.cpu_priority [--seconds 8] [--backends N]

For each priority, side by side: ``--backends`` busy loops (default: one per core), each in a
session of its own as PostgreSQL's backends are, and as many busy loops started under the
priority's command prefix (bench/mvcc.py ``EXPORT_CPU``), all running to one deadline. The
table gives the CPU seconds each side got and the export's share of them: where the kernel
groups processes by session (autogroup), plain ``nice`` leaves the export a backend's
share, and a session of its own at nice 19 leaves it almost nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from .mvcc import EXPORT_CPU

# A busy loop until an absolute deadline (so a loop the scheduler holds back does not run
# longer), then the CPU seconds it got.
SPIN = (
    "import sys, time\n"
    "deadline = float(sys.argv[1])\n"
    "while time.time() < deadline:\n"
    "    pass\n"
    "print(time.process_time())\n"
)


def autogroup_enabled() -> str:
    path = Path("/proc/sys/kernel/sched_autogroup_enabled")
    return path.read_text().strip() if path.exists() else "absent"


def measure(prefix: list[str], loops: int, seconds: float) -> tuple[float, float]:
    """(CPU seconds of the backend-like loops, of the loops under ``prefix``)."""
    deadline = f"{time.time() + 1.0 + seconds:.3f}"  # 1 s for every loop to start
    spin = [sys.executable, "-c", SPIN, deadline]
    backends = [
        subprocess.Popen(spin, stdout=subprocess.PIPE, text=True, start_new_session=True)
        for _ in range(loops)
    ]
    exports = [
        subprocess.Popen([*prefix, *spin], stdout=subprocess.PIPE, text=True) for _ in range(loops)
    ]

    def total(procs: list[subprocess.Popen[str]]) -> float:
        return sum(float(proc.communicate()[0]) for proc in procs)

    return total(backends), total(exports)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seconds", type=float, default=8.0, help="how long each priority's loops run"
    )
    parser.add_argument(
        "--backends",
        type=int,
        default=os.cpu_count() or 2,
        help="busy loops standing for backends, and as many under the priority (default: cores)",
    )
    args = parser.parse_args()
    print(
        f"{os.cpu_count()} cores, autogroup {autogroup_enabled()}; {args.backends} "
        f"backend-like loops and {args.backends} export loops, {args.seconds:g} s each\n"
    )
    print("| --export-cpu | backends' CPU s | export's CPU s | export's share |")
    print("|---|--:|--:|--:|")
    for name, prefix in sorted(EXPORT_CPU.items()):
        backends, export = measure(prefix, args.backends, args.seconds)
        share = export / (backends + export) if backends + export else 0.0
        print(f"| {name} | {backends:.2f} | {export:.2f} | {share:.1%} |", flush=True)


if __name__ == "__main__":
    main()
