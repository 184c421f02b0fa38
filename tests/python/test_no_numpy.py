"""numpy is an extra (pip install flashc[numpy]): `import flashc`, flashc.torch, flashc.hf and attention_with_kvcache
on torch tensors work without numpy and ml_dtypes, and a numpy entry point says that it needs numpy. Each check runs
in a fresh interpreter in which importing numpy or ml_dtypes fails, as where they are not installed."""

import json
import subprocess
import sys
import textwrap

import pytest

# Set before anything else in the child: `import numpy` (torch's too) then fails as where it is not installed, and
# importlib.util.find_spec finds nothing.
BLOCK = """
import sys
sys.modules["numpy"] = sys.modules["ml_dtypes"] = None
"""


def run_without_numpy(code: str) -> dict:
    """Runs `code` without numpy; it prints one JSON object as its last line, which is returned."""
    r = subprocess.run(
        [sys.executable, "-c", BLOCK + textwrap.dedent(code)],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, f"the child failed without numpy:\n{r.stderr}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_import_flashc_needs_no_numpy_and_says_so_when_called_with_non_tensors():
    res = run_without_numpy("""
        import json
        import flashc
        try:
            flashc.attention([[1.0]], [[1.0]], [[1.0]])
            err = None
        except ImportError as e:
            err = str(e)
        print(json.dumps({"numpy": flashc._arrays.np is not None, "error": err,
                          "backends": [b.name for b in flashc.backends()]}))
    """)
    assert not res["numpy"], "the child imported numpy: the test's premise failed"
    assert "cpu-ref" in res["backends"]
    assert res["error"] is not None, "flashc.attention on lists without numpy raised no ImportError"
    assert "needs numpy" in res["error"] and "pip install 'flashc[numpy]'" in res["error"], res["error"]


def test_flashc_torch_without_numpy_matches_cpu_ref():
    pytest.importorskip("torch")
    res = run_without_numpy("""
        import json
        import torch
        import flashc, flashc.hf, flashc.torch

        torch.manual_seed(0)
        q, k, v = (torch.randn(2, 37, 4, 16, dtype=torch.float32, requires_grad=True) for _ in range(3))
        dout = torch.randn(2, 37, 4, 16)
        out = flashc.torch.attention(q, k, v, causal=True, backend="cpu")
        grads = torch.autograd.grad(out, (q, k, v), dout)
        # the fp64 oracle, on the same inputs
        q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
        ref = flashc.torch.attention(q64, k64, v64, causal=True, backend="cpu-ref")
        ref_grads = torch.autograd.grad(ref, (q64, k64, v64), dout.double())
        errs = [float((a.double() - b).abs().max()) for a, b in zip((out, *grads), (ref, *ref_grads))]

        # packed sequences with int32 offsets (no conversion), and the numpy path's message for a list
        cu = torch.tensor([0, 11, 37], dtype=torch.int32)
        packed = flashc.torch.attention_varlen(q[0], k[0], v[0], cu, cu, causal=True, backend="cpu")
        packed_ref = flashc.torch.attention_varlen(q64[0], k64[0], v64[0], cu, cu, causal=True, backend="cpu-ref")
        try:
            flashc.torch.attention_varlen(q[0], k[0], v[0], [0, 11, 37], [0, 11, 37])
            list_error = None
        except ImportError as e:
            list_error = str(e)

        # the KV cache on torch tensors: one decoding step appended at row 5
        k_cache, v_cache = torch.zeros(2, 8, 4, 16), torch.zeros(2, 8, 4, 16)
        k_cache[:, :5], v_cache[:, :5] = k.detach()[:, :5], v.detach()[:, :5]
        step = flashc.attention_with_kvcache(q.detach()[:, 5:6], k_cache, v_cache, k=k.detach()[:, 5:6],
                                             v=v.detach()[:, 5:6], cache_seqlens=5, backend="cpu")
        step_ref = flashc.torch.attention(q64[:, 5:6], k64[:, :6], v64[:, :6], backend="cpu-ref")
        print(json.dumps({
            "numpy": flashc._arrays.np is not None,
            "errs": errs,
            "packed_err": float((packed.double() - packed_ref).abs().max()),
            "step_err": float((step.double() - step_ref).abs().max()),
            "list_error": list_error,
        }))
    """)
    assert not res["numpy"], "the child imported numpy: the test's premise failed"
    for name, err in zip(("out", "dq", "dk", "dv"), res["errs"]):
        assert err < 1e-4, f"flashc.torch without numpy: {name} differs from cpu-ref by {err:.3g}"
    assert res["packed_err"] < 1e-4, f"attention_varlen without numpy: {res['packed_err']:.3g} from cpu-ref"
    assert res["step_err"] < 1e-4, f"attention_with_kvcache without numpy: {res['step_err']:.3g} from cpu-ref"
    assert res["list_error"] is not None and "cu_seqlens_q" in res["list_error"], res["list_error"]
    assert "needs numpy" in res["list_error"] and "int32 torch tensors" in res["list_error"], res["list_error"]
