//! Progress: an indicatif bar on a terminal, plain periodic lines otherwise, and one place to
//! print lines (violations, notes) that does not tear the bar.

use std::io::IsTerminal as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::args::Progress;

/// Where lines go: above the bar when there is one, else stderr.
#[derive(Debug, Clone)]
pub struct Out {
    bar: Option<ProgressBar>,
    plain: bool,
}

/// What the bar counts: seconds of a timed run, or ops of a counted one.
#[derive(Debug, Clone, Copy)]
pub enum Goal {
    Seconds(u64),
    Ops(u64),
}

impl Out {
    pub fn new(p: Progress, goal: Goal) -> Out {
        let tty = std::io::stderr().is_terminal();
        let bar = matches!(p, Progress::Bar) || (matches!(p, Progress::Auto) && tty);
        if !bar {
            return Out {
                bar: None,
                plain: !matches!(p, Progress::None),
            };
        }
        let (len, unit) = match goal {
            Goal::Seconds(s) => (s, "s"),
            Goal::Ops(n) => (n, " ops"),
        };
        let style = ProgressStyle::with_template(&format!(
            "{{spinner}} [{{elapsed_precise}}] [{{bar:30}}] {{pos}}/{{len}}{unit} {{msg}}"
        ))
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
        let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr())
            .with_style(style);
        Out {
            bar: Some(pb),
            plain: false,
        }
    }

    /// Only lines, no periodic progress.
    pub fn quiet() -> Out {
        Out {
            bar: None,
            plain: false,
        }
    }

    /// Prints a line (above the bar, if any).
    pub fn line(&self, s: &str) {
        match &self.bar {
            Some(b) => b.println(s),
            None => eprintln!("{s}"),
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// A thread that refreshes the bar (every 200 ms) or prints a plain line (every `every`).
#[derive(Debug)]
pub struct Ticker {
    stop: Arc<AtomicBool>,
    join: Option<JoinHandle<()>>,
}

impl Ticker {
    /// `status` returns the bar's position, a short status (for the bar) and a full one (for
    /// plain lines).
    pub fn start(
        out: &Out,
        every: Duration,
        status: impl Fn() -> (u64, String, String) + Send + 'static,
    ) -> Ticker {
        let stop = Arc::new(AtomicBool::new(false));
        let out = out.clone();
        let s = stop.clone();
        let join = std::thread::Builder::new()
            .name("loadgen-progress".into())
            .spawn(move || {
                let mut last = Instant::now();
                while !s.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(200));
                    if let Some(b) = &out.bar {
                        let (pos, msg, _) = status();
                        b.set_position(pos);
                        b.set_message(msg);
                    } else if out.plain && last.elapsed() >= every {
                        last = Instant::now();
                        let (_, _, msg) = status();
                        out.line(&format!("loadgen: {msg}"));
                    }
                }
            })
            .ok();
        Ticker { stop, join }
    }

    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}
