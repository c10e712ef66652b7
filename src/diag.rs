//! What the library says on its own, outside any call's `Result`: a leak in a `Drop`, a
//! finalize that cannot agree, a start that gives up. Lines go through the `log` crate
//! (target `nvshmem`) when the program has a logger that takes them, and to stderr when it
//! has none, so that they are never lost; each names the PE, since every PE of a job writes
//! to the same terminal.

use log::Level;
use std::fmt::Arguments;

/// `message` from PE `pe` (`None` before the PE is known) at `level`.
pub(crate) fn say(level: Level, pe: Option<usize>, message: Arguments<'_>) {
    let line = line(pe, message);
    if level <= log::max_level() {
        log::log!(target: "nvshmem", level, "{line}");
    } else {
        eprintln!("nvshmem: {line}");
    }
}

/// The text of a line: the PE first.
fn line(pe: Option<usize>, message: Arguments<'_>) -> String {
    match pe {
        Some(pe) => format!("PE {pe}: {message}"),
        None => message.to_string(),
    }
}

/// `warn_pe!(pe, "format", args..)`: a warning from PE `pe` (an `Option<usize>`).
macro_rules! warn_pe {
    ($pe:expr, $($arg:tt)+) => {
        $crate::diag::say(log::Level::Warn, $pe, format_args!($($arg)+))
    };
}

/// `error_pe!(pe, "format", args..)`: an error from PE `pe` that no `Result` can carry.
macro_rules! error_pe {
    ($pe:expr, $($arg:tt)+) => {
        $crate::diag::say(log::Level::Error, $pe, format_args!($($arg)+))
    };
}

pub(crate) use {error_pe, warn_pe};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_name_the_pe() {
        assert_eq!(
            line(Some(3), format_args!("leaking {}", 2)),
            "PE 3: leaking 2"
        );
        assert_eq!(line(None, format_args!("no PE yet")), "no PE yet");
    }
}
