//! The watchdog: what every thread is doing, and the end of the process on a hang.

use crate::common::{lock, OP_LIMIT};
use crate::tally::Tally;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a thread is doing, since when, and how long it may take.
struct Row {
    who: String,
    what: String,
    since: Instant,
    /// `None` while the thread is idle.
    limit: Option<Duration>,
}

/// What every thread of this PE is doing, for the watchdog.
pub(crate) struct Board {
    rows: Vec<Mutex<Row>>,
}

impl Board {
    pub(crate) fn new(rows: usize) -> Self {
        let idle = || {
            Mutex::new(Row {
                who: String::new(),
                what: "idle".into(),
                since: Instant::now(),
                limit: None,
            })
        };
        Board {
            rows: (0..rows).map(|_| idle()).collect(),
        }
    }

    pub(crate) fn claim(&self, row: usize, who: &str) {
        lock(&self.rows[row]).who = who.to_string();
        self.set(row, "starting".into());
    }

    /// Row `row` starts `what`, which may last `OP_LIMIT`.
    pub(crate) fn set(&self, row: usize, what: String) {
        self.set_for(row, what, OP_LIMIT);
    }

    pub(crate) fn set_for(&self, row: usize, what: String, limit: Duration) {
        let mut r = lock(&self.rows[row]);
        r.what = what;
        r.since = Instant::now();
        r.limit = Some(limit);
    }

    pub(crate) fn idle(&self, row: usize) {
        let mut r = lock(&self.rows[row]);
        r.what = "finished".into();
        r.limit = None;
    }

    /// A row past its limit: who, doing what, for how long.
    fn stuck(&self) -> Option<(String, String, Duration)> {
        self.rows.iter().find_map(|r| {
            let r = lock(r);
            let lasted = r.since.elapsed();
            (r.limit.is_some_and(|l| lasted > l)).then(|| (r.who.clone(), r.what.clone(), lasted))
        })
    }

    fn print(&self, me: usize) {
        for r in &self.rows {
            let r = lock(r);
            let state = match r.limit {
                Some(_) => format!("{:.1} s in", r.since.elapsed().as_secs_f64()),
                None => "idle after".into(),
            };
            eprintln!("[PE {me}]   {:<8} {state} `{}`", r.who, r.what);
        }
    }
}

/// Watch `board` on a thread of its own: an operation past its limit ends the process.
pub(crate) fn start_watchdog(board: Arc<Board>, tally: Arc<Tally>, me: usize) {
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(250));
        let Some((who, what, lasted)) = board.stuck() else {
            continue;
        };
        eprintln!(
            "[PE {me}] {who} has been in `{what}` for {:.0} s: taken for a hang. This PE's threads:",
            lasted.as_secs_f64()
        );
        board.print(me);
        let (passed, failed) = tally.sums();
        eprintln!(
            "[PE {me}] before it: {passed} passed, {failed} failed here; exiting with status 1"
        );
        exit_now(1);
    });
}

/// End the process at once: exit handlers would tear CUDA and NVSHMEM down under threads
/// that still use them.
fn exit_now(status: i32) -> ! {
    extern "C" {
        fn _exit(status: i32) -> !;
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: _exit ends the process without running anything of it.
    unsafe { _exit(status) }
}
