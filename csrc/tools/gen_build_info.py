#!/usr/bin/env python3
"""Write manifest.json and build_info.cpp for libtsct_kernels.so from the compiled device objects.

Run by CMake after the .cu objects are compiled and before the library is linked:

    gen_build_info.py --objects a.o b.o --gencodes sm_80,compute_80,... --version 0.1.0 --abi-version 1 \
        --nvcc-version 13.0.88 --json manifest.json --cpp build_info.cpp [--extra key=value ...] \
        [--triton-aot triton_aot/index.json] [--cutedsl cutedsl/sm_120a/index.json ...]

It reads each object's ``.nv_fatbin`` section (nvcc embeds one fatbinary per object; built with
``--no-compress`` so entries are plain ELF cubins and PTX text), lists the ``__global__`` entry
points per target (ELF symbols with STO_CUDA_ENTRY, PTX ``.entry`` lines), and fails the build if
the targets found differ from the requested gencode list. With ``--triton-aot`` it adds a
"triton_aot" section from the Triton AOT build's index (python/tsct/kernels/triton_common/aot_build.py,
every kernel family: the bf16 GLU and the low-bit GLU): the Triton version, and per arch the number
of cubins and the kernels with their variant counts (and a proxy arch's "proxy" record, with a top-level
"proxy_build" line: docs/decisions/0017); the cubins themselves ship in tsct/_aot/<arch>/. With
``--cutedsl`` it adds a "cutedsl" section from cutedsl/build.py's index (the CuTeDSL sm_120 kernels linked
into the library, docs/decisions/0009; given once per arch, sm_120a and sm_121a, decision 0010): DSL dist
and version, "arch" (the first index's), "archs" (all), and per kernel its name, arch, entry, parameters
and threads. The JSON is written to manifest.json and, as a C string, into build_info.cpp, so
``tsct_build_info()`` returns the same text.

Only the standard library is used (it runs under whatever Python drives the build).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import struct
import sys

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX, KIND_ELF = 1, 2
# Entry header flag bits (observed with nvcc 12.x/13.0 fatbinaries; cuobjdump names them the same way):
FLAG_COMPRESSED = 0x2000
FLAG_ARCH_SPECIFIC = 0x100000   # sm_XXa / compute_XXa
FLAG_FAMILY = 0x200000          # sm_XXf / compute_XXf
STO_CUDA_ENTRY = 0x10
SHT_SYMTAB = 2
STT_FUNC = 2


def elf_sections(data: bytes) -> dict[str, tuple[int, int, int, int, int]]:
    """name -> (type, offset, size, link, entsize, index) for an ELF64 little-endian file."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not an ELF64 little-endian file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    raw = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab_off = raw[shstrndx][4]
    out = {}
    for i, (name, typ, _flags, _addr, off, size, link, _info, _align, entsize) in enumerate(raw):
        end = data.index(b"\0", strtab_off + name)
        out[data[strtab_off + name:end].decode()] = (typ, off, size, link, entsize, i)
    return out


