//! The command line: the run's length, threads and seed, and what narrows a failure down.

use crate::roles::{Role, MIN_THREADS};
use clap::{ArgAction, Parser};

/// A threaded stress check: every type used from many threads of every PE at once, every
/// result checked.
#[derive(Parser)]
#[command(name = "stress_check", args_override_self = true)]
pub(crate) struct Args {
    /// Seconds of the run, after a warm-up of a fifth of that (1 to 5 s).
    #[arg(long, value_name = "S", default_value_t = 20.0, value_parser = parse_seconds)]
    seconds: f64,
    /// Threads per PE, at least 8 (one per role); more add mixers and collective threads.
    #[arg(long, value_name = "T", default_value_t = MIN_THREADS, value_parser = parse_threads)]
    threads: usize,
    /// The run's seed, the same on every PE.
    #[arg(long, value_name = "N", default_value_t = 0x5EED)]
    seed: u64,
    /// Roles whose threads do nothing, comma-separated (alloc, coll, send, recv, ping, pong, mix, tp).
    #[arg(long, value_name = "ROLES")]
    skip: Option<String>,
    /// Launch the shared collectives cooperatively.
    #[arg(long, value_name = "BOOL", default_value_t = false, action = ArgAction::Set)]
    cooperative: bool,
    /// Let the shared collectives use programmatic stream serialization.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = ArgAction::Set)]
    programmatic: bool,
    /// The most blocks a call of the shared collectives launches (`CollectivesConfig::max_blocks`),
    /// or `all` (one per SM). The docs ask for a cap beside channels: uncapped, a PE's call
    /// may find no SM free while the peer's channel kernels wait for it.
    #[arg(long, value_name = "N|all", default_value = "32", value_parser = parse_max_blocks)]
    max_blocks: MaxBlocks,
}

/// `--max-blocks`: a cap, or none.
#[derive(Clone, Copy)]
struct MaxBlocks(Option<u32>);

/// `--max-blocks`: a positive number, or `all` for none.
fn parse_max_blocks(value: &str) -> Result<MaxBlocks, String> {
    match value {
        "all" => Ok(MaxBlocks(None)),
        v => match v.parse::<u32>() {
            Ok(n) if n > 0 => Ok(MaxBlocks(Some(n))),
            _ => Err("not a valid value: a positive number of blocks, or `all`".into()),
        },
    }
}

/// `--seconds`: a positive, finite number.
fn parse_seconds(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(s) if s > 0.0 && s.is_finite() => Ok(s),
        _ => Err("not a valid value: a positive number of seconds".into()),
    }
}

/// `--threads`: at least one per role.
fn parse_threads(value: &str) -> Result<usize, String> {
    let threads: usize = value.parse().map_err(|_| "not a valid value".to_string())?;
    if threads < MIN_THREADS {
        return Err(format!("at least {MIN_THREADS}, one per role"));
    }
    Ok(threads)
}

impl Args {
    /// The run's config; what narrows a failure down goes to `NARROWING`.
    pub(crate) fn into_config(self) -> Config {
        let _ = NARROWING.set(self.narrowing());
        Config {
            seconds: self.seconds,
            threads: self.threads,
            seed: self.seed,
        }
    }

    fn narrowing(&self) -> Narrowing {
        Narrowing {
            skip: match &self.skip {
                Some(value) => value.split(',').map(str::to_string).collect(),
                None => Vec::new(),
            },
            cooperative: self.cooperative,
            programmatic: self.programmatic,
            max_blocks: self.max_blocks.0.map(|b| b as usize),
        }
    }
}

pub(crate) struct Config {
    pub(crate) seconds: f64,
    pub(crate) threads: usize,
    pub(crate) seed: u64,
}

/// What `--skip`, `--cooperative`, `--programmatic` and `--max-blocks` ask for, to narrow a
/// failure down: roles (by name without the number: alloc, coll, send, recv, ping, pong, mix, tp)
/// whose threads do nothing, and how the shared `Collectives` launches.
pub(crate) struct Narrowing {
    skip: Vec<String>,
    pub(crate) cooperative: bool,
    pub(crate) programmatic: bool,
    pub(crate) max_blocks: Option<usize>,
}

pub(crate) static NARROWING: std::sync::OnceLock<Narrowing> = std::sync::OnceLock::new();

pub(crate) fn skipped(role: Role) -> bool {
    let name = role.name();
    let base = name.split('-').next().unwrap_or(&name);
    NARROWING
        .get()
        .is_some_and(|n| n.skip.iter().any(|s| s == base))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("stress_check").chain(args.iter().copied()))
    }

    #[test]
    fn defaults() {
        let a = parse(&[]).unwrap();
        assert_eq!((a.seconds, a.threads, a.seed), (20.0, MIN_THREADS, 0x5EED));
        let n = a.narrowing();
        assert!(n.skip.is_empty());
        assert!(!n.cooperative);
        assert!(n.programmatic);
        assert_eq!(n.max_blocks, Some(32));
    }

    #[test]
    fn every_option() {
        let a = parse(&[
            "--seconds",
            "2.5",
            "--threads",
            "11",
            "--seed",
            "7",
            "--skip",
            "send,recv",
            "--cooperative",
            "true",
            "--programmatic",
            "false",
            "--max-blocks",
            "all",
        ])
        .unwrap();
        assert_eq!((a.seconds, a.threads, a.seed), (2.5, 11, 7));
        let n = a.narrowing();
        assert_eq!(n.skip, ["send", "recv"]);
        assert!(n.cooperative);
        assert!(!n.programmatic);
        assert_eq!(n.max_blocks, None);
        assert_eq!(
            parse(&["--max-blocks", "16"])
                .unwrap()
                .narrowing()
                .max_blocks,
            Some(16)
        );
    }

    #[test]
    fn the_last_of_a_repeated_option_counts() {
        let a = parse(&[
            "--seed", "1", "--seed", "2", "--skip", "alloc", "--skip", "mix",
        ])
        .unwrap();
        assert_eq!(a.seed, 2);
        assert_eq!(a.narrowing().skip, ["mix"]);
    }

    #[test]
    fn bad_values_are_refused() {
        for args in [
            &["--seconds", "0"][..],
            &["--seconds", "inf"],
            &["--seconds", "NaN"],
            &["--seconds", "soon"],
            &["--threads", "7"],
            &["--threads", "many"],
            &["--seed", "-1"],
            &["--cooperative", "yes"],
            &["--programmatic", "1"],
            &["--max-blocks", "0"],
            &["--max-blocks", "none"],
            &["--seconds"],
            &["--unknown", "1"],
            &["stray"],
        ] {
            assert!(parse(args).is_err(), "{args:?} was accepted");
        }
    }

    #[test]
    fn help_exits_0() {
        let e = parse(&["--help"]).err().expect("--help stops the parse");
        assert_eq!(e.kind(), ErrorKind::DisplayHelp);
        assert_eq!(e.exit_code(), 0);
    }
}
