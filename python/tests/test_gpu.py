"""kiln from Python on a GPU: PyTorch, CuPy and JAX arrays in f32/f16/bf16,
strided inputs, the caller's stream, CUDA-graph capture, threads, and the
examples against the reference. Skips (and says why) without a GPU."""
import pathlib
import threading
import warnings

import numpy as np
import pytest

import kiln
from conftest import EXAMPLES, example_id, reporting

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("skipped: no CUDA GPU (PyTorch sees none)", allow_module_level=True)

TOLERANCE = {"f32": 1e-4, "f16": 2e-3, "bf16": 1e-2, "bool": 0}
TORCH = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "bool": torch.bool}


def relative_error(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)


def gelu_graph(dtype, strides=None):
    b = kiln.GraphBuilder(f"gelu_{dtype}")
    x = b.input("x", [256, 384], dtype, strides)
    s = b.input("s", [384], dtype)
    b.output(b.gelu(b.mul(x, s), dtype=dtype), name="y")
    return b.build()


def reference(graph, inputs):
    host = {k: (v.float().cpu().numpy() if v.dtype == torch.bfloat16 else v.cpu().numpy()) for k, v in inputs.items()}
    return kiln.compile(graph)(**host)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_torch_inputs(dtype):
    g = gelu_graph(dtype)
    exe = kiln.compile(g)
    ins = {"x": torch.randn(256, 384, device="cuda").to(TORCH[dtype]), "s": torch.randn(384, device="cuda").to(TORCH[dtype])}
    y = exe(**ins)["y"]
    assert y.device.type == "cuda" and y.dtype == TORCH[dtype]
    torch.cuda.synchronize()
    assert relative_error(y.float().cpu(), reference(g, ins)["y"]) < TOLERANCE[dtype]


@pytest.mark.parametrize("op", ["silu", "sigmoid"])
def test_silu_and_sigmoid_within_a_few_ulp_from_zero_to_the_overflow_of_their_exponential(op):
    """SiLU and sigmoid divide by 1 + e^-x with the reciprocal unit (common.cuh):
    within 8 ulp of float64 where the result is normal, NaN where the reference
    gives NaN, and where 1 + e^-x passes 2^126 (x below -87.34; the reciprocal
    gives 0 there) no further from zero than SiLU's largest value there, x / 2^126."""
    edges = [0.0, -0.0, 1e-30, -1e-30, 0.5, -0.5, 3.0, -3.0, 20.0, -20.0, 80.0, -80.0, 87.0, -87.0, -87.4, -87.5,
             -88.0, -88.7, -89.0, -100.0, 100.0, 1e30, -1e30, np.inf, -np.inf, np.nan]
    x = np.concatenate([np.array(edges, np.float32), np.linspace(-95, 95, 4096, dtype=np.float32)])
    b = kiln.GraphBuilder(f"{op}_edges")
    b.output(getattr(b, op)(b.input("x", [x.size], "f32")), name="y")
    g = b.build()
    got = kiln.compile(g)(x=torch.from_numpy(x).cuda())["y"].cpu().numpy()
    want_reference = kiln.compile(g)(x=x)["y"]
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        exact = (x64 if op == "silu" else 1.0) / (1.0 + np.exp(-x64))
    assert np.array_equal(np.isnan(got), np.isnan(want_reference)), x[np.isnan(got) != np.isnan(want_reference)]
    finite = ~np.isnan(got)
    assert np.array_equal(np.isinf(got[finite]), np.isinf(exact[finite]))
    with np.errstate(over="ignore"):
        huge_divisor = np.exp(-x64) > 2.0 ** 126
    normal = finite & np.isfinite(exact) & (np.abs(exact) >= np.finfo(np.float32).tiny) & ~huge_divisor
    ulps = np.abs(got[normal].astype(np.float64) - exact[normal]) / np.spacing(np.abs(exact[normal]).astype(np.float32))
    assert ulps.max() <= 8, (x[normal][ulps.argmax()], got[normal][ulps.argmax()], exact[normal][ulps.argmax()])
    rest = finite & np.isfinite(exact) & ~normal
    bound = 87.4 / 2.0 ** 126  # 1.03e-36
    assert np.all(np.abs(got[rest] - exact[rest]) <= bound), x[rest][np.abs(got[rest] - exact[rest]) > bound]


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_cupy_inputs(dtype):
    cupy = pytest.importorskip("cupy")
    g = gelu_graph(dtype)
    exe = kiln.compile(g)
    np_dtype = {"f32": np.float32, "f16": np.float16}[dtype]
    x = cupy.asarray(np.random.randn(256, 384).astype(np_dtype))
    s = cupy.asarray(np.random.randn(384).astype(np_dtype))
    y = exe(x=x, s=s)["y"]
    assert type(y).__module__.startswith("cupy") and y.dtype == np_dtype
    cupy.cuda.get_current_stream().synchronize()
    want = kiln.compile(g)(x=cupy.asnumpy(x), s=cupy.asnumpy(s))["y"]
    assert relative_error(cupy.asnumpy(y), want) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_jax_inputs(dtype):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("JAX sees no GPU")
    g = gelu_graph(dtype)
    exe = kiln.compile(g)
    jdt = {"f32": jnp.float32, "f16": jnp.float16, "bf16": jnp.bfloat16}[dtype]
    x = jnp.asarray(np.random.randn(256, 384), dtype=jdt)
    s = jnp.asarray(np.random.randn(384), dtype=jdt)
    y = exe(x=x, s=s)["y"]
    assert isinstance(y, jax.Array) and y.dtype == jdt
    host = (lambda a: np.asarray(a.astype(jnp.float32))) if dtype == "bf16" else np.asarray
    want = kiln.compile(g)(x=host(x), s=host(s))["y"]
    assert relative_error(np.asarray(y.astype(jnp.float32)), want) < TOLERANCE[dtype]


