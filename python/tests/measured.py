"""Runs the `kiln` tool installed with the package and measures the run: its
exit code, output, wall time and its own peak memory (os.wait4's rusage of
that child alone), killing it past a time limit."""
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass

import pytest

from kiln._warm import binary


@dataclass
class Measured:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    peak_bytes: int


def run_kiln(args, env, limit=90):
    """`kiln ARGS` with the environment's KILN_ variables replaced by `env`; fails the test past `limit` s."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    full.update(env)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.monotonic()
        process = subprocess.Popen([binary(), *map(str, args)], stdout=out, stderr=err, env=full)
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - start > limit:
                process.kill()
                os.wait4(process.pid, 0)
                pytest.fail(f"kiln {' '.join(map(str, args))} still ran after {limit} s")
            time.sleep(0.02)
        seconds = time.monotonic() - start
        process.returncode = os.waitstatus_to_exitcode(status)  # (reaped here: Popen must not wait again)
        out.seek(0)
        err.seek(0)
        return Measured(process.returncode, out.read().decode(errors="replace"), err.read().decode(errors="replace"),
                        seconds, usage.ru_maxrss * 1024)
