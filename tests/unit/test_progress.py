"""Long commands show progress and the time left on a terminal, and nothing else with --json.

Why: `deepres simulate --experiment compute` ran for minutes printing nothing; a bar on a script's
stdout would break the JSON a machine reads. Both are checked through a real pseudo-terminal.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from predictor import datapaths

ROOT = Path(__file__).resolve().parents[2]
OPENB = datapaths.OPENB  # the openb traces, in the repository (data/README.md)


def on_a_terminal(argv: list[str], timeout_s: float) -> str:
    """Run argv with stdin, stdout and stderr on one pseudo-terminal; all it wrote there."""
    leader, follower = pty.openpty()
    # a terminal has a size (a fresh pseudo-terminal's is 0 x 0, where a bar has no room at all)
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "COLUMNS": "120"}
    process = subprocess.Popen(argv, stdin=follower, stdout=follower, stderr=follower, cwd=ROOT, env=env)
    os.close(follower)
    chunks = []
    try:
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:  # the follower side closed: the process ended
                break
            if not data:
                break
            chunks.append(data)
    finally:
        process.wait(timeout=timeout_s)
        os.close(leader)
    assert process.returncode == 0, b"".join(chunks).decode(errors="replace")[-2000:]
    return b"".join(chunks).decode(errors="replace")


LOOP = ("import time; from predictor.progress import progress, silence; {silence}"
        "[time.sleep(0.05) for _ in progress(range(20), 'working', unit='step')]; print('end')")


def test_a_terminal_sees_a_bar_with_the_time_left() -> None:
    out = on_a_terminal([sys.executable, "-c", LOOP.format(silence="")], 60)
    assert "working" in out and "20/20" in out, out
    assert "<" in out and "step/s" in out, f"no time-left estimate in {out!r}"


def test_silenced_or_not_a_terminal_draws_nothing() -> None:
    out = on_a_terminal([sys.executable, "-c", LOOP.format(silence="silence();")], 60)
    assert out.strip() == "end", out
    piped = subprocess.run([sys.executable, "-c", LOOP.format(silence="")], capture_output=True, text=True,
                           cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60, check=True)
    assert piped.stdout.strip() == "end" and piped.stderr == "", piped.stderr


@pytest.mark.slow
@pytest.mark.skipif(not OPENB.is_dir(), reason="the openb traces (../shared/data/openb) are not here")
def test_simulate_compute_json_prints_only_json_even_on_a_terminal(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "extender.cli", "simulate", "--experiment", "compute", "--quick", "--seeds", "42",
            "--data", str(OPENB), "--out", str(tmp_path), "--json"]
    out = on_a_terminal(argv, 300)
    parsed = json.loads(out)
    assert set(parsed) == {"gpu_bound", "default"}


def own_lines(out: str, text: str) -> list[str]:
    """Every terminal line holding `text`, as it stands once each carriage return has redrawn it."""
    return [line.split("\r")[-1] for line in out.replace("\r\n", "\n").split("\n") if text in line]


SAYING = ("import time; from predictor.progress import progress, say\n"
          "for i in progress(range(6), 'working', unit='step'):\n"
          "    time.sleep(0.05); say(f'log line {i}')\n"
          "say('after the bar')")


def test_log_lines_go_above_the_bar_never_onto_it() -> None:
    out = on_a_terminal([sys.executable, "-c", SAYING], 60)
    assert "working" in out, out  # the bar was drawn
    for i in range(6):  # each line whole, on its own terminal line (a plain print would follow the bar's text)
        assert own_lines(out, f"log line {i}") == [f"log line {i}"], repr(out)
    piped = subprocess.run([sys.executable, "-c", SAYING], capture_output=True, text=True, cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60, check=True)
    assert piped.stderr.splitlines() == [f"log line {i}" for i in range(6)] + ["after the bar"]  # a log keeps them


CAPACITY = ("import sys, pathlib; from extender.simulate import capacity\n"
            "from extender.simulate.traces import DEFAULT_DATA\n"
            "capacity.run(pathlib.Path(sys.argv[1]), DEFAULT_DATA, [42], quick=True, workers=2, "
            "dists=('pai', 'philly'), rates=(1.0, 4.0), count=40, write=False,\n"
            "             policies=('static', 'static-sjf', 'deepres', 'deepres-one-class'))")


@pytest.mark.slow
@pytest.mark.skipif(not (OPENB / "openb_pod_list_default.csv").is_file(),
                    reason="the openb traces (../shared/data/openb) are not here")
def test_the_capacity_sweep_shows_one_bar_over_every_run_with_its_lines_above(tmp_path: Path) -> None:
    out = on_a_terminal([sys.executable, "-c", CAPACITY, str(tmp_path)], 600)
    # 2 distributions x 4 policies x 2 rates, counted before any run; early stops advance it by what they skip
    assert "0/16" in out and "16/16" in out, out[-3000:]
    for dist in ("pai", "philly"):
        lines = own_lines(out, f"capacity {dist} seed 42 static x1:")
        assert len(lines) == 1 and lines[0].startswith("capacity "), repr(out[-3000:])  # whole, above the bar