def test_strided_torch_inputs():
    base = torch.randn(256, 512, device="cuda")
    view = base[:, :384]  # strides (512, 1)
    s = torch.randn(384, device="cuda")
    declared = kiln.compile(gelu_graph("f32", strides=[512, 1]))
    y = declared(x=view, s=s)["y"]
    torch.cuda.synchronize()
    assert relative_error(y.cpu(), torch.nn.functional.gelu(view * s).cpu()) < 1e-5
    with pytest.raises(kiln.BindingError, match=r"strides \[512, 1\] given; the graph declares \[384, 1\]"):
        kiln.compile(gelu_graph("f32"))(x=view, s=s)
    t = torch.randn(384, 256, device="cuda").t()  # a transpose: strides (1, 256)
    with pytest.raises(kiln.BindingError, match="strides"):
        kiln.compile(gelu_graph("f32"))(x=t, s=s)


def test_the_fast_path_sees_every_change():
    exe = kiln.compile(gelu_graph("f32"))
    x, s = torch.randn(256, 384, device="cuda"), torch.randn(384, device="cuda")
    for _ in range(3):  # the first call is checked; later ones take the fast path
        y = exe(x=x, s=s)["y"]
    out = {"y": torch.empty_like(y)}
    exe.run({"x": x, "s": s}, out)
    exe.run({"x": x, "s": s}, out)
    torch.cuda.synchronize()
    assert torch.equal(out["y"], y)
    with pytest.raises(kiln.BindingError, match="dtype torch.float16 given"):
        exe(x=x.half(), s=s)
    with pytest.raises(kiln.BindingError, match="shape"):
        exe(x=x[:128], s=s)
    with pytest.raises(kiln.BindingError, match="not given"):
        exe(x=x)
    with pytest.raises(kiln.BindingError, match="output 'y': dtype"):
        exe.run({"x": x, "s": s}, {"y": out["y"].half()})
    with pytest.raises(kiln.BindingError, match="is on the CPU"):
        exe(x=x.cpu(), s=s)


