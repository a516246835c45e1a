//! Progress of a long run (`shmfab compare`, `shmfab bench`) on one line of
//! stderr, redrawn at each step: `[5/28 0:42] shmfab, 64 KiB`. Shown only
//! when stderr is a terminal, so scripts that read stdout (or capture
//! stderr) see nothing of it.
//!
//! ```
//! use shmfab_tools::status::Status;
//! let mut s = Status::hidden(3);
//! s.step("shmfab, 8 B");
//! assert!(s.line("shmfab, 8 B").starts_with("[1/3 0:00] shmfab, 8 B"));
//! s.finish();
//! ```

use std::io::{IsTerminal, Write};
use std::time::Instant;

/// A progress line on stderr.
#[derive(Debug)]
pub struct Status {
    /// Whether anything is drawn (stderr is a terminal).
    on: bool,
    /// Steps in the whole run.
    total: usize,
    /// Steps begun so far, `0 ..= total` (more if the estimate was short).
    done: usize,
    t0: Instant,
    /// Whether a line is on the screen now (to be erased before output).
    shown: bool,
}

impl Status {
    /// A run of `total` steps, drawn when stderr is a terminal.
    pub fn new(total: usize) -> Status {
        Status { on: std::io::stderr().is_terminal(), total, done: 0, t0: Instant::now(), shown: false }
    }

    /// A run of `total` steps that draws nothing.
    pub fn hidden(total: usize) -> Status {
        Status { on: false, ..Status::new(total) }
    }

    /// The line step `done` of the run shows for `what`.
    pub fn line(&self, what: &str) -> String {
        let s = self.t0.elapsed().as_secs();
        format!("[{}/{} {}:{:02}] {what}", self.done, self.total.max(self.done), s / 60, s % 60)
    }

    /// Begins the next step, `what`.
    pub fn step(&mut self, what: &str) {
        self.done += 1;
        if self.on {
            let mut e = std::io::stderr().lock();
            let _ = write!(e, "\r\x1b[2K{}", self.line(what));
            let _ = e.flush();
            self.shown = true;
        }
    }

    /// Erases the line (before other output, and at the end).
    pub fn clear(&mut self) {
        if self.shown {
            let mut e = std::io::stderr().lock();
            let _ = write!(e, "\r\x1b[2K");
            let _ = e.flush();
            self.shown = false;
        }
    }

    /// Prints a line on stdout, under the progress line.
    pub fn say(&mut self, line: &str) {
        self.clear();
        println!("{line}");
    }

    /// Prints a line on stderr, under the progress line.
    pub fn warn(&mut self, line: &str) {
        self.clear();
        eprintln!("{line}");
    }

    /// Ends the run: erases the line.
    pub fn finish(&mut self) {
        self.clear();
    }
}

impl Drop for Status {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_steps_and_never_shows_a_total_below_the_count() {
        let mut s = Status::hidden(2);
        s.step("a");
        assert!(s.line("a").starts_with("[1/2 "), "{}", s.line("a"));
        s.step("b");
        s.step("c");
        assert!(s.line("c").starts_with("[3/3 "), "{}", s.line("c"));
        assert!(!s.shown, "hidden: nothing drawn");
    }
}
