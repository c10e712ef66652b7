//! How a tensor-parallel layer cuts a full weight: which part each PE holds, and the host
//! copies that take it out of the full matrix. Pure functions, checked on the CPU.

use std::ops::Range;

/// The part of `total` features that PE `pe` of `n_pes` holds: `[total·pe/n, total·(pe+1)/n)`.
/// The parts cover `0..total` in PE order and differ in size by at most one.
///
/// ```
/// use nvshmem::tp::shard_range;
/// assert_eq!(shard_range(14336, 1, 2), 7168..14336);
/// assert_eq!(shard_range(10, 2, 4), 5..7);
/// ```
pub fn shard_range(total: usize, pe: usize, n_pes: usize) -> Range<usize> {
    assert!(pe < n_pes, "PE {pe} of {n_pes}");
    total * pe / n_pes..total * (pe + 1) / n_pes
}

/// Rows `rows` of a row-major matrix with `cols` columns.
pub fn take_rows<T: Copy>(matrix: &[T], cols: usize, rows: Range<usize>) -> Vec<T> {
    matrix[rows.start * cols..rows.end * cols].to_vec()
}

/// Columns `keep` of every row of a row-major matrix with `cols` columns.
pub fn take_cols<T: Copy>(matrix: &[T], cols: usize, keep: Range<usize>) -> Vec<T> {
    if cols == 0 {
        return Vec::new();
    }
    matrix
        .chunks_exact(cols)
        .flat_map(|row| row[keep.clone()].iter().copied())
        .collect()
}

/// This PE's rows of a weight whose rows are `parts` stacked matrices (a merged
/// column-parallel layer: gate and up projections as one GEMM), each part sharded alike: the
/// local weight is this PE's rows of the first part, then of the second, and so on.
pub fn merged_rows<T: Copy>(
    matrix: &[T],
    cols: usize,
    parts: &[usize],
    pe: usize,
    n_pes: usize,
) -> Vec<T> {
    let mut out = Vec::new();
    let mut first = 0;
    for &rows in parts {
        let r = shard_range(rows, pe, n_pes);
        out.extend(take_rows(matrix, cols, first + r.start..first + r.end));
        first += rows;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_every_feature_once_in_pe_order() {
        for total in [0, 1, 3, 127, 4096, 14336] {
            for n in 1..=8 {
                let mut next = 0;
                for pe in 0..n {
                    let r = shard_range(total, pe, n);
                    assert_eq!(r.start, next);
                    assert!(r.len() == total / n || r.len() == total / n + 1);
                    next = r.end;
                }
                assert_eq!(next, total);
            }
        }
    }

    #[test]
    fn rows_and_columns_come_out_of_a_row_major_matrix() {
        // 3 × 4: element (r, c) = 10 r + c.
        let m: Vec<u32> = (0..3)
            .flat_map(|r| (0..4).map(move |c| 10 * r + c))
            .collect();
        assert_eq!(take_rows(&m, 4, 1..3), [10, 11, 12, 13, 20, 21, 22, 23]);
        assert_eq!(take_cols(&m, 4, 1..3), [1, 2, 11, 12, 21, 22]);
        assert!(take_cols(&m, 4, 2..2).is_empty());
    }

    #[test]
    fn merged_parts_are_sharded_alike() {
        // Two parts of 4 rows (gate: 0..4, up: 4..8), one column; PE 1 of 2 holds rows 2..4
        // of each.
        let m: Vec<u32> = (0..8).collect();
        assert_eq!(merged_rows(&m, 1, &[4, 4], 1, 2), [2, 3, 6, 7]);
        assert_eq!(merged_rows(&m, 1, &[4, 4], 0, 1), m);
        // Uneven parts: 3 rows over 2 PEs is 1 + 2.
        let m: Vec<u32> = (0..6).collect();
        assert_eq!(merged_rows(&m, 1, &[3, 3], 0, 2), [0, 3]);
        assert_eq!(merged_rows(&m, 1, &[3, 3], 1, 2), [1, 2, 4, 5]);
    }
}
