"""Bad input gives a clear error naming the argument."""

import pytest
import torch

import tsct
from tsct.ops import grouped_glu
from _glu_oracle import make_problem


@pytest.fixture
def p():
    return make_problem(tokens=8, topk=2, experts=4, d=16, r=8, f=9)


def call(p, **over):
    a = {k: p[k] for k in ("x", "offs", "w_gate", "w_up", "w_down", "s_gate", "s_up", "row_weight", "gather_idx",
                           "scatter_idx", "num_out_rows")}
    a.update(over)
    return grouped_glu(a.pop("x"), a.pop("offs"), a.pop("w_gate"), a.pop("w_up"), a.pop("w_down"), a.pop("s_gate"),
                       a.pop("s_up"), **a)


@pytest.mark.parametrize("over,exc,match", [
    (lambda p: dict(x=p["x"].double()), TypeError, r"x must have dtype"),
    (lambda p: dict(x=p["x"][None]), ValueError, r"x must be 2-D"),
    (lambda p: dict(x=p["x"].to_sparse()), TypeError, r"grouped_glu: x must be a dense \(strided\) tensor, got layout "
                                                      r"torch.sparse_coo"),
    (lambda p: dict(w_up=p["w_up"].to_sparse()), TypeError, r"grouped_glu: w_up must be a dense \(strided\) tensor"),
    (lambda p: dict(offs=p["offs"].long()), TypeError, r"offs must have dtype"),
    (lambda p: dict(offs=p["offs"][:-1]), ValueError, r"offs must have length E = 4"),
    (lambda p: dict(w_gate=p["w_gate"].transpose(1, 2)), ValueError, r"w_gate must be \[E, d, r\]"),
    (lambda p: dict(x=p["x"][:, :-1]), ValueError, r"with d = x.shape\[1\] = 15, got \[4, 16, 8\] \(x \[T, d\] and "
                                                   r"w_gate disagree on d"),
    (lambda p: dict(gather_idx=p["gather_idx"][:-1], row_weight=None, scatter_idx=None, num_out_rows=None), ValueError,
     r"offs\[-1\] = 16 exceeds M = 15 routed rows \(len\(gather_idx\) when it is given"),
    (lambda p: dict(w_up=p["w_up"][:, :, :4]), ValueError, r"w_up must be \[E, d, r\]"),
    (lambda p: dict(w_down=p["w_down"].transpose(1, 2)), ValueError, r"w_down must be \[E, r, f\]"),
    (lambda p: dict(w_down=p["w_down"].bfloat16()), TypeError, r"w_down must have dtype"),
    (lambda p: dict(w_gate=p["w_gate"].numpy()), TypeError, r"w_gate must be a torch.Tensor or a tsct.quant"),
    # an object that only looks like a container (dequantize + shape) is named as the argument, not as "obj"
    (lambda p: dict(w_up=type("Duck", (), {"shape": p["w_up"].shape, "device": p["w_up"].device,
                                           "dequantize": lambda self, *a, **k: p["w_up"]})()),
     TypeError, r"w_up must be a torch.Tensor or a tsct.quant container "
                r"\(NVFP4Tensor, SignTensor, FP8Tensor, TernaryTensor\), got Duck"),
    (lambda p: dict(s_gate=p["s_gate"][:, :3]), ValueError, r"s_gate must be \[E, r\]"),
    (lambda p: dict(row_weight=p["row_weight"][:-1]), ValueError, r"row_weight must be \[M\]"),
    (lambda p: dict(gather_idx=p["gather_idx"].float()), TypeError, r"gather_idx must have dtype"),
    (lambda p: dict(num_out_rows=None), ValueError, r"scatter_idx and num_out_rows must be given together"),
    (lambda p: dict(num_out_rows=-1), ValueError, r"num_out_rows must be a non-negative int"),
    (lambda p: dict(num_out_rows=16.0), TypeError, r"grouped_glu: num_out_rows must be an int, got float"),
    (lambda p: dict(num_out_rows=True), TypeError, r"grouped_glu: num_out_rows must be an int, got bool"),
    # tensors of one element have __index__: only a 0-dim integer tensor stands for an int
    (lambda p: dict(num_out_rows=torch.tensor(True)), TypeError, r"grouped_glu: num_out_rows must be an int, got Tensor"),
    (lambda p: dict(num_out_rows=torch.tensor([[16]])), TypeError,
     r"grouped_glu: num_out_rows must be an int, got Tensor"),
    (lambda p: dict(impl="nope"), ValueError, r"grouped_glu: impl=.nope. is not a path"),
    (lambda p: dict(impl="triton-bf16"), RuntimeError, r"impl='triton-bf16' cannot run on CPU"),
])
def test_bad_argument_named(p, over, exc, match):
    with pytest.raises(exc, match=match):
        call(p, **over(p))


