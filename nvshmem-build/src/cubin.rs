//! A small reader for the symbol table of a cubin (a CUDA ELF image), enough to check what a
//! built kernel file holds: its entry points, and whether NVSHMEM's device library was linked
//! in (`nvshmemi_device_state_d`, the device state that `nvshmemx_cumodule_init` fills).
//!
//! ```no_run
//! let bytes = std::fs::read("ring.sm_90.linked.cubin").unwrap();
//! let cubin = nvshmem_build::Cubin::parse(&bytes).unwrap();
//! assert!(cubin.entry_points().any(|k| k == "ring_allgather"));
//! assert!(cubin.links_nvshmem());
//! ```

use crate::Error;

/// The symbol NVSHMEM's device library defines for its device-side state. A cubin that
/// defines it was linked with `libnvshmem_device.a` and must be registered with
/// `nvshmemx_cumodule_init` (the `nvshmem` crate's `Module` does this) before it runs.
pub const DEVICE_STATE_SYMBOL: &str = "nvshmemi_device_state_d";

/// `st_other` bit that marks a kernel entry point in CUDA ELF files.
const STO_CUDA_ENTRY: u8 = 0x10;
const SHT_SYMTAB: u32 = 2;

/// What a symbol names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SymbolKind {
    /// Code: a kernel or a device function.
    Function,
    /// Data: a `__device__` or `__constant__` variable.
    Object,
    /// Sections, files and the rest.
    Other,
}

/// One entry of a cubin's symbol table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Symbol {
    /// The symbol's name.
    pub name: String,
    /// What it names.
    pub kind: SymbolKind,
    /// Defined in this image (not an undefined reference left for a later link).
    pub defined: bool,
    /// Global or weak (visible to the CUDA driver by name).
    pub global: bool,
    /// A kernel entry point (`extern "C" __global__` functions have their plain name).
    pub entry: bool,
}

/// The symbols of a cubin.
#[derive(Debug, Clone)]
pub struct Cubin {
    symbols: Vec<Symbol>,
    machine: u16,
}

impl Cubin {
    /// Read the symbol table of a 64-bit little-endian ELF image (every cubin since CUDA 3).
    pub fn parse(bytes: &[u8]) -> Result<Cubin, Error> {
        let bad = |why: &str| Error::Invalid(format!("not a cubin: {why}"));
        if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" {
            return Err(bad("no ELF header"));
        }
        if bytes[4] != 2 || bytes[5] != 1 {
            return Err(bad("not a 64-bit little-endian ELF file"));
        }
        let machine = read_u16(bytes, 0x12).ok_or_else(|| bad("truncated header"))?;
        let shoff = read_u64(bytes, 0x28).ok_or_else(|| bad("truncated header"))? as usize;
        let shentsize = read_u16(bytes, 0x3a).ok_or_else(|| bad("truncated header"))? as usize;
        let shnum = read_u16(bytes, 0x3c).ok_or_else(|| bad("truncated header"))? as usize;
        if shentsize < 64 {
            return Err(bad("section headers too small"));
        }
        let section = |i: usize| -> Result<Section, Error> {
            let base = i
                .checked_mul(shentsize)
                .and_then(|o| o.checked_add(shoff))
                .ok_or_else(|| bad("section table out of range"))?;
            let field32 =
                |o| read_u32(bytes, base + o).ok_or_else(|| bad("section table out of range"));
            let field64 =
                |o| read_u64(bytes, base + o).ok_or_else(|| bad("section table out of range"));
            Ok(Section {
                kind: field32(4)?,
                offset: field64(24)? as usize,
                size: field64(32)? as usize,
                link: field32(40)? as usize,
                entsize: field64(56)? as usize,
            })
        };
        let mut symbols = Vec::new();
        for i in 0..shnum {
            let symtab = section(i)?;
            if symtab.kind != SHT_SYMTAB {
                continue;
            }
            if symtab.link >= shnum {
                return Err(bad("symbol table names no string table"));
            }
            let strtab = section(symtab.link)?;
            let strings = slice(bytes, strtab.offset, strtab.size)
                .ok_or_else(|| bad("string table out of range"))?;
            let entries = slice(bytes, symtab.offset, symtab.size)
                .ok_or_else(|| bad("symbol table out of range"))?;
            let entsize = if symtab.entsize == 0 {
                24
            } else {
                symtab.entsize
            };
            if entsize < 24 {
                return Err(bad("symbol entries too small"));
            }
            // Entry 0 is the null symbol.
            for entry in entries.chunks_exact(entsize).skip(1) {
                let name_at = read_u32(entry, 0).unwrap_or(0) as usize;
                let info = entry[4];
                let other = entry[5];
                let shndx = read_u16(entry, 6).unwrap_or(0);
                let name = strings
                    .get(name_at..)
                    .and_then(|s| s.split(|&b| b == 0).next())
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .ok_or_else(|| bad("symbol name out of range"))?;
                let kind = match info & 0xf {
                    1 => SymbolKind::Object,
                    2 => SymbolKind::Function,
                    _ => SymbolKind::Other,
                };
                symbols.push(Symbol {
                    name,
                    kind,
                    defined: shndx != 0,
                    global: matches!(info >> 4, 1 | 2),
                    entry: kind == SymbolKind::Function && other & STO_CUDA_ENTRY != 0,
                });
            }
        }
        Ok(Cubin { symbols, machine })
    }

    /// Every symbol, in table order.
    pub fn symbols(&self) -> &[Symbol] {
        &self.symbols
    }

    /// Whether the image is for an NVIDIA GPU (`EM_CUDA`).
    pub fn is_cuda(&self) -> bool {
        self.machine == 190
    }

    /// The names of the kernels the CUDA driver can launch from this image.
    pub fn entry_points(&self) -> impl Iterator<Item = &str> {
        self.symbols
            .iter()
            .filter(|s| s.entry && s.defined)
            .map(|s| s.name.as_str())
    }

    /// Whether the image defines a symbol of this name.
    pub fn defines(&self, name: &str) -> bool {
        self.symbols.iter().any(|s| s.defined && s.name == name)
    }

    /// Whether the image refers to a symbol of this name without defining it.
    pub fn needs(&self, name: &str) -> bool {
        self.symbols.iter().any(|s| !s.defined && s.name == name)
    }

    /// Whether NVSHMEM's device library is linked in ([`DEVICE_STATE_SYMBOL`] is defined).
    pub fn links_nvshmem(&self) -> bool {
        self.defines(DEVICE_STATE_SYMBOL)
    }
}

