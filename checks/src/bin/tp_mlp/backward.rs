//! The backward pass: a Llama MLP's gradients (the row-parallel down projection's, SiLU · up's
//! and the column-parallel gate and up projection's, whose input gradient is all-reduced)
//! and the RMSNorm's, against f64 CPU references that round where the GPU rounds.

use nvshmem::bf16;
use nvshmem::tp::{merged_rows, shard_range, take_cols, MlpShape, TpMlp};

use crate::harness::{sync, text, Checks, Outcome};
use crate::mlp::{mlp_data, MlpData};
use crate::reference::{compare_with, matmul, Rng};

fn f64s(v: &[bf16]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

fn rounded(v: &[f64]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f64(x)).collect()
}

/// `aᵀ`, for a row-major `rows × cols` matrix.
fn transpose(a: &[bf16], rows: usize, cols: usize) -> Vec<bf16> {
    (0..cols * rows)
        .map(|e| a[(e % rows) * cols + e / rows])
        .collect()
}

/// `dgate, dup` of `a = silu(gate) · up` for the output gradient `da`, in f64.
fn silu_mul_grad(g: f64, u: f64, da: f64) -> (f64, f64) {
    let s = 1.0 / (1.0 + (-g).exp());
    (da * u * s * (1.0 + g * (1.0 - s)), da * g * s)
}

/// The MLP's backward pass on `m` tokens of `hidden` (FFN `ffn`): every gradient checked
/// against the reference within the program's tolerance (2^-7 of magnitude plus RMS, and of
/// the largest term where a sum of rounded parts is compared), `dx` the same on every PE.
fn mlp_backward(c: &Checks, seed: u64, (m, hidden, ffn): (usize, usize, usize)) -> Outcome {
    let (me, n) = (c.me(), c.n());
    let MlpData { x, gate, up, down } = mlp_data(seed, m, hidden, ffn);
    let dy = Rng::new(seed ^ 0xD7).bf16s(m * hidden, 1.0);
    let shape = MlpShape {
        hidden,
        ffn,
        max_tokens: m,
    };
    let mlp = TpMlp::new(&c.tp, shape).map_err(text)?;
    mlp.load_weights(&gate, &up, &down).map_err(text)?;
    let f = shard_range(ffn, me, n);
    let (fl, s) = (f.len(), &c.stream);
    let alloc = |len| c.shmem.alloc_device::<bf16>(len).map_err(text);
    let (gu, act, da, dgu) = (
        alloc(m * 2 * fl)?,
        alloc(m * fl)?,
        alloc(m * fl)?,
        alloc(m * 2 * fl)?,
    );
    let (dw_down, dw_gu) = (alloc(hidden * fl)?, alloc(2 * fl * hidden)?);
    let (xs, dyd) = (c.symmetric(&x)?, c.device(&dy)?);
    let dx = c.shmem.malloc::<bf16>(m * hidden).map_err(text)?;
    mlp.gate_up().forward(&gu, &xs, s).map_err(text)?;
    c.tp.silu_mul(&act, &gu, m, s).map_err(text)?;
    let (down_layer, gate_up) = (mlp.down(), mlp.gate_up());
    down_layer.input_grad(&da, &dyd, s).map_err(text)?;
    down_layer
        .weight_grad(&dw_down, &dyd, &act, s)
        .map_err(text)?;
    c.tp.silu_mul_backward(&dgu, &da, &gu, m, s).map_err(text)?;
    gate_up.input_grad(&dx, &dgu, s).map_err(text)?;
    gate_up.weight_grad(&dw_gu, &dgu, &xs, s).map_err(text)?;
    sync(s).map_err(text)?;

    // The reference, rounding where the GPU rounds: g, u, act, da, dgate, dup.
    let g = rounded(&matmul(&x, &gate, m, ffn, hidden));
    let u = rounded(&matmul(&x, &up, m, ffn, hidden));
    let act_ref: Vec<bf16> = (0..m * ffn)
        .map(|i| {
            let (g, u) = (g[i].to_f64(), u[i].to_f64());
            bf16::from_f64(g / (1.0 + (-g).exp()) * u)
        })
        .collect();
    let da_ref = matmul(&dy, &transpose(&down, hidden, ffn), m, ffn, hidden);
    let da_b = rounded(&da_ref);
    let (mut dg, mut du) = (vec![0.0; m * ffn], vec![0.0; m * ffn]);
    for i in 0..m * ffn {
        let (a, b) = silu_mul_grad(g[i].to_f64(), u[i].to_f64(), da_b[i].to_f64());
        (dg[i], du[i]) = (a, b);
    }
    let (dg, du) = (rounded(&dg), rounded(&du));
    // dx: each PE's partial product (its FFN shard) rounded, then summed; the largest part.
    let (mut dx_ref, mut largest) = (vec![0.0; m * hidden], vec![0.0f64; m * hidden]);
    for pe in 0..n {
        let r = shard_range(ffn, pe, n);
        let part = |d: &[bf16], w: &[bf16]| {
            let wt = transpose(&w[r.start * hidden..r.end * hidden], r.len(), hidden);
            matmul(&take_cols(d, ffn, r.clone()), &wt, m, hidden, r.len())
        };
        let (pg, pu) = (part(&dg, &gate), part(&du, &up));
        for i in 0..m * hidden {
            let p = pg[i] + pu[i];
            dx_ref[i] += bf16::from_f64(p).to_f64();
            largest[i] = largest[i].max(p.abs());
        }
    }
    let tol = 1.0 / 128.0;
    compare_with(
        "the input gradient dx",
        &dx.to_vec().map_err(text)?,
        &dx_ref,
        &largest,
        tol,
    )?;
    c.identical("the input gradient dx", &dx.to_vec().map_err(text)?)?;
    // This PE's weight gradients: dyᵀ · act for its FFN columns of the down projection, and
    // [dgate | dup]ᵀ · x for its rows of the gate and up projections.
    let dw_down_ref = matmul(
        &transpose(&dy, m, hidden),
        &transpose(&take_cols(&act_ref, ffn, f.clone()), m, fl),
        hidden,
        fl,
        m,
    );
    let got = dw_down.to_vec().map_err(text)?;
    compare_with("the down projection's dw", &got, &dw_down_ref, &[], tol)?;
    let full_dg = matmul(
        &transpose(&dg, m, ffn),
        &transpose(&x, m, hidden),
        ffn,
        hidden,
        m,
    );
    let full_du = matmul(
        &transpose(&du, m, ffn),
        &transpose(&x, m, hidden),
        ffn,
        hidden,
        m,
    );
    let both: Vec<bf16> = rounded(&[full_dg, full_du].concat());
    let want: Vec<f64> = f64s(&merged_rows(&both, hidden, &[ffn, ffn], me, n));
    let got = dw_gu.to_vec().map_err(text)?;
    compare_with("the gate and up projections' dw", &got, &want, &[], tol)?;
    // The activations the forward pass kept, as a sanity check of the inputs above.
    let got = act.to_vec().map_err(text)?;
    let act_mine = f64s(&take_cols(&act_ref, ffn, f));
    compare_with("SiLU(gate) · up", &got, &act_mine, &[], tol)
}