def test_host_and_device_arrays_together_are_a_binding_error():
    exe = kiln.compile(gelu_graph("f32"))
    with pytest.raises(kiln.BindingError, match="is on the CPU while input 'x' is on cuda:0|is on cuda:0 while"):
        exe(x=torch.randn(256, 384, device="cuda"), s=torch.randn(384))
    with pytest.raises(kiln.BindingError, match="output 'y' is on the CPU"):
        exe.run({"x": torch.randn(256, 384, device="cuda"), "s": torch.randn(384, device="cuda")},
                {"y": torch.empty(256, 384)})


def test_a_side_stream_orders_after_its_producer():
    # The producer writes x on a side stream; kiln runs on that stream (current) and reads the new values.
    exe = kiln.compile(gelu_graph("f32"))
    side = torch.cuda.Stream()
    x = torch.zeros(256, 384, device="cuda")
    s = torch.ones(384, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # the producer is slow
        x.fill_(2.0)
        y = exe(x=x, s=s)["y"]
    side.synchronize()
    assert torch.allclose(y, torch.nn.functional.gelu(torch.full_like(x, 2.0)))


def test_cuda_graph_capture_replays_with_new_values():
    g = kiln.Graph.load(EXAMPLES[0].parents[1] / "norm" / "add_layer_norm.json")
    exe = kiln.compile(g)
    ins = {n: torch.randn(*spec.shape, device="cuda").to(TORCH[spec.dtype]) for n, spec in g.inputs.items()}
    outs = {n: torch.empty(*spec.shape, device="cuda", dtype=TORCH[spec.dtype]) for n, spec in g.outputs.items()}
    workspace = torch.empty(max(exe.workspace_bytes, 1), dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        exe.run(ins, outs, workspace=workspace)  # warm: modules loaded before capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        exe.run(ins, outs, workspace=workspace)
    for trial in range(3):
        for n, t in ins.items():
            t.copy_(torch.randn(*t.shape, device="cuda").to(t.dtype))
        graph.replay()
        torch.cuda.synchronize()
        want = reference(g, ins)
        for n in outs:
            assert relative_error(outs[n].float().cpu(), want[n]) < TOLERANCE[g.outputs[n].dtype], (trial, n)


def test_eight_threads_compile_and_run_at_once():
    errors = []

    def work(i):
        try:
            g = gelu_graph("bf16" if i % 2 else "f16")
            exe = kiln.compile(g)
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                for _ in range(20):
                    ins = {"x": torch.randn(256, 384, device="cuda").to(TORCH[g.inputs["x"].dtype]),
                           "s": torch.randn(384, device="cuda").to(TORCH[g.inputs["s"].dtype])}
                    y = exe(**ins)["y"]
            stream.synchronize()
            err = relative_error(y.float().cpu(), reference(g, ins)["y"])
            if err > TOLERANCE[g.inputs["x"].dtype]:
                errors.append(f"thread {i}: relative error {err}")
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(f"thread {i}: {e!r}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@pytest.mark.parametrize("path", EXAMPLES, ids=example_id)
def test_examples_through_python_against_the_reference(path):
    g = kiln.Graph.load(path)
    exe = kiln.compile(g)
    gen = torch.Generator().manual_seed(5)
    ins = {}
    for name, spec in g.inputs.items():
        if spec.dtype == "bool":  # (a list: a rank-0 input's shape is empty)
            value = torch.rand(list(spec.shape), generator=gen) > 0.5
        else:
            value = torch.randn(list(spec.shape), generator=gen)
            if "var" in name:
                value = value.abs() + 0.5
        # laid out as declared
        span = 1 + sum((n - 1) * s for n, s in zip(spec.shape, spec.strides))
        backing = torch.zeros(span, dtype=TORCH[spec.dtype], device="cuda")
        view = backing.as_strided(spec.shape, spec.strides)
        view.copy_(value.to(TORCH[spec.dtype]))
        ins[name] = view
    got = exe(**ins)
    torch.cuda.synchronize()
    from test_run import laid_out  # host arrays laid out as the graph declares them
    want = kiln.compile(g)(**{k: laid_out((v.float() if v.dtype == torch.bfloat16 else v).cpu().numpy(), g.inputs[k].strides)
                              for k, v in ins.items()})
    narrow = any(spec.dtype in ("f16", "bf16") for spec in list(g.inputs.values()) + list(g.outputs.values()))
    tolerance = 1e-2 if narrow else 1e-3
    for name, spec in g.outputs.items():
        have = got[name].float().cpu().numpy() if spec.dtype != "bool" else got[name].cpu().numpy()
        if spec.dtype == "bool":
            assert np.mean(have != want[name]) < 1e-3, name
            continue
        finite = np.isfinite(want[name])
        assert np.array_equal(np.isfinite(have), finite), name
        assert relative_error(np.where(finite, have, 0), np.where(finite, want[name], 0)) <= tolerance, name


def test_backend_a_cpu_constant_in_a_cuda_forward_is_a_constant_of_the_kiln_graph():
    """A model that makes a CPU scalar tensor in its forward (PyTorch lets it meet CUDA tensors):
    kiln takes its value as a constant, and the forward never raises."""
    import kiln.torch  # noqa: F401  (registers the backend)

    def fn(x):
        return torch.relu(x * torch.tensor(2.0)) + x.exp()
    x = torch.randn(64, 128, device="cuda")
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(fn, backend="kiln", dynamic=False)(x)
        report = kiln.torch.explain(fn, x)
    assert torch.allclose(got, fn(x), atol=1e-5)
    assert report.subgraphs and not report.left_to_pytorch, str(report)


def test_backend_adaptive_pooling_to_sizes_that_do_not_divide_the_input_on_cuda():
    """VGG's head (13x13 -> 7x7 at 512 channels, windows of two sizes that overlap) and 8 -> 3,
    on CUDA tensors in bf16, channels-last as well: kiln's kernels, against eager."""
    import kiln.torch  # noqa: F401  (registers the backend)

    def fn(x, y):
        F = torch.nn.functional
        return F.adaptive_avg_pool2d(torch.relu(x), 7), F.adaptive_avg_pool2d(y.exp(), 3) * 2
    x = torch.randn(4, 512, 13, 13, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(2, 64, 8, 8, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(fn, backend="kiln", dynamic=False)(x, y)
        report = kiln.torch.explain(fn, x, y)
    for have, want in zip(got, fn(x, y)):
        torch.testing.assert_close(have, want, rtol=2e-2, atol=2e-2)
    assert report.subgraphs and not report.left_to_pytorch, str(report)


def test_backend_python_floats_of_a_dynamic_cuda_forward_are_constants():
    """Under dynamic shapes dynamo passes a model's Python floats (an RMS norm's eps) as f64 CPU
    tensors: they meet CUDA tensors as constants of one kiln graph compiled once, keyed by value."""
    import kiln.torch  # noqa: F401  (registers the backend)

    class RMSNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(256))
            self.eps = 1e-6

        def forward(self, x):
            h = x.float()
            return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
    m = RMSNorm().cuda().bfloat16()
    with reporting() as report:
        c = torch.compile(m, backend="kiln", dynamic=True)
        with torch.no_grad():
            for eps in (1e-6, 0.25):
                m.eps = eps
                for b, s in ((2, 17), (3, 64), (4, 5)):  # (not 1: dynamo specialises a size of 1)
                    x = torch.randn(b, s, 256, device="cuda", dtype=torch.bfloat16)
                    torch.testing.assert_close(c(x), m(x), rtol=2e-2, atol=2e-2)
    assert [e["sizes"] for e in report.subgraphs] == ["every size: one compile"] * 2, str(report)
    assert not report.left_to_pytorch, str(report)


def test_backend_f32_anchors_follow_pytorchs_tf32_flags():
    """f32 matmuls and convs run as PyTorch's flags say it runs them: full f32 where
    allow_tf32 is off (matmuls by default), TF32 tensor cores where it is on (convs by default)."""
    import kiln.torch  # noqa: F401
    torch.manual_seed(5)
    lin = torch.nn.Linear(1024, 512).cuda()
    conv = torch.nn.Conv2d(64, 64, 3, padding=1).cuda()
    x, img = torch.randn(256, 1024, device="cuda"), torch.randn(4, 64, 16, 16, device="cuda")
    flags = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32

    def error(module, inp):  # kiln's relative error against f64
        torch._dynamo.reset()
        with torch.no_grad():
            got = torch.compile(module, backend="kiln")(inp).double()
            want = module.double()(inp.double())
            module.float()
        return ((got - want).abs().max() / want.abs().max()).item()
    try:
        for allowed in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = allowed
            for module, inp in ((lin, x), (conv, img)):
                e = error(module, inp)
                if allowed:
                    assert 1e-5 < e < 5e-3, (type(module).__name__, e)  # TF32's 10-bit mantissas
                else:
                    assert e < 1e-5, (type(module).__name__, e)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags
        torch._dynamo.reset()


def test_backend_with_gradients_on_the_gpu():
    import kiln.torch  # noqa: F401
    torch.manual_seed(3)
    make = lambda: torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.LayerNorm(128),  # noqa: E731
                                       torch.nn.Linear(128, 32)).cuda()
    eager, ours = make(), make()
    ours.load_state_dict(eager.state_dict())
    x = torch.randn(16, 64, device="cuda")
    xe, xk = x.clone().requires_grad_(), x.clone().requires_grad_()
    torch._dynamo.reset()
    ye, yk = eager(xe), torch.compile(ours, backend="kiln")(xk)
    assert torch.allclose(yk, ye, atol=1e-4)
    ye.square().sum().backward()
    yk.square().sum().backward()
    assert torch.allclose(xk.grad, xe.grad, atol=1e-3)
    for (name, pe), pk in zip(eager.named_parameters(), ours.parameters()):
        assert torch.allclose(pk.grad, pe.grad, atol=1e-3, rtol=1e-3), name


def test_backend_eval_batch_norm_with_gradients_on_is_kilns():
    """A conv net in eval() with gradients on: on CUDA the eval batch norm's saved statistics are
    non-empty (the running mean, 1/sqrt(running var + eps)); kiln computes them, so no batch norm
    stays in PyTorch, and the gradients match eager's. (SiLU, not ReLU: the convs' TF32 rounding
    differs between kiln and cuDNN, and a ReLU whose input rounds across zero moves a gradient by a
    whole term; the errors are norm-wise for the same reason.)"""
    import kiln.torch  # noqa: F401
    torch.manual_seed(4)
    make = lambda: torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.BatchNorm2d(32),  # noqa: E731
                                       torch.nn.SiLU(), torch.nn.Conv2d(32, 16, 1), torch.nn.BatchNorm2d(16)).cuda()
    eager, ours = make(), make()
    for bn in (eager[1], eager[4]):
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    ours.load_state_dict(eager.state_dict())
    eager.eval(), ours.eval()
    x = torch.randn(4, 16, 12, 12, device="cuda")
    xe, xk = x.clone().requires_grad_(), x.clone().requires_grad_()
    torch._dynamo.reset()
    ye, yk = eager(xe), torch.compile(ours, backend="kiln")(xk)
    relative = lambda got, want: ((got - want).norm() / want.norm()).item()  # noqa: E731
    assert relative(yk, ye) < 2e-3
    ye.square().sum().backward()
    yk.square().sum().backward()
    assert relative(xk.grad, xe.grad) < 1e-2
    for (name, pe), pk in zip(eager.named_parameters(), ours.parameters()):
        assert relative(pk.grad, pe.grad) < 1e-2, name
    torch._dynamo.reset()
    report = kiln.torch.explain(ours, x.clone().requires_grad_())
    assert report.backward_in_pytorch and report.subgraphs, str(report)
    assert not any("batch_norm" in str(why) for why in report.left_to_pytorch), str(report)


def test_backend_reduce_overhead_replays_cuda_graphs():
    """mode="reduce-overhead": kiln's launches and the PyTorch ops between them replayed from CUDA
    graphs; equal to eager over several calls, a new input address and a new size. The parameters
    are static inputs: a replay copies x alone into the graph's buffers, not the weights."""
    import kiln.torch  # noqa: F401  (registers the backend)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)
            self.norm = torch.nn.LayerNorm(64)

        def forward(self, x):
            h = self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))
            return x + torch.cumsum(h, -1) * 0.01  # (cumsum stays in PyTorch: both sides in one graph)

    m = Block().cuda().eval()
    with reporting() as report:
        c = torch.compile(m, backend="kiln", mode="reduce-overhead", dynamic=False)
        with torch.no_grad():
            for rows in (32, 32, 32, 48, 32):
                x = torch.randn(rows, 64, device="cuda")  # a new address every call
                got = c(x).clone()
                assert torch.allclose(got, m(x), atol=1e-4), rows
        with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            c(x)
            torch.cuda.synchronize()
    assert report.subgraphs and any("replayed from CUDA graphs" in w for w in report.cuda_graphs), str(report)
    assert any("6 of 7 inputs static" in w for w in report.cuda_graphs), str(report)  # the 6 parameters; x copied
    copies = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and "Memcpy" in e.name]
    assert len(copies) <= 1, copies


