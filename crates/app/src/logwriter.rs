//! The server's log writer: lines gathered in memory and written to stderr
//! by a thread of their own, a burst at a time.
//!
//! Writing each request's line with its own `write` was a third of the
//! line's cost (issue 31's profiles). tracing-appender's non-blocking
//! writer was tried first: its worker waits for the next line in
//! crossbeam's backoff, which spins on `sched_yield` (7,497 calls in 8 s of
//! new charges under strace, more CPU than the batching saved). Here a
//! line is appended to a buffer under a mutex; the first line into an
//! empty buffer wakes the writer, which lets [`GATHER`] pass, then writes
//! everything gathered with one `write`. Idle, the thread sleeps on a
//! condition variable and costs nothing.
//!
//! Until the server says it is serving ([`Batched::begin`]) each line is
//! written as it is logged: start-up lines are all on stderr by then.
//!
//! Nothing is dropped: past [`MOST`] bytes waiting, the logging thread
//! writes the buffer itself (back-pressure). What a user gives up: a line
//! reaches stderr up to [`GATHER`] after its event, and the lines gathered
//! when the process is killed (`SIGKILL`, an abort) are lost; a normal or
//! error exit, and `SIGTERM`, write them all ([`Batched::finish`]).

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// How long the writer lets lines gather after the first one wakes it.
pub const GATHER: Duration = Duration::from_millis(2);

/// Bytes waiting past which the logging thread writes them itself.
pub const MOST: usize = 4 << 20;

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    /// Off until [`Batched::begin`]: lines are written as they are logged.
    batching: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    lines: Vec<u8>,
    stopping: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The writer's thread; [`Batched::finish`] writes what is left and stops it.
#[derive(Debug)]
pub struct Batched {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// What the subscriber writes each line to (`MakeWriter`).
#[derive(Debug, Clone)]
pub struct Lines(Arc<Shared>);

impl Batched {
    /// Starts the writer's thread over `out` (stderr for the server).
    pub fn start(mut out: impl Write + Send + 'static) -> std::io::Result<(Self, Lines)> {
        let shared = Arc::new(Shared::default());
        let theirs = shared.clone();
        let thread = std::thread::Builder::new()
            .name("payments-log".into())
            .spawn(move || {
                loop {
                    let mut state = theirs.lock();
                    while state.lines.is_empty() && !state.stopping {
                        state = theirs.wake.wait(state).unwrap_or_else(|p| p.into_inner());
                    }
                    let stopping = state.stopping;
                    drop(state);
                    if !stopping {
                        std::thread::sleep(GATHER);
                    }
                    let lines = std::mem::take(&mut theirs.lock().lines);
                    // Nowhere to report a failed write of the log itself.
                    let _ = out.write_all(&lines).and_then(|()| out.flush());
                    if stopping && theirs.lock().lines.is_empty() {
                        return;
                    }
                }
            })?;
        let lines = Lines(shared.clone());
        Ok((
            Self {
                shared,
                thread: Some(thread),
            },
            lines,
        ))
    }

    /// Lines are gathered from now on; until now each was written as it
    /// was logged, so that what a process says while it starts is on
    /// stderr when it says it is serving.
    pub fn begin(&self) {
        self.shared.batching.store(true, Ordering::Release);
    }

    /// Writes every line gathered and stops the thread; lines logged
    /// afterwards are written by the logging thread itself.
    pub fn finish(mut self) {
        self.shared.lock().stopping = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Write for Lines {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if !self.0.batching.load(Ordering::Acquire) {
            return std::io::stderr().write(bytes);
        }
        let mut state = self.0.lock();
        if state.stopping {
            drop(state);
            return std::io::stderr().write(bytes);
        }
        let first = state.lines.is_empty();
        state.lines.extend_from_slice(bytes);
        if state.lines.len() > MOST {
            // The writer is behind: this thread writes, and waits for it.
            let lines = std::mem::take(&mut state.lines);
            let mut stderr = std::io::stderr().lock();
            drop(state);
            stderr.write_all(&lines)?;
        } else if first {
            self.0.wake.notify_one();
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Lines {
    type Writer = Lines;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `Write` the test can read back.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Every line from many threads arrives whole, once, and the ones still
    /// gathered at `finish` are written before it returns.
    #[test]
    fn every_line_is_written_once_and_finish_writes_the_rest() {
        let sink = Sink::default();
        let (batched, lines) = Batched::start(sink.clone()).expect("starts");
        batched.begin();
        let writers: Vec<_> = (0..4)
            .map(|t| {
                let mut lines = lines.clone();
                std::thread::spawn(move || {
                    for i in 0..2500 {
                        lines
                            .write_all(format!("thread {t} line {i}\n").as_bytes())
                            .expect("written");
                    }
                })
            })
            .collect();
        for writer in writers {
            writer.join().expect("joined");
        }
        batched.finish();
        let written = String::from_utf8(sink.0.lock().expect("lock").clone()).expect("utf-8");
        let mut got: Vec<&str> = written.lines().collect();
        got.sort_unstable();
        let mut want: Vec<String> = (0..4)
            .flat_map(|t| (0..2500).map(move |i| format!("thread {t} line {i}")))
            .collect();
        want.sort_unstable();
        assert_eq!(got, want);
    }
}