/// `dres = dres_in + ` the RMSNorm's gradient for `dout`, `rows × hidden`.
fn rmsnorm_backward(c: &Checks, seed: u64, (rows, hidden): (usize, usize)) -> Outcome {
    let mut rng = Rng::new(seed);
    let (r, dout, dres) = (
        rng.bf16s(rows * hidden, 2.0),
        rng.bf16s(rows * hidden, 1.0),
        rng.bf16s(rows * hidden, 1.0),
    );
    let w = rng.bf16s(hidden, 1.5);
    let eps = 1e-5;
    let (rd, dd, wd, acc) = (
        c.device(&r)?,
        c.device(&dout)?,
        c.device(&w)?,
        c.device(&dres)?,
    );
    c.tp.rmsnorm_backward(&acc, &dd, &rd, &wd, eps, &c.stream)
        .map_err(text)?;
    sync(&c.stream).map_err(text)?;
    let (mut want, mut terms) = (Vec::new(), Vec::new());
    for row in 0..rows {
        let at = |v: &[bf16], j: usize| v[row * hidden + j].to_f64();
        let sq: f64 = (0..hidden).map(|j| at(&r, j).powi(2)).sum();
        let scale = 1.0 / (sq / hidden as f64 + eps as f64).sqrt();
        let dot: f64 = (0..hidden)
            .map(|j| at(&dout, j) * w[j].to_f64() * at(&r, j))
            .sum();
        let k = scale.powi(3) / hidden as f64 * dot;
        for (j, wj) in w.iter().enumerate() {
            let (a, b) = (scale * wj.to_f64() * at(&dout, j), at(&r, j) * k);
            want.push(at(&dres, j) + a - b);
            terms.push(a.abs().max(b.abs()));
        }
    }
    let got = acc.to_vec().map_err(text)?;
    compare_with("the residual's gradient", &got, &want, &terms, 1.0 / 128.0)
}

pub fn run(c: &mut Checks) {
    let n = c.n();
    for (m, hidden, ffn) in [(1, 64, 96), (7, 136, 40 * n), (64, 256, 512 + 8 * n)] {
        c.run(
            format!("TpMlp backward m={m} hidden={hidden} ffn={ffn} against the CPU"),
            |c, seed| mlp_backward(c, seed, (m, hidden, ffn)),
        );
    }
    for (rows, hidden) in [(1, 64), (5, 1000), (33, 4096)] {
        c.run(
            format!("rmsnorm_backward {rows} x {hidden} against the CPU"),
            |c, seed| rmsnorm_backward(c, seed, (rows, hidden)),
        );
    }
}
