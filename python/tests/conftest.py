"""Shared fixtures: the repository's example graphs, a private kernel cache,
the `kiln` tool installed with the package."""
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").rglob("*.json"))


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    # The library reads its environment once, at its first use: set it before.
    os.environ["KILN_CACHE_DIR"] = str(tmp_path_factory.mktemp("kiln-cache"))
    # Plans as on CI's machine, without cuBLASLt, also where it loads; a run that
    # wants the vendor tactic says so (tools/gpu-check.sh: KILN_VENDOR=auto for test_gpu.py).
    os.environ.setdefault("KILN_VENDOR", "off")
    yield


def example_id(path):
    return f"{path.parent.name}/{path.stem}"
