//! What rank 0 shows: an in-place progress bar on stderr, one summary line
//! per epoch on stdout, and optional JSON lines for tools and tests.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// One epoch's results (global: over every rank's shard).
#[derive(Clone, Debug, PartialEq)]
pub struct EpochStats {
    /// 1-based epoch number.
    pub epoch: usize,
    /// Mean training loss over the epoch's steps (as they were computed,
    /// before each step's update).
    pub train_loss: f64,
    /// Training accuracy over the epoch's steps.
    pub train_acc: f64,
    /// Loss on the held-out split after the epoch.
    pub test_loss: f64,
    /// Accuracy on the held-out split after the epoch.
    pub test_acc: f64,
    /// Wall time of the epoch's training steps.
    pub secs: f64,
    /// Global training samples per second.
    pub samples_per_s: f64,
    /// Gradient buckets all-reduced, and how many were already done when
    /// backward ended (their communication fully overlapped).
    pub buckets: (usize, usize),
    /// Time blocked waiting for all-reduces (communication not hidden).
    pub wait_secs: f64,
}

fn json_num(v: f64) -> String {
    if v.is_finite() {
        format!("{v:?}")
    } else {
        "null".into()
    }
}

impl EpochStats {
    /// One JSON object (full precision: `{:?}` round-trips an `f64`).
    pub fn to_json(&self, world: usize) -> String {
        format!(
            "{{\"epoch\":{},\"world_size\":{world},\"train_loss\":{},\"train_acc\":{},\"test_loss\":{},\"test_acc\":{},\"epoch_secs\":{},\"samples_per_s\":{},\"buckets\":{},\"overlapped\":{},\"wait_secs\":{}}}",
            self.epoch,
            json_num(self.train_loss),
            json_num(self.train_acc),
            json_num(self.test_loss),
            json_num(self.test_acc),
            json_num(self.secs),
            json_num(self.samples_per_s),
            self.buckets.0,
            self.buckets.1,
            json_num(self.wait_secs),
        )
    }

    /// The human summary line.
    pub fn line(&self, epochs: usize) -> String {
        format!(
            "epoch {:>w$}/{epochs}  loss {:.4}  train acc {:.3}  test loss {:.4}  test acc {:.3}  {:>9.0} samples/s  {:.1} ms/epoch  (comm wait {:.1} ms, {}/{} buckets done early)",
            self.epoch,
            self.train_loss,
            self.train_acc,
            self.test_loss,
            self.test_acc,
            self.samples_per_s,
            self.secs * 1e3,
            self.wait_secs * 1e3,
            self.buckets.1,
            self.buckets.0,
            w = epochs.to_string().len(),
        )
    }
}

/// An in-place (`\r`) progress bar.
#[derive(Debug)]
pub struct Bar {
    on: bool,
    last: Option<Instant>,
}

const WIDTH: usize = 30;

impl Bar {
    /// A bar that draws when `on` (`None`: when stderr is a terminal).
    pub fn new(on: Option<bool>) -> Bar {
        Bar {
            on: on.unwrap_or_else(|| std::io::stderr().is_terminal()),
            last: None,
        }
    }

    /// Redraws (at most every 50 ms, and always for the last step).
    pub fn draw(&mut self, epoch: usize, epochs: usize, step: usize, steps: usize, loss: f64) {
        if !self.on
            || (step < steps
                && self
                    .last
                    .is_some_and(|t| t.elapsed() < Duration::from_millis(50)))
        {
            return;
        }
        self.last = Some(Instant::now());
        let done = WIDTH * step / steps.max(1);
        let bar = format!("{}{}", "=".repeat(done), " ".repeat(WIDTH - done));
        let mut e = std::io::stderr().lock();
        let _ = write!(
            e,
            "\repoch {epoch}/{epochs} [{bar}] {step}/{steps} steps  loss {loss:.4}"
        );
        let _ = e.flush();
    }

    /// Clears the bar's line before a summary line is printed.
    pub fn clear(&mut self) {
        if self.on {
            let _ = write!(std::io::stderr().lock(), "\r\x1b[2K");
        }
    }
}