def cubin_kernels(cubin: bytes) -> list[str]:
    """Names of the entry functions (kernels) in a cubin's symbol table."""
    secs = elf_sections(cubin)
    by_index = {v[5]: v for v in secs.values()}
    names = []
    for typ, off, size, link, entsize, _ in secs.values():
        if typ != SHT_SYMTAB:
            continue
        str_off = by_index[link][1]
        for j in range(size // (entsize or 24)):
            st_name, st_info, st_other, _shndx, _value, _size = struct.unpack_from("<IBBHQQ", cubin, off + j * 24)
            if st_info & 0xF == STT_FUNC and st_other & STO_CUDA_ENTRY:
                end = cubin.index(b"\0", str_off + st_name)
                names.append(cubin[str_off + st_name:end].decode())
    return sorted(set(names))


def ptx_kernels(ptx: bytes) -> list[str]:
    text = ptx.split(b"\0", 1)[0].decode("utf-8", "replace")
    return sorted(set(re.findall(r"^\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+([A-Za-z_$][\w$]*)", text, re.M)))


def fatbin_entries(blob: bytes):
    """Yield (target_name, kernel_names) for every entry of every fatbinary in a .nv_fatbin blob."""
    off = 0
    while off + 16 <= len(blob):
        magic, _ver, hsize, fsize = struct.unpack_from("<IHHQ", blob, off)
        if magic != FATBIN_MAGIC:
            off += 8  # section padding between concatenated fatbinaries
            continue
        pos, end = off + hsize, off + hsize + fsize
        while pos < end:
            kind, _ever, ehsize, psize = struct.unpack_from("<HHIQ", blob, pos)
            (arch,) = struct.unpack_from("<I", blob, pos + 28)
            (flags,) = struct.unpack_from("<Q", blob, pos + 40)
            payload = blob[pos + ehsize:pos + ehsize + psize]
            if flags & FLAG_COMPRESSED:
                raise SystemExit("gen_build_info: compressed fatbinary entry; compile with --no-compress")
            suffix = "a" if flags & FLAG_ARCH_SPECIFIC else "f" if flags & FLAG_FAMILY else ""
            if kind == KIND_ELF:
                yield f"sm_{arch}{suffix}", cubin_kernels(payload)
            elif kind == KIND_PTX:
                yield f"compute_{arch}{suffix}", ptx_kernels(payload)
            pos += ehsize + psize
        off = end


def object_targets(path: str) -> dict[str, list[str]]:
    data = open(path, "rb").read()
    secs = elf_sections(data)
    if ".nv_fatbin" not in secs:
        return {}
    _typ, off, size, *_ = secs[".nv_fatbin"]
    found: dict[str, list[str]] = {}
    for target, names in fatbin_entries(data[off:off + size]):
        if target in found:
            raise SystemExit(f"gen_build_info: {path}: target {target} appears twice")
        found[target] = names
    return found


def c_string(text: str) -> str:
    lines = []
    for chunk in text.splitlines(keepends=True):
        esc = chunk.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        lines.append(f'    "{esc}"')
    return "\n".join(lines) or '    ""'


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objects", nargs="+", required=True)
    ap.add_argument("--gencodes", required=True, help="target names separated by ',' or ';', e.g. sm_90a,compute_80")
    ap.add_argument("--version", required=True)
    ap.add_argument("--abi-version", type=int, required=True)
    ap.add_argument("--nvcc-version", required=True)
    ap.add_argument("--extra", action="append", default=[], help="key=value added to the JSON")
    ap.add_argument("--json", required=True)
    ap.add_argument("--cpp", required=True)
    ap.add_argument("--triton-aot", default=None, help="index.json of the Triton AOT build (adds 'triton_aot')")
    ap.add_argument("--cutedsl", action="append", default=[],
                    help="index.json of cutedsl/build.py, once per arch (adds 'cutedsl')")
    args = ap.parse_args(argv)

    gencodes = [g for g in re.split(r"[;,]", args.gencodes) if g]
    kernels: dict[str, set[str]] = {g: set() for g in gencodes}
    errors = []
    for obj in args.objects:
        found = object_targets(obj)
        if not found:
            continue  # a host-only object
        name = os.path.basename(obj)
        if sorted(found) != sorted(gencodes):
            errors.append(f"{name}: holds {sorted(found)}, expected {sorted(gencodes)}")
        for target, names in found.items():
            kernels.setdefault(target, set()).update(names)
    if errors:
        raise SystemExit("gen_build_info: device objects do not match TSCT_CUDA_GENCODES:\n  " + "\n  ".join(errors))

    epoch = os.environ.get("SOURCE_DATE_EPOCH")  # reproducible builds
    when = _dt.datetime.fromtimestamp(int(epoch), _dt.timezone.utc) if epoch else _dt.datetime.now(_dt.timezone.utc)
    info = {
        "name": "tsct",
        "version": args.version,
        "abi_version": args.abi_version,
        "library": "libtsct_kernels.so",
        "built_at": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "nvcc_version": args.nvcc_version,
        "gencodes": gencodes,
        "kernels": {g: sorted(kernels[g]) for g in gencodes},
    }
    if args.triton_aot:
        aot = json.load(open(args.triton_aot))
        info["triton_aot"] = {
            "dir": "tsct/_aot",
            "triton_version": aot["triton_version"],
            "archs": {a: {k: v[k] for k in ("variants", "kernels", "proxy") if k in v}
                      for a, v in sorted(aot["archs"].items())},
        }
        proxies = sorted(a for a, v in aot["archs"].items() if v.get("proxy"))
        if proxies:  # a development build (docs/decisions/0016): said at the top, so nobody ships it as a release
            info["proxy_build"] = (f"NOT A RELEASE: Triton AOT arch {', '.join(proxies)} is a proxy "
                                   f"({'; '.join(aot['archs'][a]['proxy']['note'] for a in proxies)})")
    if args.cutedsl:
        idxs = [json.load(open(p)) for p in args.cutedsl]
        if len({json.dumps(i["dsl"], sort_keys=True) for i in idxs}) != 1:
            raise SystemExit(f"gen_build_info: the CuTeDSL indexes disagree on the DSL: {[i['dsl'] for i in idxs]}")
        info["cutedsl"] = {
            "linked": True,
            "dsl": idxs[0]["dsl"],
            "arch": idxs[0]["arch"],
            "archs": [i["arch"] for i in idxs],
            "required_sass": "OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X",
            "kernels": [{"name": k["name"], "arch": k.get("arch", i["arch"]), "entry": k["entry"], "params": k["params"],
                         "threads": k["threads"]} for i in idxs for k in i["kernels"]],
        }
    for kv in args.extra:
        k, _, v = kv.partition("=")
        info[k] = v
    text = json.dumps(info, indent=2) + "\n"

    def write_if_changed(path: str, content: str) -> None:
        if os.path.exists(path) and open(path).read() == content:
            return
        with open(path, "w") as f:
            f.write(content)

    write_if_changed(args.json, text)
    write_if_changed(
        args.cpp,
        "// Generated by csrc/tools/gen_build_info.py: the text of manifest.json. Do not edit.\n"
        "namespace tsct {\nextern const char kBuildInfoJson[];\nconst char kBuildInfoJson[] =\n"
        + c_string(text) + ";\n}  // namespace tsct\n",
    )
    print(f"gen_build_info: {len(gencodes)} targets, {len(set().union(*kernels.values()))} kernels -> {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
