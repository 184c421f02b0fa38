#!/usr/bin/env python3
"""sass_loops.py — the hot loop of each kernel, read statically off its SASS.

For every kernel of a cubin (or of nvdisasm/cuobjdump -sass output) whose demangled name matches --kernels, finds
the loops (a branch back to a label at a lower address) and picks the hot one: the innermost loop with tensor-core
instructions (HGMMA, HMMA). Prints per kernel: its instruction count, the hot loop's
instruction count and its mix (HMMA/HGMMA, MUFU, FP32, ldmatrix, shared and global memory, uniform datapath,
barriers), and local-memory traffic (LDL/STL: spills) in the loop and in the whole kernel.

A loop's count is every instruction between its head and its back edge: the masked and the unmasked paths of a
block both, so it is an upper bound of what one trip issues; --paths prints the forward branches inside the loop
with the number of instructions each one skips, to read the common path off.

  tools/profile/sass_loops.py build/CMakeFiles/flashc_objects.dir/src/cuda/mma/fwd.cu.o --kernels 'fwd_lean.*bfloat16, 128'
  nvdisasm -c x.cubin > x.sass; tools/profile/sass_loops.py x.sass

Needs nvdisasm (CUDA toolkit, or the nvidia-cuda-nvdisasm wheel: --nvdisasm PATH) for cubins and objects;
c++filt to demangle. Static counts, not a profile: what runs is for ncu (tools/profile/ncu.sh)."""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys

INSN = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:\{\s*)?(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)(.*?);")
LABEL = re.compile(r"^\s*(\.L_[A-Za-z0-9_]+):")
FUNC = re.compile(r"^\s*\.text\.(\S+):")
TARGET = re.compile(r"`\((\.L_[A-Za-z0-9_]+)\)")

GROUPS = [  # (name, opcode prefixes): the first that matches counts the instruction
    ("tensor", ("HGMMA", "HMMA", "IMMA")),
    ("mufu", ("MUFU",)),
    ("fp32", ("FFMA", "FADD", "FMUL", "FMNMX", "FSEL", "FSETP", "FCHK", "FSWZADD")),
    ("convert", ("F2FP", "F2F", "I2F", "F2I", "HADD2", "HMUL2", "HFMA2", "PRMT")),
    ("ldmatrix", ("LDSM", "STSM")),
    ("shared", ("LDS", "STS", "ATOMS")),
    ("global", ("LDG", "STG", "RED", "ATOMG", "LDGSTS", "LDGDEPBAR", "UBLKCP", "UTMALDG", "UTMASTG", "UBLKRED",
                "UTMAREDG", "UTMACCTL", "UTMAPF")),
    ("local", ("LDL", "STL")),
    ("sync", ("BAR", "SYNCS", "WARPGROUP", "DEPBAR", "WARPSYNC", "MEMBAR", "FENCE", "NANOSLEEP", "ELECT", "VOTE",
              "SHFL", "ERRBAR", "CCTL")),
    ("uniform", ("U",)),
    ("branch", ("BRA", "BRX", "EXIT", "RET", "CALL", "BSSY", "BSYNC", "JMP", "BREAK", "YIELD")),
    ("integer", ("IMAD", "IADD", "VIADD", "LOP", "SHF", "ISETP", "LEA", "SEL", "MOV", "IABS", "IMNMX", "VIMNMX", "SGXT",
                 "POPC", "FLO", "BMSK", "S2R", "S2UR", "CS2R", "P2R", "R2P", "PLOP3", "LDC", "R2UR", "IDP", "BREV")),
]


def group_of(op):
    if op.startswith("R2UR") or op.startswith("S2UR"):
        return "integer"
    for name, prefixes in GROUPS:
        if op.startswith(prefixes):
            return name
    return "other"


def read_sass(path, nvdisasm):
    if path.endswith(".sass") or path.endswith(".txt"):
        return open(path).read()
    tool = nvdisasm or shutil.which("nvdisasm") or "/usr/local/cuda/bin/nvdisasm"
    if not path.endswith(".cubin"):  # a host object with an embedded fatbinary: cuobjdump reads it
        cuobjdump = shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
        if not os.path.exists(cuobjdump):
            sys.exit("sass_loops.py: no cuobjdump to read %s; pass a .cubin (nvcc -cubin) or nvdisasm output" % path)
        return subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True, check=True).stdout
    return subprocess.run([tool, "-c", path], capture_output=True, text=True, check=True).stdout


