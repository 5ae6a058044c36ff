"""bench/zoo_convs.py without a GPU: the conv list traced from the zoo's
models (their tiny configurations, and the real ones where the count is the
point), the epilogues found after each conv, the families, the kiln graphs
(planned for sm_90 and run by the reference interpreter against PyTorch),
the binding the device run uses, and the table's figures from given times.
"""
import importlib.util
import json
import math
import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")
import kiln  # noqa: E402
from kiln._warm import binary  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _load():
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("zoo_convs", ROOT / "bench" / "zoo_convs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["zoo_convs"] = module
    spec.loader.exec_module(module)
    return module


zc = _load()


@pytest.fixture(scope="module")
def tiny_rows():
    return zc.collect(zc.MODELS, tiny=True)


def test_dry_run_plans_and_checks_every_tiny_conv(tmp_path, capsys):
    status = zc.main([binary(), "--dry-run", "--tiny", "--graphs", str(tmp_path), "--check", "6", "--jobs", "2"])
    out = capsys.readouterr().out
    assert status == 0, out
    graphs = sorted(tmp_path.glob("*.json"))
    assert f"planned {len(graphs)} of {len(graphs)} graphs for sm_90" in out
    assert out.count(" ok\n") == 6 and "FAILED" not in out
    for family in zc.FAMILIES:
        assert f"\n{family} (" in out


def test_resnet_residual_goes_to_the_conv_that_runs_second():
    """Bottleneck block 0: conv3 + bn3 meets the downsampling conv + bn in
    one add; the add (and the ReLU after it) is the downsampling conv's
    epilogue, conv3 keeps its batch norm alone; NCHW and channels-last
    ResNet-50 give the same rows."""
    rows = zc.collect(["resnet50", "resnet50_cl"], tiny=True)
    assert all(r.counts.get("resnet50") == r.counts.get("resnet50_cl") for r in rows)
    convs = zc.trace_convs(zc.zoo_models.BY_NAME["resnet50"], tiny=True)
    assert convs[0].family == "narrow" and convs[0].epilogue == ("bn", "relu") and (convs[0].r, convs[0].c) == (7, 3)
    block = convs[1:5]  # conv1, conv2, conv3, downsample
    assert [c.epilogue for c in block] == [("bn", "relu"), ("bn", "relu"), ("bn",), ("bn", "add", "relu")]
    assert block[3].r == 1 and block[3].k == block[2].k


def test_epilogues_and_families_of_the_mobile_models(tiny_rows):
    by_model = {m: [r.conv for r in tiny_rows if m in r.counts] for m in ("efficientnet_b0", "mobilenet_v3_s", "convnext_t")}
    eff = by_model["efficientnet_b0"]
    assert any(c.family == "depthwise" and c.epilogue == ("bn", "silu") for c in eff)
    assert any(c.h == 1 and c.bias and c.epilogue == ("silu",) for c in eff)  # squeeze-excitation
    assert any(c.h == 1 and c.bias and c.epilogue == ("sigmoid",) for c in eff)
    assert any(c.epilogue == ("bn", "add") for c in eff)
    mnv3 = by_model["mobilenet_v3_s"]
    assert any(c.epilogue == ("bn", "hardswish") for c in mnv3) and any(c.epilogue == ("hardsigmoid",) for c in mnv3)
    assert all(c.bn_eps == pytest.approx(1e-3) for c in mnv3 if "bn" in c.epilogue)
    cnxt = by_model["convnext_t"]  # the layer norm after ConvNeXt's depthwise conv is not pointwise: bias alone
    assert any(c.family == "depthwise" and c.r == 7 and c.bias and c.epilogue == () for c in cnxt)
    vit = [r.conv for r in tiny_rows if "vit_s16" in r.counts]
    assert len(vit) == 1 and vit[0].family == "narrow" and vit[0].stride == (8, 8)


def test_family_rule():
    base = dict(n=1, h=8, w=8, r=3, s=3, stride=(1, 1), padding=(1, 1), dilation=(1, 1), bias=False, epilogue=())
    assert zc.Conv(c=32, k=32, groups=32, **base).family == "depthwise"
    assert zc.Conv(c=32, k=64, groups=32, **base).family == "depthwise"  # a channel multiplier
    assert zc.Conv(c=128, k=128, groups=32, **base).family == "grouped"
    assert zc.Conv(c=3, k=64, groups=1, **base).family == "narrow"
    assert zc.Conv(c=128, k=32, groups=1, **base).family == "narrow"
    assert zc.Conv(c=64, k=64, groups=1, **base).family == "dense"


def test_the_check_fails_a_graph_that_computes_something_else(tmp_path):
    """The CPU check compares with the row's PyTorch function: the graph of
    another epilogue (SiLU for ReLU) fails it."""
    base = dict(n=2, c=16, h=6, w=5, k=24, r=3, s=3, stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1, bias=False)
    relu = zc.Conv(epilogue=("bn", "relu"), **base)
    silu = zc.Conv(epilogue=("bn", "silu"), **base)
    path = tmp_path / "g.json"
    path.write_text(json.dumps(zc.kiln_graph(silu)))
    assert zc.check_on_cpu(binary(), silu, str(path)) < 1e-2
    assert zc.check_on_cpu(binary(), relu, str(path)) > 1e-2


def test_binding_as_the_device_run_binds(tiny_rows):
    """What time_row hands kiln (make_inputs, the NHWC views of
    channels-last tensors) run through the Python package (the reference
    interpreter on CPU tensors) equals the row's PyTorch function."""
    picked = zc.check_rows(tiny_rows, 8)
    assert {r.conv.family for r in picked} == set(zc.FAMILIES)
    bf16 = lambda t: t.to(torch.bfloat16).float()  # noqa: E731
    for row in picked:
        conv = row.conv
        exe = kiln.compile(kiln.Graph.from_json(zc.kiln_graph(conv)))
        ins = zc.make_inputs(conv, "cpu", seed=3)
        got = exe(**{n: zc.nhwc(v) if v.dim() == 4 else v for n, v in ins.items()})["y"].float()
        want = zc.nhwc(zc.torch_function(conv, bf16)(*(ins[n].float() for n in zc.input_names(conv))))
        assert ((got - want).norm() / want.norm()).item() < 1e-2, conv


def test_table_from_given_times(tiny_rows):
    """The figures, the Inductor sample and the report from times given
    here (what the device run measures): ratios, bound shares, goals."""
    rows = tiny_rows
    results = [{"kiln_ms": 0.01 * (1 + i % 5), "cudnn_ms": 0.02, "kernels": ["conv"]} for i in range(len(rows))]
    chosen = zc.inductor_sample(rows, results, "sample")
    assert 0 < len(chosen) <= 6 * len(zc.FAMILIES) and zc.inductor_sample(rows, results, "off") == []
    for i in chosen:
        results[i]["inductor_ms"] = 0.04
    figs = zc.figures(rows, results, {"copy_gbps": 3000.0}, 60.0)
    lines, totals = zc.report(figs, zc.MODELS)
    text = "\n".join(lines)
    for family in zc.FAMILIES:
        assert f"### {family} (" in text
        assert totals["families"][family]["max_kiln_vs_cudnn"] == pytest.approx(2.5)
        assert totals["families"][family]["over_1_25x_cudnn"] == sum(
            f["kiln_vs_cudnn"] > 1.25 for f in figs if f["family"] == family)
    assert totals["goals"]["dense"]["none_above_1_25"] is False
    dw = [f for f in figs if f["family"] == "depthwise"]
    assert all(math.isclose(f["bound_share"], f["bound_ms"] / f["kiln_ms"]) for f in dw)
    assert "share |" in text and sum(1 for f in figs if f["inductor_ms"] == f["inductor_ms"]) == len(chosen)
