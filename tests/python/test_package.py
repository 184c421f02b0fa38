"""The package itself: version, backends, the library it loaded, the ctypes structs against the header, and the
sdist (it carries the C project, which configures on its own)."""

import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile

import pytest

import flashc
from flashc import _lib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_version_is_the_library_and_the_project_version():
    cmake = (ROOT / "CMakeLists.txt").read_text()
    project = re.search(r"project\(flashc VERSION ([0-9.]+)", cmake).group(1)
    pyproject = re.search(r'^version = "([0-9.]+)"', (ROOT / "python" / "pyproject.toml").read_text(), re.M).group(1)
    assert flashc.__version__ == project == pyproject


def test_backends_describe_the_library():
    bs = flashc.backends()
    assert bs, "libflashc has at least one backend"
    for b in bs:
        assert b.name and b.device in ("cpu", "cuda") and b.dtypes
        assert 1 <= b.min_head_dim <= b.max_head_dim
        assert b.usable == (b.why_unusable == ""), b
    assert len({b.name for b in bs}) == len(bs)


def test_library_path_override_is_honoured():
    if os.environ.get("FLASHC_LIBRARY"):
        assert pathlib.Path(flashc.library_path) == pathlib.Path(os.environ["FLASHC_LIBRARY"])
    else:
        assert pathlib.Path(flashc.library_path).parent.parent == pathlib.Path(flashc.__file__).parent


def test_missing_library_is_an_import_error(tmp_path):
    env = dict(os.environ, FLASHC_LIBRARY=str(tmp_path / "nope.so"))
    r = subprocess.run(
        [sys.executable, "-c", "import flashc"], env=env, capture_output=True, text=True
    )
    assert r.returncode != 0 and "ImportError" in r.stderr and "nope.so" in r.stderr


ABI_PROGRAM = r"""
#include <stddef.h>
#include <stdio.h>
#include "flashc.h"
#define F(T, f) printf(#T "." #f " %zu %zu\n", offsetof(T, f), sizeof(((T *)0)->f))
int main(void) {
  printf("flashc_tensor %zu\nflashc_params %zu\nflashc_backend_info %zu\n", sizeof(flashc_tensor),
         sizeof(flashc_params), sizeof(flashc_backend_info));
  F(flashc_tensor, data); F(flashc_tensor, dtype); F(flashc_tensor, size); F(flashc_tensor, stride);
  F(flashc_params, struct_size); F(flashc_params, scale); F(flashc_params, causal); F(flashc_params, align); F(flashc_params, window_left);
  F(flashc_params, window_right); F(flashc_params, cu_seqlens_q); F(flashc_params, cu_seqlens_k);
  F(flashc_params, num_seqs); F(flashc_params, deterministic); F(flashc_params, softcap);
  F(flashc_params, alibi_slopes); F(flashc_params, alibi_stride_batch);
  F(flashc_params, seqused_q); F(flashc_params, seqused_k); F(flashc_params, attn_mask);
  F(flashc_params, attn_mask_is_bool); F(flashc_params, attn_mask_stride); F(flashc_params, dbias);
  F(flashc_params, dbias_stride);
  F(flashc_params, dropout_p); F(flashc_params, dropout_seed); F(flashc_params, dropout_offset);
  F(flashc_params, dropout_mask); F(flashc_params, num_splits); F(flashc_params, cu_seqlens_device);
  F(flashc_params, max_seqlen_q); F(flashc_params, max_seqlen_k);
  F(flashc_backend_info, struct_size); F(flashc_backend_info, name); F(flashc_backend_info, summary); F(flashc_backend_info, device);
  F(flashc_backend_info, has_backward); F(flashc_backend_info, dtypes); F(flashc_backend_info, min_head_dim);
  F(flashc_backend_info, max_head_dim); F(flashc_backend_info, usable); F(flashc_backend_info, why_unusable);
  printf("enum %d %d %d %d %d %d %d\n", FLASHC_ERR_INVALID_ARGUMENT, FLASHC_ERR_UNSUPPORTED,
         FLASHC_ERR_OUT_OF_MEMORY, FLASHC_BF16, FLASHC_F64, FLASHC_ALIGN_TOP_LEFT, FLASHC_DEVICE_CUDA);
  return 0;
}
"""