def split_functions(text):
    """[(mangled name, its lines)]: nvdisasm marks a kernel with ".text.name:", cuobjdump -sass with "Function : name"."""
    funcs = []
    for line in text.split("\n"):
        m = FUNC.match(line) or re.match(r"\s*Function : (\S+)", line)
        if m:
            funcs.append((m.group(1), []))
        elif funcs:
            funcs[-1][1].append(line)
    return funcs


def parse(lines):
    """Instructions [(addr, pred, op, operands)], labels {name: index of the next instruction}. cuobjdump -sass
    names a branch's target by its address ("BRA 0x9e30"), nvdisasm by a label: each address is a label too."""
    insns, labels = [], {}
    for line in lines:
        m = LABEL.match(line)
        if m:
            labels[m.group(1)] = len(insns)
            continue
        m = INSN.match(line)
        if m:
            insns.append((int(m.group(1), 16), (m.group(2) or "").strip(), m.group(3), m.group(4)))
    for k, (addr, _, _, _) in enumerate(insns):
        labels["0x%x" % addr] = k
    return insns, labels


def target(rest, labels):
    """The instruction index a branch's operands name (a label or an address), or None."""
    m = TARGET.search(rest) or re.search(r"\b(0x[0-9a-f]+)\b", rest)
    if not m:
        return None
    name = m.group(1)
    if name.startswith("0x"):
        name = "0x%x" % int(name, 16)
    return labels.get(name)


def loops(insns, labels):
    """(head, back edge) index pairs of every backward branch."""
    out = []
    for k, (_, _, op, rest) in enumerate(insns):
        if op.startswith("BRA"):
            to = target(rest, labels)
            if to is not None and to <= k:
                out.append((to, k))
    return out


def hot_loop(insns, labels):
    best = None
    for head, tail in loops(insns, labels):
        n_tensor = sum(group_of(insns[k][2]) == "tensor" for k in range(head, tail + 1))
        key = -(tail - head)  # the innermost (shortest) loop that issues tensor instructions
        if n_tensor and (best is None or key > best[0]):
            best = (key, head, tail)
    return None if best is None else best[1:]


def mix(insns, lo, hi):
    groups, ops = collections.Counter(), collections.Counter()
    for k in range(lo, hi + 1):
        op = insns[k][2]
        if op == "NOP":
            continue
        groups[group_of(op)] += 1
        ops[op.split(".")[0]] += 1
    return groups, ops


def forward_branches(insns, labels, lo, hi):
    out = []
    for k in range(lo, hi + 1):
        _, pred, op, rest = insns[k]
        if op.startswith("BRA"):
            to = target(rest, labels)
            if to is not None and lo < to <= hi + 1 and to > k:
                out.append((insns[k][0], pred, to - k - 1))
    return out


def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
        return out[: len(names)]
    except OSError:
        return names


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", help="cubin, object or SASS text files")
    ap.add_argument("--kernels", default=".", help="regex on the demangled kernel name")
    ap.add_argument("--nvdisasm", default=None)
    ap.add_argument("--ops", action="store_true", help="print each loop's opcode counts too")
    ap.add_argument("--paths", action="store_true", help="print the forward branches inside each hot loop")
    args = ap.parse_args()
    pattern = re.compile(args.kernels)
    spilled = 0
    print("%-6s %-6s %-6s %-5s %-5s  %s" % ("insns", "loop", "tensor", "LDL/STL", "", "kernel (hot loop: mix)"))
    for path in args.inputs:
        funcs = split_functions(read_sass(path, args.nvdisasm))
        for (name, lines), pretty in zip(funcs, demangle([f[0] for f in funcs])):
            if not pattern.search(pretty):
                continue
            insns, labels = parse(lines)
            local_all = sum(group_of(i[2]) == "local" for i in insns)
            loop = hot_loop(insns, labels)
            if loop is None:
                print("%-6d %-6s %-6s %-5d %-5s  %s (no loop with tensor instructions)" % (len(insns), "-", "-",
                                                                                          local_all, "", pretty))
                continue
            lo, hi = loop
            groups, ops = mix(insns, lo, hi)
            spilled += groups["local"] > 0
            print("%-6d %-6d %-6d %-5d %-5d  %s" % (len(insns), sum(groups.values()), groups["tensor"],
                                                     groups["local"], local_all, pretty))
            print("       " + "  ".join("%s %d" % (g, groups[g]) for g, _ in GROUPS + [("other", ())] if groups[g]))
            if args.ops:
                print("       " + "  ".join("%s %d" % kv for kv in ops.most_common()))
            if args.paths:
                for addr, pred, skipped in forward_branches(insns, labels, lo, hi):
                    print("         branch at %05x %-5s skips %d" % (addr, pred, skipped))
    print("hot loops with local-memory traffic: %d" % spilled)


if __name__ == "__main__":
    main()
