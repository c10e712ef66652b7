//! Command line: options, their defaults (full and `--quick`), and message sizes.

mod args;
mod config;
mod help;
mod sizes;
#[cfg(test)]
mod tests;
mod tp_options;

pub use args::{Args, DType, Impl, Mode};
pub use config::Config;
pub use sizes::format_size;
pub use tp_options::{TpLayout, TpShape};
