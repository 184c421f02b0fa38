"""docs/environment.md lists exactly the environment variables the code reads: every FLASHC_* name in the
library's, the CLI's and the package's sources has a row there, and every row names a variable something in the
tree still reads (a switch deleted with its variant must take its row along)."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
NAME = re.compile(r"\bFLASHC_[A-Z0-9_]+\b")
# Names that are not environment variables: include guards, macros of the public header and of the build.
NOT_ENV = re.compile(
    r"_(H|CUH)$|^FLASHC_(VERSION\w*|ERR_\w+|OK|STATUS_COUNT|F32|F16|BF16|F64|ALIGN_\w+|DEVICE_\w+|RING_"
    r"CONTIGUOUS|RING_ZIGZAG|HAVE_\w+|RING_MPI|RING_NCCL|RING_CHANNELS|TEST_CUDA|CLI_CUDA|NCCL_PATH|API)$"
)


def _documented() -> set:
    text = (ROOT / "docs" / "environment.md").read_text()
    return set(re.findall(r"^\| `(FLASHC_[A-Z0-9_]+)`", text, flags=re.MULTILINE))


def _read_by(folder: str, pattern: str) -> set:
    """FLASHC_* names that sources under `folder` pass to getenv (C: a string literal; Python: os.environ)."""
    names = set()
    for path in (ROOT / folder).rglob(pattern):
        for literal in re.findall(r'"(FLASHC_[A-Z0-9_]+)"', path.read_text(errors="replace")):
            if not NOT_ENV.search(literal):
                names.add(literal)
    return names


def test_every_variable_the_library_reads_is_documented():
    code = _read_by("src", "*.c") | _read_by("src", "*.cu") | _read_by("src", "*.cuh") | _read_by("cli", "*.c")
    missing = sorted(code - _documented())
    assert not missing, f"read in src/ or cli/ but not in docs/environment.md: {missing}"


def test_every_documented_variable_is_read_somewhere():
    corpus = []
    for folder, patterns in (
        ("src", ("*.c", "*.h", "*.cu", "*.cuh")),
        ("cli", ("*.c", "*.h")),
        ("python", ("*.py",)),
        ("tools", ("*.py", "*.sh")),
        ("scripts", ("*",)),
    ):
        for pattern in patterns:
            corpus += [p.read_text(errors="replace") for p in (ROOT / folder).rglob(pattern) if p.is_file()]
    text = "\n".join(corpus)
    stale = sorted(name for name in _documented() if name not in set(NAME.findall(text)))
    assert not stale, f"docs/environment.md documents variables nothing reads: {stale}"
