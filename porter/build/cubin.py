"""Resource figures read from a compiled cubin itself, so they do not depend on what a given
NVRTC build prints with `--ptxas-options=-v` (NVRTC 13.0 on the H200's image prints nothing
that parse_resources can read, and every trial recorded 0 registers there).

A cubin is an ELF64 file. For an entry function `k`:
- `.nv.info`: per-function attributes as (symbol index, value), among them the register count
  (EIATTR_REGCOUNT) and the stack frame (EIATTR_FRAME_SIZE); older cubins keep the register
  count in the top byte of `.text.k`'s `sh_info` instead;
- `.nv.shared.k`: its static shared memory (the section's size; NOBITS);
- `.nv.constant0.k`: its parameter bank (the size of the constant bank it uses);
- `.nv.info.k`: the function's own attributes (parameters, barriers, ...).

Spill counts are not in the cubin: where the log has none, the stack frame (local memory the
function uses, spills included) stands in for them.

Only what is read here is trusted; a cubin that does not parse gives None and the caller keeps
the compiler log's figures.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

_EIATTR_FRAME_SIZE = 0x11
_EIATTR_MIN_STACK_SIZE = 0x12
_EIATTR_MAX_STACK_SIZE = 0x23
_EIATTR_REGCOUNT = 0x2F
_RESERVED_SMEM = 1024
_FMT_SIZES = {0x01: 0, 0x02: 1, 0x03: 2}      # EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL; 0x04: SVAL


@dataclass(frozen=True)
class CubinResources:
    registers: int
    smem_static: int
    stack_frame: int
    cmem: int


def _sections(data: bytes) -> dict[str, tuple[int, int, int, int]]:
    """Section name -> (offset, size, sh_info, sh_type)."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a little-endian ELF64 file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    str_off, str_size = heads[shstrndx][4], heads[shstrndx][5]
    names = data[str_off:str_off + str_size]
    out = {}
    for name_off, sh_type, _flags, _addr, off, size, _link, info, _align, _ent in heads:
        end = names.find(b"\0", name_off)
        out[names[name_off:end].decode(errors="replace")] = (off, size, info, sh_type)
    return out


def _symbol_index(data: bytes, secs, name: str) -> int | None:
    sym = secs.get(".symtab")
    strtab = secs.get(".strtab")
    if sym is None or strtab is None:
        return None
    names = data[strtab[0]:strtab[0] + strtab[1]]
    for k in range(sym[1] // 24):
        st_name, = struct.unpack_from("<I", data, sym[0] + 24 * k)
        end = names.find(b"\0", st_name)
        if names[st_name:end] == name.encode():
            return k
    return None


def _attributes(blob: bytes, symbol: int | None = None) -> dict[int, int]:
    """EIATTR records -> value. Per-function records (symbol index, value) count only for
    `symbol` (the global .nv.info holds every function's); plain values always count."""
    attrs: dict[int, int] = {}
    i = 0
    while i + 2 <= len(blob):
        fmt, attr = blob[i], blob[i + 1]
        if fmt == 0x04:                          # EIFMT_SVAL: u16 size, then that many bytes
            size, = struct.unpack_from("<H", blob, i + 2)
            value = blob[i + 4:i + 4 + size]
            if len(value) == 8:
                sym, v = struct.unpack_from("<II", value)
                if symbol is None or sym == symbol:
                    attrs.setdefault(attr, v)
            i += 4 + size
        elif fmt in _FMT_SIZES:
            n = _FMT_SIZES[fmt]
            if n:
                attrs.setdefault(attr, int.from_bytes(blob[i + 2:i + 2 + n], "little"))
            i += 2 + n
        else:
            break
    return attrs


def read_resources(cubin: bytes, kernel: str) -> CubinResources | None:
    """The named entry function's registers, static shared memory, stack frame and parameter
    bank, from the cubin; None when the cubin has no such function or does not parse."""
    try:
        secs = _sections(cubin)
        text = secs.get(f".text.{kernel}")
        if text is None:
            return None
        symbol = _symbol_index(cubin, secs, kernel)
        attrs: dict[int, int] = {}
        for name, sym in ((".nv.info", symbol), (f".nv.info.{kernel}", None)):
            sec = secs.get(name)
            if sec is not None:
                for k, v in _attributes(cubin[sec[0]:sec[0] + sec[1]], sym).items():
                    attrs.setdefault(k, v)
    except (ValueError, struct.error, IndexError):
        return None
    shared = secs.get(f".nv.shared.{kernel}")
    const0 = secs.get(f".nv.constant0.{kernel}")
    smem = shared[1] if shared else 0
    if ".nv.shared.reserved.0" in secs:
        # sm_90 and later: the section also counts the 1 KiB the system reserves per block,
        # which the opt-in limit (arch_smem_per_block) already leaves out
        smem = max(0, smem - _RESERVED_SMEM)
    # older cubins keep the register count in the top byte of the code section's sh_info
    registers = attrs.get(_EIATTR_REGCOUNT) or (text[2] >> 24) & 0xFF
    return CubinResources(registers=registers, smem_static=smem,
                          stack_frame=attrs.get(_EIATTR_FRAME_SIZE, 0),
                          cmem=const0[1] if const0 else 0)
