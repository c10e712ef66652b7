//! Message sizes: `4K`-style sizes parsed, nccl-tests' size lists, sizes for people.

pub(super) const KIB: usize = 1 << 10;
pub(super) const MIB: usize = 1 << 20;

/// Parse a size: a number with an optional K/M/G/T suffix (powers of 1024), optionally
/// followed by `B` or `iB` (`64`, `4K`, `1MiB`, `256M`, `2G`).
pub fn parse_size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let value: usize = digits
        .parse()
        .map_err(|_| format!("`{text}` is not a size (examples: 8, 4K, 1M, 256MiB)"))?;
    let unit = unit.trim().to_ascii_uppercase();
    let unit = unit
        .strip_suffix("IB")
        .or_else(|| unit.strip_suffix('B'))
        .unwrap_or(&unit);
    let shift = match unit {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(format!("`{text}`: unknown size unit (use K, M, G or T)")),
    };
    value
        .checked_mul(1usize << shift)
        .ok_or_else(|| format!("`{text}` is too large"))
}

/// `min, min*factor, ...` up to and including `max` (as nccl-tests' -b/-e/-f).
pub fn size_list(min: usize, max: usize, factor: usize) -> Result<Vec<usize>, String> {
    if min == 0 {
        return Err("--min-bytes must be at least 1".into());
    }
    if min > max {
        return Err(format!(
            "--min-bytes {min} is larger than --max-bytes {max}"
        ));
    }
    if factor < 2 {
        return Err("--step-factor must be at least 2".into());
    }
    let mut v = Vec::new();
    let mut s = min;
    while s <= max {
        v.push(s);
        match s.checked_mul(factor) {
            Some(n) => s = n,
            None => break,
        }
    }
    Ok(v)
}

/// A size for people: `8 B`, `4 KiB`, `1.5 MiB`.
pub fn format_size(bytes: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut unit = 0;
    let mut value = bytes as f64;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value.fract() == 0.0 {
        format!("{} {}", value as u64, UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("2GB"), Ok(2 << 30));
        assert_eq!(parse_size(" 16 KiB "), Ok(16 << 10));
        assert!(parse_size("").is_err());
        assert!(parse_size("1.5M").is_err());
        assert!(parse_size("12X").is_err());
        assert!(parse_size("99999999999999999999T").is_err());
    }

    #[test]
    fn size_lists_follow_nccl_tests() {
        assert_eq!(size_list(8, 64, 2).unwrap(), vec![8, 16, 32, 64]);
        assert_eq!(size_list(8, 100, 2).unwrap(), vec![8, 16, 32, 64]);
        assert_eq!(size_list(8, 8, 2).unwrap(), vec![8]);
        let full = size_list(8, 256 << 20, 2).unwrap();
        assert_eq!(full.len(), 26);
        assert_eq!(*full.last().unwrap(), 256 << 20);
        assert!(size_list(16, 8, 2).is_err());
        assert!(size_list(0, 8, 2).is_err());
        assert!(size_list(8, 64, 1).is_err());
    }

    #[test]
    fn sizes_print_for_people() {
        assert_eq!(format_size(8), "8 B");
        assert_eq!(format_size(4096), "4 KiB");
        assert_eq!(format_size(3 << 19), "1.5 MiB");
        assert_eq!(format_size(256 << 20), "256 MiB");
    }
}