def test_ctypes_structs_match_the_header(tmp_path):
    """Compile a program that prints the header's sizes and offsets, compare with the ctypes mirror: a field
    added to flashc.h without a matching change in _lib.py fails here instead of corrupting calls."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler to read the header's layout")
    src, exe = tmp_path / "abi.c", tmp_path / "abi"
    src.write_text(ABI_PROGRAM)
    subprocess.run([cc, "-std=c11", f"-I{ROOT / 'include'}", str(src), "-o", str(exe)], check=True)
    lines = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines()
    structs = {"flashc_tensor": _lib.Tensor, "flashc_params": _lib.Params, "flashc_backend_info": _lib.BackendInfo}
    import ctypes

    for line in lines:
        name, *nums = line.split()
        if name == "enum":
            assert list(map(int, nums)) == [
                _lib.ERR_INVALID_ARGUMENT,
                _lib.ERR_UNSUPPORTED,
                _lib.ERR_OUT_OF_MEMORY,
                _lib.BF16,
                _lib.F64,
                _lib.ALIGN_TOP_LEFT,
                _lib.DEVICE_CUDA,
            ]
        elif "." in name:
            struct, field = name.split(".")
            desc = getattr(structs[struct], field)
            assert (desc.offset, desc.size) == tuple(map(int, nums)), f"{name}: ctypes {desc.offset}/{desc.size}"
        else:
            assert ctypes.sizeof(structs[name]) == int(nums[0]), name
    # every field of the header is mirrored, none more
    for struct, cls in structs.items():
        header_fields = [ln.split()[0].split(".")[1] for ln in lines if ln.startswith(struct + ".")]
        assert [f for f, _ in cls._fields_] == header_fields


def _sdist_builder():
    """An interpreter that builds the sdist offline (build, scikit-build-core >= 1.0): this one, else the tool venv
    that scripts/wheel makes. None when neither can."""
    probe = "import build, scikit_build_core as s; assert int(s.__version__.split('.')[0]) >= 1"
    for py in (pathlib.Path(sys.executable), ROOT / "build-wheel" / "venv" / "bin" / "python"):
        if py.exists() and subprocess.run([str(py), "-c", probe], capture_output=True).returncode == 0:
            return str(py)
    return None


@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
    """(the sdist's file names below its top folder, the unpacked top folder), built from python/ without isolation,
    so without the network."""
    py = _sdist_builder()
    if py is None:
        pytest.skip("no `build` and scikit-build-core >= 1.0: pip install build scikit-build-core, or scripts/wheel")
    out = tmp_path_factory.mktemp("sdist")
    r = subprocess.run(
        [py, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(out), str(ROOT / "python")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    tarball = out / f"flashc-{flashc.__version__}.tar.gz"
    assert tarball.exists(), sorted(p.name for p in out.iterdir())
    with tarfile.open(tarball) as tf:
        top = f"flashc-{flashc.__version__}/"
        names = {m.name[len(top) :] for m in tf.getmembers() if m.isfile()}
        assert all(m.name.startswith(top) for m in tf.getmembers() if m.name != top.rstrip("/"))
        tf.extractall(out, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return names, out / top


def test_sdist_carries_the_c_project_and_the_package(sdist):
    """Every file of the CMake project that builds libflashc lies under csrc/ (what a build from the sdist
    configures), every module of the package under flashc/; the tests, CLI, docs and benchmarks stay out."""
    names, _ = sdist
    want = {"pyproject.toml", "README.md", "PKG-INFO", "csrc/CMakeLists.txt"}
    for part in ("cmake", "include", "src"):
        want |= {f"csrc/{p.relative_to(ROOT).as_posix()}" for p in (ROOT / part).rglob("*") if p.is_file()}
    pkg = ROOT / "python" / "flashc"
    want |= {
        f"flashc/{p.relative_to(pkg).as_posix()}"
        for p in pkg.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert "csrc/include/flashc.h" in want and "flashc/py.typed" in want and "flashc/_torch_ext.cpp" in want
    assert sorted(want - names) == []
    left_out = (["csrc", d] for d in ("tests", "cli", "docs", "bench"))
    assert sorted(n for n in names if n.split("/")[:2] in left_out) == []


def test_sdist_c_project_configures_alone(sdist, tmp_path):
    """The sdist's csrc/ is a CMake project of its own: nothing it includes lies outside it (a build from the
    sdist cannot reach the repository). Configured as the wheel build configures it, CPU only."""
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("no cmake to configure the sdist's C project")
    _, top = sdist
    off = [f"-DFLASHC_{o}=OFF" for o in ("CUDA", "BUILD_TESTS", "BUILD_CLI", "MPI", "TORCH_EXT")]
    r = subprocess.run(
        [cmake, "-S", str(top / "csrc"), "-B", str(tmp_path / "build"), *off], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "flashc: CUDA backends OFF" in r.stdout, r.stdout
