"""kiln.warm: what `kiln warm` does, by the `kiln` binary installed with the package."""
from __future__ import annotations

import os
import subprocess
from typing import Iterable, Optional, Union

from ._errors import CompileError, GraphError

PathLike = Union[str, "os.PathLike[str]"]


def binary() -> str:
    """The `kiln` command-line tool installed with this package."""
    return os.path.join(os.path.dirname(__file__), "bin", "kiln")


def warm(paths: Union[PathLike, Iterable[PathLike]], archs: Optional[Iterable[str]] = None,
         jobs: Optional[int] = None) -> str:
    """Pre-warms the kernel cache from graphs, folders of graphs or manifests;
    returns the summary line. The CLI's environment variables apply."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    command = [binary(), "warm", *[os.fspath(p) for p in paths]]
    for arch in archs or []:
        command += ["--arch", arch]
    if jobs is not None:
        command += ["--jobs", str(int(jobs))]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode == 1:
        raise GraphError(done.stderr.strip())
    if done.returncode != 0:
        raise CompileError(done.stderr.strip() or f"kiln warm exited {done.returncode}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("warmed:")]
    return lines[-1] if lines else done.stdout.strip()