struct Section {
    kind: u32,
    offset: usize,
    size: usize,
    link: usize,
    entsize: usize,
}

fn slice(bytes: &[u8], offset: usize, len: usize) -> Option<&[u8]> {
    bytes.get(offset..offset.checked_add(len)?)
}

fn read_u16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(slice(bytes, at, 2)?.try_into().ok()?))
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(slice(bytes, at, 4)?.try_into().ok()?))
}

fn read_u64(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(slice(bytes, at, 8)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 image: null section, .strtab, .symtab with one entry kernel `k`, one
    /// defined object and one undefined function.
    fn tiny_elf() -> Vec<u8> {
        let strtab = b"\0k\0state\0vprintf\0".to_vec();
        let mut symtab = vec![0u8; 24];
        let sym = |name: u32, info: u8, other: u8, shndx: u16| {
            let mut e = vec![0u8; 24];
            e[..4].copy_from_slice(&name.to_le_bytes());
            e[4] = info;
            e[5] = other;
            e[6..8].copy_from_slice(&shndx.to_le_bytes());
            e
        };
        symtab.extend(sym(1, 0x12, 0x10, 1)); // GLOBAL FUNC, entry
        symtab.extend(sym(3, 0x11, 0, 1)); // GLOBAL OBJECT
        symtab.extend(sym(9, 0x12, 0, 0)); // GLOBAL FUNC, undefined
        let strtab_off = 64;
        let symtab_off = strtab_off + strtab.len();
        let shoff = symtab_off + symtab.len();
        let mut out = vec![0u8; 64];
        out[..4].copy_from_slice(b"\x7fELF");
        out[4] = 2;
        out[5] = 1;
        out[0x12..0x14].copy_from_slice(&190u16.to_le_bytes());
        out[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        out[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        out[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        out.extend(&strtab);
        out.extend(&symtab);
        let header = |kind: u32, off: usize, size: usize, link: u32, entsize: u64| {
            let mut h = vec![0u8; 64];
            h[4..8].copy_from_slice(&kind.to_le_bytes());
            h[24..32].copy_from_slice(&(off as u64).to_le_bytes());
            h[32..40].copy_from_slice(&(size as u64).to_le_bytes());
            h[40..44].copy_from_slice(&link.to_le_bytes());
            h[56..64].copy_from_slice(&entsize.to_le_bytes());
            h
        };
        out.extend(header(0, 0, 0, 0, 0));
        out.extend(header(3, strtab_off, strtab.len(), 0, 0));
        out.extend(header(SHT_SYMTAB, symtab_off, symtab.len(), 1, 24));
        out
    }

    #[test]
    fn reads_entries_objects_and_undefined_symbols() {
        let c = Cubin::parse(&tiny_elf()).unwrap();
        assert!(c.is_cuda());
        assert_eq!(c.entry_points().collect::<Vec<_>>(), vec!["k"]);
        assert!(c.defines("state") && !c.defines("vprintf") && c.needs("vprintf"));
        assert_eq!(c.symbols()[1].kind, SymbolKind::Object);
        assert!(!c.links_nvshmem());
    }

    #[test]
    fn refuses_truncated_and_foreign_images() {
        let elf = tiny_elf();
        for cut in [0, 10, 63, 100, elf.len() - 1] {
            assert!(Cubin::parse(&elf[..cut]).is_err(), "accepted {cut} bytes");
        }
        let mut big_endian = elf.clone();
        big_endian[5] = 2;
        assert!(Cubin::parse(&big_endian).is_err());
        assert!(
            Cubin::parse(b"not an ELF file at all, just some text of some length.........")
                .is_err()
        );
    }
}