def test_backend_reduce_overhead_replays_a_forward_with_cpu_constants():
    """Swin's shifted-window mask is built in the forward from numbers (`mask[a:b] = count`): CPU
    tensors in the traced graph, which PyTorch's CUDA-graph check refuses. kiln compiles them into
    its graph, so the forward is still replayed, and equals eager's at every call."""
    import kiln.torch  # noqa: F401  (registers the backend)
    from test_torch_slices_and_constants import swin_mask

    def fn(attn, x):
        return torch.softmax(torch.roll(attn, (2, -2), (2, 3)) + swin_mask(x).unsqueeze(1), -1)

    with reporting() as report:
        c = torch.compile(fn, backend="kiln", mode="reduce-overhead", dynamic=False)
        with torch.no_grad():
            for _ in range(4):
                attn, x = torch.randn(4, 2, 16, 16, device="cuda"), torch.randn(1, 8, 8, 3, device="cuda")
                torch.compiler.cudagraph_mark_step_begin()
                got = c(attn, x).clone()
                assert torch.allclose(got, fn(attn, x), atol=1e-5)
    assert report.subgraphs and any(w.startswith("replayed from CUDA graphs") for w in report.cuda_graphs), str(report)


def test_backend_reduce_overhead_replays_kilns_kernels_for_a_padding_mask():
    """transformers' padding mask (a [B, S] mask indexed by aranges) under reduce-overhead: the
    subgraph compiles during the CUDA-graph trees' warm-up, under their default-device mode, and the
    replay runs kiln's kernels, not PyTorch's (BERT and DistilBERT once ran in PyTorch there after an
    internal error, equal to eager, a warning the only sign)."""
    import kiln.torch  # noqa: F401  (registers the backend)

    def fn(q, k, v, keep):
        b, s = keep.shape
        rows, columns = torch.arange(b, device=keep.device), torch.arange(s, device=keep.device)
        mask = keep[rows[:, None, None, None], columns[None, None, None, :]].expand(b, 1, s, s)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask) * 0.5

    keep = torch.ones(3, 40, dtype=torch.bool, device="cuda")
    keep[1, -9:] = False
    q, k, v = (torch.randn(3, 4, 40, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with reporting() as report, warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # (kiln's "runs in PyTorch after an internal error")
        c = torch.compile(fn, backend="kiln", mode="reduce-overhead", dynamic=False)
        with torch.no_grad():
            for _ in range(4):
                torch.compiler.cudagraph_mark_step_begin()
                got = c(q, k, v, keep).clone()
                assert relative_error(got.float().cpu(), fn(q, k, v, keep).float().cpu()) < 1e-2
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                torch.compiler.cudagraph_mark_step_begin()
                c(q, k, v, keep)
                torch.cuda.synchronize()
    assert report.subgraphs and any(w.startswith("replayed from CUDA graphs") for w in report.cuda_graphs), str(report)
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert any(name == "kiln_kernel" for name in kernels), kernels


def test_a_symbolic_graph_runs_every_size_from_one_compile():
    # One compile for every size (python.md, b.dim): PyTorch CUDA tensors of four sizes, outputs sized by
    # them, against the reference at each size; the fast path (same layout as last call) and a new size.
    b = kiln.GraphBuilder("symbolic_rms_gelu")
    B = b.dim("B", min=1, max=32)
    S = b.dim("S", min=1, max=256)
    x = b.input("x", [B, S, 256], "bf16")
    w = b.input("w", [256], "bf16")
    b.output(b.gelu(b.rms_norm(x, w), dtype="bf16"), name="y")
    g = b.build()
    exe = kiln.compile(g)
    for batch, seq in [(1, 1), (32, 256), (3, 45), (13, 127), (13, 127), (2, 8)]:
        inputs = {"x": torch.randn(batch, seq, 256, device="cuda").to(torch.bfloat16),
                  "w": torch.randn(256, device="cuda").to(torch.bfloat16)}
        got = exe(**inputs)["y"]
        assert tuple(got.shape) == (batch, seq, 256)
        want = reference(g, inputs)["y"]
        assert relative_error(got.float().cpu().numpy(), want) < TOLERANCE["bf16"], (batch, seq)
    with pytest.raises(kiln.BindingError, match=r"B = 33 is outside its range \(B in \[1, 32\]\)"):
        exe(x=torch.zeros(33, 8, 256, device="cuda", dtype=torch.bfloat16),
            w=torch.zeros(256, device="cuda", dtype=torch.bfloat16))
    # The kernels are keyed by their symbolic source: compiling again finds every one in the cache.
    assert all(k["cache_hit"] for k in kiln.compile(g).kernels)


def test_run_with_a_workspace_takes_the_fast_path_and_still_checks_the_workspace():
    # A symbolic decode step (flash decoding's partials: a workspace) run into given outputs with a given
    # workspace, as a CUDA graph capture would: the repeated call (same layout) launches without binding
    # again and gives the reference's values; a workspace too small for the sizes is refused on either path.
    g = kiln.Graph.load(pathlib.Path(__file__).resolve().parents[2] / "tests" / "cli" / "symbolic_decode_step.json")
    exe = kiln.compile(g)
    workspace = torch.empty(exe.workspace_bytes, dtype=torch.uint8, device="cuda")
    for batch, keys in [(1, 700), (2, 3000)]:
        shapes = {"q": (batch, 32, 1, 128), "k": (batch, 8, keys, 128), "v": (batch, 8, keys, 128), "mask": (batch, 1, 1, keys)}
        ins = {n: torch.randn(*s, device="cuda").to(torch.bfloat16) for n, s in shapes.items()}
        outs = {"a": torch.full((batch, 32, 1, 128), float("nan"), device="cuda", dtype=torch.bfloat16)}
        exe.run(ins, outs, workspace=workspace)
        exe.run(ins, outs, workspace=workspace)  # (the fast path: the layout of the call before)
        want = reference(g, ins)["a"]
        assert relative_error(outs["a"].float().cpu().numpy(), want) < TOLERANCE["bf16"], (batch, keys)
    assert exe._native.workspace_bytes_at([list(t.shape) for t in ins.values()]) > 16
    with pytest.raises(kiln.BindingError, match="workspace: 16 bytes given"):
        exe.run(ins, outs, workspace=workspace[:16])


def _zoo_models():
    import importlib.util
    import pathlib
    import sys
    if "zoo_models" not in sys.modules:
        path = pathlib.Path(__file__).resolve().parents[2] / "bench" / "zoo_models.py"
        spec = importlib.util.spec_from_file_location("zoo_models", path)
        sys.modules["zoo_models"] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules["zoo_models"]


@pytest.mark.parametrize("name,batch,seq", [("resnet50_cl", 8, 224), ("efficientnet_b0", 8, 224), ("bert", 4, 128)])
def test_zoo_models_with_gradients_on_match_eager(name, batch, seq):
    """Three zoo models at their real widths (two CNNs, one transformer), f32, model.eval() with
    gradients on, over three SGD steps (each from eager's parameters, so that the compiled model
    reads updated weights): the kiln forward's output, and the gradients of the float inputs and of
    every parameter, against eager. kiln's f32 anchors run on TF32 tensor cores, so the reference is
    eager in full f32 and kiln may be as far from it as a few times eager's own TF32 run is (or
    0.5%). A gradient's error is taken against its size or 1% of the gradients' RMS size, whichever
    is larger (BERT's key bias has a gradient that is zero in exact arithmetic)."""
    import kiln.torch  # noqa: F401
    zoo = _zoo_models()
    spec = next(s for s in zoo.SPECS if s.name == name)
    pytest.importorskip(spec.package)
    models = []
    for _ in range(3):  # eager f32, eager TF32, kiln
        m, inputs = zoo.instantiate(spec, tiny=False, device="cuda", dtype=torch.float32, batch=batch, seq=seq)
        models.append(m)
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    float_inputs = [k for k, v in inputs.items() if v.is_floating_point()]
    torch._dynamo.reset()
    compiled = torch.compile(models[2], backend="kiln")
    optimizers = [torch.optim.SGD(m.parameters(), lr=1e-2) for m in models]
    weights = None
    tf32 = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)

    def step(i):
        model, optimizer = models[i], optimizers[i]
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = i > 0
        optimizer.zero_grad(set_to_none=True)
        args = {k: v.clone().requires_grad_(k in float_inputs) for k, v in inputs.items()}
        out = spec.output((compiled if i == 2 else model)(**args)).float()
        (out * weights).mean().backward()  # every element counts, with its own weight
        grads = {**{f"input {k}": args[k].grad for k in float_inputs},
                 **{f"parameter {k}": p.grad for k, p in model.named_parameters()}}
        optimizer.step()
        return out.detach(), grads

    try:
        for n in range(3):
            for m in models[1:]:  # each step from eager's parameters: TF32 noise is not compounded over steps
                m.load_state_dict(models[0].state_dict())
            if weights is None:
                with torch.no_grad():
                    shape = spec.output(models[0](**inputs)).shape
                weights = torch.randn(shape, device="cuda", generator=torch.Generator("cuda").manual_seed(5))
            (want, want_grads), (tf32_out, tf32_grads), (got, got_grads) = step(0), step(1), step(2)
            size = lambda t: t.double().norm().item()  # noqa: E731
            err, tf32_err = size(got - want) / size(want), size(tf32_out - want) / size(want)
            assert err <= max(4 * tf32_err, 1e-3), f"{name} step {n}: output: {err:.2e} (eager's TF32 {tf32_err:.2e})"
            assert want_grads.keys() == got_grads.keys()
            rms = (sum(size(g) ** 2 for g in want_grads.values() if g is not None) / len(want_grads)) ** 0.5
            for key, w in want_grads.items():
                g, t = got_grads[key], tf32_grads[key]
                if w is None:  # (a parameter the output does not depend on: compiled, its gradient may be zeros)
                    assert g is None or not g.any(), f"{name} step {n}: {key}: a gradient where eager has none"
                    continue
                assert g is not None, f"{name} step {n}: {key}: no gradient"
                scale = max(size(w), 1e-2 * rms)
                err, tf32_err = size(g - w) / scale, size(t - w) / scale
                assert err <= max(4 * tf32_err, 5e-3), f"{name} step {n}: {key}: {err:.2e} (eager's TF32 {tf32_err:.2e})"
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32
    torch._dynamo.reset()
    report = kiln.torch.explain(models[2], **{k: v.clone().requires_grad_(k in float_inputs) for k, v in inputs.items()})
    assert report.backward_in_pytorch and report.subgraphs, str(report)
