"""flashc never brings a second NCCL into the process: libflashc does not link NCCL (the ring loads it at run
time, src/ring/comm_nccl.c), so `import flashc.torch` before `import torch` works and torch keeps its own
bundled NCCL. Each check runs in a fresh interpreter, where the import order is the test's, not pytest's."""

import os
import shutil
import subprocess
import sys

import pytest

import flashc


def run_python(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)


def test_libflashc_does_not_need_nccl():
    if shutil.which("readelf"):
        dynamic = subprocess.run(["readelf", "-d", flashc.library_path], capture_output=True, text=True, check=True)
        needed = [line for line in dynamic.stdout.splitlines() if "(NEEDED)" in line]
        assert needed, f"readelf -d {flashc.library_path} lists no NEEDED entry at all:\n{dynamic.stdout}"
        assert not [line for line in needed if "nccl" in line], "libflashc links NCCL:\n" + "\n".join(needed)
    # And at run time: importing flashc maps no libnccl.
    r = run_python(
        "import flashc\n"
        "maps = open('/proc/self/maps').read().splitlines()\n"
        "print('\\n'.join(sorted({line.split()[-1] for line in maps if 'libflashc' in line or 'libnccl' in line})))"
    )
    assert r.returncode == 0, r.stderr
    mapped = r.stdout.split()
    assert any("libflashc" in m for m in mapped), f"the probe did not see libflashc mapped: {mapped}"
    assert not [m for m in mapped if "libnccl" in m], f"`import flashc` loaded NCCL: {mapped}"


def test_flashc_torch_before_torch_on_gpu():
    probe = run_python("import torch; print(int(torch.cuda.is_available()))")
    if probe.returncode != 0:
        pytest.skip("torch is not installed (pip install torch): " + (probe.stderr.strip().splitlines() or [""])[-1])
    if probe.stdout.strip() != "1":
        pytest.skip("no CUDA device (torch.cuda.is_available() is False)")
    if not [b for b in flashc.backends() if b.device == "cuda"]:
        pytest.skip("this libflashc was built without CUDA backends (FLASHC_CUDA=OFF or no nvcc)")
    # flashc first, then torch (which loads its NCCL), then a call on the GPU checked against torch's SDPA.
    r = run_python(
        "import flashc.torch\n"
        "import torch\n"
        "import torch.distributed\n"
        "q, k, v = (torch.randn(1, 300, 4, 64, device='cuda') for _ in range(3))\n"
        "o = flashc.torch.attention(q, k, v, causal=True)\n"
        "t = lambda x: x.transpose(1, 2)\n"
        "want = t(torch.nn.functional.scaled_dot_product_attention(t(q), t(k), t(v), is_causal=True))\n"
        "print(float((o - want).abs().max()))\n"
        "print(torch.cuda.nccl.version())\n"
    )
    assert r.returncode == 0, f"import flashc.torch before torch failed:\n{r.stderr}"
    err = float(r.stdout.split()[0])
    assert err < 1e-3, f"flashc vs torch SDPA after the import: max |error| {err:.3g}"


def test_testing_list_names_a_broken_torch(tmp_path):
    # A torch that is installed but fails to import (as it did when libflashc brought its own NCCL): --list
    # must say so with the error, not "not installed".
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('libtorch_cuda.so: undefined symbol: ncclCommResume')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    r = subprocess.run(
        [sys.executable, "-m", "flashc.testing", "--list"], capture_output=True, text=True, env=env, timeout=300
    )
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.strip().startswith("torch:cpu"))
    assert "fails to import" in line and "ncclCommResume" in line, line
    assert "not installed" not in line, line
