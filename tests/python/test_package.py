"""The package itself: version, backends, the library it loaded, and the ctypes structs against the header."""

import os
import pathlib
import re
import shutil
import subprocess
import sys

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
  F(flashc_params, dropout_mask); F(flashc_params, num_splits);
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
