"""Benchmark: ``gpu-admission report`` over a synthetic fleet served by the repository's fake API server.

The fake (tests/fakeapi, in a process of its own, started by bench/index.py)
serves 5,000 GPU nodes of four models, 200 namespaces and 100,000 pods, 3 in
10 of them with a GPU. ``gpu-admission report -A`` lists everything page by
page (500 a page), judges every pod as if created now, and writes a
PolicyReport per namespace by server-side apply, in a process of its own;
the same run then measures ``gpu-admission audit --cluster -A -o json`` over
the same fleet (the same judgements, its pods listed once where the report
lists them twice, a report on stdout instead of writes) as the baseline. Printed for each: wall time, CPU time and peak RSS
(the command's own ``ru_maxrss``), and the ratios. No timing is asserted:
the machine is shared.

    make bench-report             # or: python bench/report.py [--nodes N --pods M]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.engine import REPO  # noqa: E402
from bench.index import NAMESPACES, _kubeconfig  # noqa: E402

#: runs the CLI and says, last on stderr, its peak RSS and CPU time
_MEASURED = (
    "import resource, sys\n"
    "from webhook import cli\n"
    "code = cli.main(sys.argv[1:])\n"
    "usage = resource.getrusage(resource.RUSAGE_SELF)\n"
    "print(f'measured: {usage.ru_maxrss} {usage.ru_utime + usage.ru_stime}', file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def measure(args: list[str]) -> tuple[float, float, float, str, int]:
    """(wall s, CPU s, peak RSS MB, stdout's last line, exit code) of one CLI run."""
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _MEASURED, *args], capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - began
    lines = [line for line in done.stderr.splitlines() if line.startswith("measured: ")]
    if not lines:
        raise SystemExit(f"{args[0]} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    rss_kb, cpu = lines[-1].split()[1:]
    last = (done.stdout.strip().splitlines() or [""])[-1]
    return wall, float(cpu), int(rss_kb) / 1024, last, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=100_000)
    args = parser.parse_args()
    started = time.perf_counter()
    fake = subprocess.Popen([sys.executable, str(REPO / "bench" / "index.py"), "--serve-fake", "--nodes", str(args.nodes),
                             "--pods", str(args.pods)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)  # fmt: skip
    assert fake.stdout is not None and fake.stdin is not None
    url = fake.stdout.readline().strip()
    print(f"fake API server: {args.nodes} nodes, {args.pods} pods, {NAMESPACES} namespaces loaded in "
          f"{time.perf_counter() - started:.1f} s at {url}")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            kubeconfig = str(_kubeconfig(url, Path(tmp)))
            common = ["--policies", str(REPO / "policies"), "--kubeconfig", kubeconfig, "-A"]
            report = measure(["report", *common])
            audit = measure(["audit", "--cluster", "-o", "json", *common])
            again = measure(["report", *common])  # the reports exist now: every write is an update
    finally:
        fake.stdin.close()
        fake.wait(60)
    for name, (wall, cpu, rss, last, code) in (("report (first run)", report), ("report (second run)", again),
                                               ("audit --cluster -o json (baseline)", audit)):  # fmt: skip
        print(f"{name:36} wall {wall:6.1f} s  CPU {cpu:6.1f} s  peak RSS {rss:6.0f} MB  exit {code}")
    print(f"report: {report[3]}")
    print(f"ratio report / audit: wall {report[0] / audit[0]:.2f}x, CPU {report[1] / audit[1]:.2f}x, "
          f"peak RSS {report[2] / audit[2]:.2f}x")


if __name__ == "__main__":
    main()
