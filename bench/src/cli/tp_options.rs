//! The tp test's options: the MLP shapes and token layouts, and their parsers.

use serde::Serialize;

/// The Llama MLP shapes that --tp-shapes knows by name: (name, hidden, ffn).
pub const TP_NAMED_SHAPES: [(&str, usize, usize); 2] = [("8b", 4096, 14336), ("70b", 8192, 28672)];

/// One MLP shape of the tp test.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TpShape {
    /// `8b`, `70b`, or `HIDDENxFFN`.
    pub name: String,
    pub hidden: usize,
    pub ffn: usize,
}

/// How the tp test's MLP holds its tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum TpLayout {
    /// Every PE has every token (`TpMlp`: the down projection all-reduces).
    Replicated,
    /// Each PE has an equal share of the tokens on the way in and out (`SequenceParallelMlp`:
    /// an all-gather before the gate/up GEMM, a reduce-scatter after the down GEMM).
    Sequence,
}

impl TpLayout {
    pub const ALL: [TpLayout; 2] = [TpLayout::Replicated, TpLayout::Sequence];

    pub fn name(self) -> &'static str {
        match self {
            TpLayout::Replicated => "replicated",
            TpLayout::Sequence => "sequence",
        }
    }

    /// The report's variant of `shape` in this layout: its name, `-sp` after it in sequence
    /// parallelism.
    pub fn variant(self, shape: &str) -> String {
        match self {
            TpLayout::Replicated => shape.into(),
            TpLayout::Sequence => format!("{shape}-sp"),
        }
    }
}

/// Parse --tp-layouts: names of [`TpLayout`]s, comma separated; one given twice counts once.
pub fn parse_tp_layouts(text: &str) -> Result<Vec<TpLayout>, String> {
    let mut layouts = Vec::new();
    for t in text.split(',').map(str::trim) {
        let layout = TpLayout::ALL
            .into_iter()
            .find(|l| l.name() == t.to_ascii_lowercase())
            .ok_or_else(|| format!("--tp-layouts: `{t}` is not a layout (replicated, sequence)"))?;
        if !layouts.contains(&layout) {
            layouts.push(layout);
        }
    }
    Ok(layouts)
}

/// Parse --tp-shapes: names of [`TP_NAMED_SHAPES`] and `HIDDEN,FFN` pairs, comma separated
/// (`8b,70b`, `4096,14336`, `70b,1024,4096`); a shape given twice counts once.
pub fn parse_tp_shapes(text: &str) -> Result<Vec<TpShape>, String> {
    let mut shapes: Vec<TpShape> = Vec::new();
    let mut tokens = text.split(',').map(str::trim);
    while let Some(token) = tokens.next() {
        let lower = token.to_ascii_lowercase();
        let shape = match TP_NAMED_SHAPES.iter().find(|(name, _, _)| *name == lower) {
            Some(&(name, hidden, ffn)) => TpShape {
                name: name.into(),
                hidden,
                ffn,
            },
            None => {
                let number = |t: &str| -> Result<usize, String> {
                    match t.parse::<usize>() {
                        Ok(v) if v > 0 => Ok(v),
                        _ => Err(format!(
                            "--tp-shapes: `{t}` is neither a shape name (8b, 70b) nor a positive \
                             number of features (HIDDEN,FFN)"
                        )),
                    }
                };
                let hidden = number(token)?;
                let ffn = number(tokens.next().ok_or_else(|| {
                    format!("--tp-shapes: hidden size {hidden} needs its FFN size after it (HIDDEN,FFN)")
                })?)?;
                TpShape {
                    name: format!("{hidden}x{ffn}"),
                    hidden,
                    ffn,
                }
            }
        };
        if !shapes
            .iter()
            .any(|s| (s.hidden, s.ffn) == (shape.hidden, shape.ffn))
        {
            shapes.push(shape);
        }
    }
    Ok(shapes)
}
