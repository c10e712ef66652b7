//! Which NVSHMEM release each part of an install is, read from the files themselves: the
//! headers' version macros, the host library's `nvshmemi_host_lib_version`, and the device
//! library's `nvshmemi_device_lib_version` (the value its init code hands the host library,
//! which refuses any other release at run time).

use super::Version;
use crate::Error;
use object::read::archive::ArchiveFile;
use object::{Object, ObjectSection, ObjectSymbol, ReadCache, ReadRef};
use std::fs::File;
use std::path::Path;

/// The host library's own release: `{major, minor, patch}` as three `int`s.
const HOST_SYMBOL: &str = "nvshmemi_host_lib_version";
/// What the host library prints at start-up (`NVSHMEM v3.4.5`), for a library whose symbol
/// table was stripped.
const HOST_BANNER: &[u8] = b"NVSHMEM v";
/// `static const nvshmemi_version_t nvshmemi_device_lib_version` in the device library's
/// host-side init object (C++ mangling of a file-local name).
const DEVICE_SYMBOL: &str = "_ZL27nvshmemi_device_lib_version";

/// The release of an NVSHMEM host library (`libnvshmem_host.so.3`), or `None` when the file
/// says nothing we can read.
pub(crate) fn host_library_release(path: &Path) -> Result<Option<Version>, Error> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let cache = ReadCache::new(File::open(path).map_err(io)?);
    let Ok(file) = object::File::parse(&cache) else {
        return Ok(None);
    };
    if let Some(v) = symbol_version(&file, HOST_SYMBOL) {
        return Ok(Some(v));
    }
    let banner = file
        .section_by_name(".rodata")
        .and_then(|s| s.data().ok())
        .and_then(banner_version);
    Ok(banner)
}

/// The release of an NVSHMEM device library (`libnvshmem_device.a`), or `None` when no
/// member of the archive carries its version.
pub(crate) fn device_library_release(path: &Path) -> Result<Option<Version>, Error> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let cache = ReadCache::new(File::open(path).map_err(io)?);
    let Ok(archive) = ArchiveFile::parse(&cache) else {
        return Ok(None);
    };
    for member in archive.members() {
        let Ok(member) = member else { break };
        let Ok(data) = member.data(&cache) else {
            continue;
        };
        if let Ok(object) = object::File::parse(data) {
            if let Some(v) = symbol_version(&object, DEVICE_SYMBOL) {
                return Ok(Some(v));
            }
        }
    }
    Ok(None)
}

/// The three `int`s a 12-byte data symbol holds.
fn symbol_version<'data, R: ReadRef<'data>>(
    file: &object::File<'data, R>,
    name: &str,
) -> Option<Version> {
    let symbol = file
        .symbols()
        .find(|s| s.size() == 12 && s.name() == Ok(name))?;
    let section = file.section_by_index(symbol.section_index()?).ok()?;
    let bytes = section.data_range(symbol.address(), 12).ok()??;
    let int = |i: usize| {
        let b: [u8; 4] = bytes[4 * i..4 * i + 4].try_into().ok()?;
        let v = if file.is_little_endian() {
            i32::from_le_bytes(b)
        } else {
            i32::from_be_bytes(b)
        };
        u32::try_from(v).ok()
    };
    Some(Version {
        major: int(0)?,
        minor: int(1)?,
        patch: int(2)?,
    })
}

/// `3.4.5` from the first `NVSHMEM v3.4.5` in `data`.
fn banner_version(data: &[u8]) -> Option<Version> {
    let mut rest = data;
    while let Some(at) = find(rest, HOST_BANNER) {
        let after = &rest[at + HOST_BANNER.len()..];
        let len = after
            .iter()
            .take_while(|b| b.is_ascii_digit() || **b == b'.')
            .count();
        let text = std::str::from_utf8(&after[..len]).ok()?;
        if text.split('.').filter(|p| !p.is_empty()).count() == 3 {
            if let Ok(v) = text.parse() {
                return Some(v);
            }
        }
        rest = after;
    }
    None
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_banner_gives_the_release() {
        let v = banner_version(b"\0x NVSHMEM vX\0NVSHMEM v3.8.0\0NVSHMEM v9").unwrap();
        assert_eq!(v.to_string(), "3.8.0");
        assert!(banner_version(b"NVSHMEM v3.8\0").is_none());
        assert!(banner_version(b"nothing here").is_none());
    }
}