def test_factor_with_the_odd_expert_count_is_named(p):
    """E comes from offs: a factor whose dim 0 differs is the one named, not its neighbour."""
    bad = torch.cat([p["w_gate"], p["w_gate"][:1]])
    with pytest.raises(ValueError, match=r"grouped_glu: w_gate must be \[E, d, r\] with E = len\(offs\) = 4, got \[5,"):
        call(p, w_gate=bad)
    with pytest.raises(ValueError, match=r"grouped_glu: w_down must be \[E, r, f\] with E = len\(offs\) = 4"):
        call(p, w_down=p["w_down"][:3])


@pytest.mark.parametrize("mode", ["meta", "fake"])
def test_shape_only_tensors_pass_the_checks(p, mode):
    """Meta-device and fake tensors carry no values: meta skips the value checks (meta init), fake tensors get
    them as graph asserts (shape inference under FakeTensorMode); the shape checks still run, and the output has
    the op's shape."""
    args = {k: p[k] for k in ("x", "offs", "w_gate", "w_up", "w_down", "s_gate", "s_up", "row_weight", "gather_idx",
                              "scatter_idx")}
    if mode == "meta":
        args = {k: v.to("meta") for k, v in args.items()}
        out = grouped_glu(**args, num_out_rows=p["num_out_rows"])
    else:
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode() as fm:
            args = {k: fm.from_tensor(v) for k, v in args.items()}
            out = grouped_glu(**args, num_out_rows=p["num_out_rows"])
    assert tuple(out.shape) == (p["num_out_rows"], p["w_down"].shape[2]) and out.dtype == p["x"].dtype
    assert (out.device.type == "meta") == (mode == "meta")
    args["w_up"] = args["w_up"][:, :, :4]
    with pytest.raises(ValueError, match=r"w_up must be \[E, d, r\]"):
        grouped_glu(**args, num_out_rows=p["num_out_rows"])


def _traced(mode, p, check_values, monkeypatch):
    from torch.fx.experimental.proxy_tensor import make_fx

    monkeypatch.setattr(tsct.config, "check_values", check_values)
    args = (p["x"], p["offs"], p["w_gate"], p["w_up"], p["w_down"])
    return make_fx(lambda *a: grouped_glu(*a), tracing_mode=mode)(*args)


def test_symbolic_trace_passes_the_shape_checks(p, monkeypatch):
    """make_fx with symbolic sizes: the factor checks compare sizes without hashing them (a SymInt does not hash)."""
    gm = _traced("symbolic", p, False, monkeypatch)
    assert "grouped_glu" in gm.code


def test_fake_trace_asserts_the_values_in_the_graph(p, monkeypatch):
    """Traced with fake tensors (no data), offs and the indices are asserted in the graph, not skipped."""
    gm = _traced("fake", p, True, monkeypatch)
    assert "_assert_async" in gm.code


def test_num_out_rows_accepts_int_likes(p):
    import numpy as np

    n = p["num_out_rows"]
    want = call(p)
    for v in (np.int64(n), torch.tensor(n)):
        assert torch.equal(call(p, num_out_rows=v), want)


@pytest.mark.parametrize("mutate,match", [
    (lambda o: o.__setitem__(1, o[2] + 1), r"offs must be non-decreasing, offs\[2\]"),
    (lambda o: o.__setitem__(-1, 10 ** 6), r"offs\[-1\] = 1000000 exceeds M = 16"),
    (lambda o: o.__setitem__(0, -1), r"offs must be non-negative"),
])
def test_bad_offs_values(p, mutate, match):
    offs = p["offs"].clone()
    mutate(offs)
    with pytest.raises(ValueError, match=match):
        call(p, offs=offs)


def test_bad_index_values(p):
    g = p["gather_idx"].clone()
    g[0] = 8
    with pytest.raises(ValueError, match=r"gather_idx\[:offs\[-1\]\] must lie in \[0, 8\)"):
        call(p, gather_idx=g)
    s = p["scatter_idx"].clone()
    s[3] = -1
    with pytest.raises(ValueError, match=r"scatter_idx\[:offs\[-1\]\] must lie in \[0, 8\)"):
        call(p, scatter_idx=s)


def test_value_checks_can_be_turned_off_for_gpu_tensors_only(p, monkeypatch):
    """With check_values off no value of a GPU tensor is read for validation (the sync-free setting); a CPU tensor's
    values are checked still (no sync to save), and an out-of-range index names num_out_rows."""
    import types

    from tsct.ops import _validate

    monkeypatch.setattr(tsct.config, "check_values", False)
    cuda = types.SimpleNamespace(device=torch.device("cuda", 0))
    assert not tsct.config.values_checked(cuda) and tsct.config.values_checked(p["offs"])
    bad = p["scatter_idx"].clone()
    bad[0] = -2
    with pytest.raises(ValueError, match=r"scatter_idx\[:offs\[-1\]\] must lie in \[0, 8\) \(num_out_rows = 8\)"):
        call(p, scatter_idx=bad)
    monkeypatch.setattr(tsct.config, "check_values", True)
    assert tsct.config.values_checked(cuda)

    def boom(*a, **k):
        raise AssertionError("value check ran")

    monkeypatch.setattr(_validate, "check_routing_facts", boom)
    with pytest.raises(AssertionError, match="value check ran"):
        call(p)


