"""Shared fixtures: the repository's example graphs, a private kernel cache,
the `kiln` tool installed with the package."""
import contextlib
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


def pytest_collection_modifyitems(config, items):
    """KILN_TEST_SHARD=i/n keeps every n-th test from the i-th (tools/dev.sh test runs
    the suite as two such processes at once, one per core of CI's machine; neighbouring
    tests, often cases of one parametrised test, land in different shards)."""
    shard = os.environ.get("KILN_TEST_SHARD")
    if not shard:
        return
    try:
        index, count = (int(x) for x in shard.split("/"))
    except ValueError:
        index, count = -1, 0
    if not 0 <= index < count:
        raise pytest.UsageError(f"KILN_TEST_SHARD={shard!r}: I/N with 0 <= I < N")
    keep, others = [], []
    for i, item in enumerate(items):
        (keep if i % count == index else others).append(item)
    config.hook.pytest_deselected(items=others)
    items[:] = keep


def example_id(path):
    return f"{path.parent.name}/{path.stem}"


@contextlib.contextmanager
def reporting():
    """Every kiln compile of the block through the PyTorch backend (the first call's and those of
    later sizes) in one kiln.torch.Report, dynamo's caches reset before and after."""
    import torch
    import kiln.torch
    torch._dynamo.reset()
    report = kiln.torch.Report()
    kiln.torch._REPORTS.report = report
    try:
        yield report
    finally:
        kiln.torch._REPORTS.report = None
        torch._dynamo.reset()


def subgraphs_compiled_under_meta_device(monkeypatch):
    """kiln's subgraphs compile (at their first call) under a default-device mode, as in PyTorch's
    CUDA-graph trees' warm-up (torch.device("cuda:0") entered as a context): a tensor the backend
    makes without naming a device lands on the meta device, where any use of its values fails.
    (Under reduce-overhead, BERT's and DistilBERT's subgraphs once ran in PyTorch so.)"""
    import torch
    import kiln.torch
    first_call = kiln.torch.KilnSubgraph._entry_for

    def under_meta(self, key, args):
        with torch.device("meta"):
            return first_call(self, key, args)
    monkeypatch.setattr(kiln.torch.KilnSubgraph, "_entry_for", under_meta)
