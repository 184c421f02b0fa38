"""Tests of the repository's analysis tools that run without a GPU: tools/profile/sass_loops.py reads a kernel's
hot loop off SASS text, in nvdisasm's form (branch targets are labels) and in cuobjdump -sass's (addresses)."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load_sass_loops():
    spec = importlib.util.spec_from_file_location("sass_loops", ROOT / "tools" / "profile" / "sass_loops.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# One kernel: a set-up, an outer loop (head 0x0040) around an inner loop with the MMAs and a spill reload (head
# 0x0060), an exit. The inner loop is the hot one: 2 HMMA, 1 LDL, 5 instructions in all.
BODY = [
    (0x0000, "S2R R0, SR_TID.X"),
    (0x0010, "STL [R1], R0"),
    (0x0040, "IADD3 R2, R2, 0x1, RZ", "outer"),
    (0x0050, "MOV R3, RZ"),
    (0x0060, "LDL R4, [R1]", "inner"),
    (0x0070, "HMMA.16816.F32.BF16 R8, R12, R16, R8"),
    (0x0080, "HMMA.16816.F32.BF16 R20, R12, R18, R20"),
    (0x0090, "ISETP.NE.AND P0, PT, R3, R4, PT"),
    (0x00A0, "@P0 BRA {inner}"),
    (0x00B0, "ISETP.NE.AND P1, PT, R2, 0x10, PT"),
    (0x00C0, "@P1 BRA {outer}"),
    (0x00D0, "EXIT"),
]


def sass(style):
    lines = [".text._Z6kernelv:" if style == "nvdisasm" else "\tFunction : _Z6kernelv"]
    for row in BODY:
        addr, text = row[0], row[1]
        if len(row) > 2 and style == "nvdisasm":
            lines.append(f".L_x_{row[2]}:")
        if style == "nvdisasm":
            text = text.format(inner="`(.L_x_inner)", outer="`(.L_x_outer)")
        else:
            text = text.format(inner="0x60", outer="0x40")
        pred, _, rest = text.partition(" ") if text.startswith("@") else ("", "", text)
        lines.append(f"        /*{addr:04x}*/              {pred} {rest} ;")
    return "\n".join(lines)


def test_sass_loops_finds_the_hot_loop_in_both_forms():
    sl = load_sass_loops()
    for style in ("nvdisasm", "cuobjdump"):
        ((name, lines),) = sl.split_functions(sass(style))
        assert name == "_Z6kernelv"
        insns, labels = sl.parse(lines)
        assert len(insns) == len(BODY)
        assert sorted(sl.loops(insns, labels)) == [(2, 10), (4, 8)], style
        lo, hi = sl.hot_loop(insns, labels)
        groups, _ = sl.mix(insns, lo, hi)
        assert (insns[lo][0], insns[hi][0]) == (0x60, 0xA0), style
        assert groups["tensor"] == 2 and groups["local"] == 1 and sum(groups.values()) == 5, style