def test_factor_dtype_error_says_it_must_match_x():
    x = torch.randn(6, 32)  # float32
    offs = torch.tensor([2, 6], dtype=torch.int32)
    w = torch.randn(2, 32, 16, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"w_gate must have dtype in \['torch.float32'\] \(dense factors must match x.dtype"):
        grouped_glu(x, offs, w, w.float(), torch.randn(2, 16, 8))


def test_quantize_master_refuses_a_layout_for_sign():
    from tsct.ops import quantize_master
    with pytest.raises(ValueError, match="layout='swizzled_128x4' applies to NVFP4 block scales only"):
        quantize_master(torch.randn(2, 32, 16), "sign", layout="swizzled_128x4")


def _sorted_problem(seed=0):
    g = torch.Generator().manual_seed(seed)
    t, k, e, d, r, f = 32, 2, 4, 16, 8, 9
    ids = torch.randint(0, e, (t, k), generator=g)
    ids[0, 1] = -1  # a dropped choice: a padding row
    fac = [torch.randn(e, d, r, generator=g), torch.randn(e, d, r, generator=g), torch.randn(e, r, f, generator=g)]
    return torch.randn(t, d, generator=g), ids, torch.rand(t, k, generator=g), fac, e


def test_sorted_routing_skips_the_host_read_until_its_tensors_change(monkeypatch):
    """sort_by_expert's outputs are valid by construction: grouped_glu does not read their values back while they are
    unchanged (a sync per eager forward with the default checks), and does again once either changed or the call's
    bounds are not the sort's; bad values written into them are then caught, naming the argument."""
    from tsct.ops import _validate, sort_by_expert

    reads = []
    real = _validate._check_values
    monkeypatch.setattr(_validate, "_check_values", lambda *a: reads.append(a) or real(*a))
    x, ids, w, fac, e = _sorted_problem()
    t = x.shape[0]
    s = sort_by_expert(ids, e, w)

    def run(xx=x, offs=None, token=None, n_out=t):
        tok = s.token if token is None else token
        return grouped_glu(xx, s.offs if offs is None else offs, *fac, row_weight=s.row_weight, gather_idx=tok,
                           scatter_idx=tok, num_out_rows=n_out, impl="reference")

    y = run()
    assert reads == []
    ref = grouped_glu(x, s.offs.clone(), *fac, row_weight=s.row_weight, gather_idx=s.token.clone(),
                      scatter_idx=s.token.clone(), num_out_rows=t, impl="reference")
    assert len(reads) == 1 and torch.equal(y, ref)  # copies are checked, and the result is the same
    with pytest.raises(ValueError, match=r"gather_idx\[:offs\[-1\]\] must lie in \[0, 31\)"):
        run(xx=x[:t - 1])  # fewer rows of x than the sort's tokens: checked, and the last token is out of range
    with pytest.raises(ValueError, match=r"scatter_idx\[:offs\[-1\]\] must lie in \[0, 31\)"):
        run(n_out=t - 1)
    s.token[0] = t  # written in place: the version counter moved, so the values are read and the bad one named
    with pytest.raises(ValueError, match=r"gather_idx\[:offs\[-1\]\] must lie in \[0, 32\)"):
        run()
    s = sort_by_expert(ids, e, w)
    s.offs[1] = s.offs[2] + 1
    with pytest.raises(ValueError, match=r"offs must be non-decreasing"):
        run()


def test_sorted_routing_is_not_recorded_for_inference_tensors(monkeypatch):
    from tsct.ops import _validate, sort_by_expert

    reads = []
    real = _validate._check_values
    monkeypatch.setattr(_validate, "_check_values", lambda *a: reads.append(a) or real(*a))
    x, ids, w, fac, e = _sorted_problem(1)
    with torch.inference_mode():
        s = sort_by_expert(ids, e, w)
        grouped_glu(x, s.offs, *fac, row_weight=s.row_weight, gather_idx=s.token, scatter_idx=s.token,
                    num_out_rows=x.shape[0], impl="reference")
    assert len(reads) == 1  # no version counter to vouch for them: read as any other routing


@pytest.mark.parametrize("call, name", [
    (lambda w: tsct.quant.quantize(w, "int4"), "tsct.quant.quantize"),
    (lambda w: tsct.quant.fake_quantize(w, "int4"), "tsct.quant.fake_quantize"),
    (lambda w: tsct.quant.k_multiple(4), "tsct.quant.k_multiple"),
    (lambda w: tsct.ops.quantize_master(w, "int4"), "quantize_master"),
])
def test_unknown_format_names_the_function_and_the_choices(call, name):
    w = torch.randn(2, 32, 16, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=rf"^{name}: fmt must be one of \['nvfp4', 'sign', 'fp8', 'ternary'\], got "):
        call(w)
