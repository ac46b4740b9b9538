//! The ledger file: the sandbox's charges, refunds, captures, disputes and
//! stored idempotent answers, kept across restarts (`--ledger PATH` / `SANDBOX_LEDGER`, and
//! `make run`'s in-process sandbox). Without one the sandbox keeps them in
//! memory only, as tests want.
//!
//! # Format
//!
//! JSON Lines, one change a line, so a change costs one short append, not a
//! rewrite of everything: the first line names the format and its version,
//! `{"payments_sandbox_ledger":{"version":3}}`; then `charge` (Stripe's
//! charge object, its creation in milliseconds, a hold's deadline
//! `capture_deadline` in Unix seconds, shown to clients or not, and its
//! idempotency key), `capture` (a hold captured: `charge`, `amount`,
//! `idempotency_key`, `created`), `refund` (the refund object; of a hold
//! not captured, its release), `settled` (a pending refund's final status,
//! or a succeeded refund failing later), `dispute` (Stripe's dispute object
//! as opened), `dispute_update` (the dispute as it stands after a change)
//! and `key` (an idempotency key, scoped by the SHA-256 of its API key, its
//! parameters' fingerprint, when it was first used, and the status and body
//! of the answer stored under it). A charge's captured and refunded amounts
//! are not stored: they are rebuilt from its captures and refunds. A hold's
//! lapse is not written either: it follows from its deadline.
//!
//! Version 1, written before holds, has no `capture` lines and no
//! `capture_deadline`: it is read as it is (every charge captured when
//! made) and rewritten as the current version, which an older sandbox
//! refuses by its version. Version 2, written before disputes, has no
//! dispute lines and never fails a succeeded refund: it reads as it is.
//! Version 3 adds both (and `disputed` on charges, rebuilt from the
//! dispute lines like the amounts).
//!
//! # When it is written
//!
//! Each line is written (appended, under the lock of what it changes, so the
//! file keeps their order) before the change is made in memory and before
//! its request is answered: an answer the sandbox sent is in the file, and a
//! write the file refuses leaves nothing changed (a charge or refund is then
//! answered 500; an answer stored under a key is still replayed by this
//! process, and the error logged). The file is not fsynced per line: it survives the process
//! being killed at any point, not a power cut. A charge (or refund) and the
//! answer stored under its key are two lines, written one after the other:
//! a process killed between the two leaves the charge with its key unknown,
//! as if the request had never been answered.
//!
//! # Crashes and damage
//!
//! At start the file is read whole and rewritten compacted (the current
//! state, one line per charge, capture, refund, dispute and answered key),
//! through a
//! temporary file that is fsynced and renamed over it, so the rewrite is all
//! or nothing. A last line without its newline is what a process killed
//! while appending leaves: it is dropped with a warning (its request was
//! never answered). Anything else that does not read back (a damaged line,
//! a refund, capture or dispute of an unknown charge, a capture the charge
//! could not have taken, a second dispute of a charge, a change of a
//! closed dispute, another format or a newer version) refuses
//! to start, naming the file and the line: move the file away or delete it
//! to start with an empty ledger. The file is locked while a sandbox uses
//! it; a second one on the same file refuses to start.
//!
//! `POST /_sandbox/reset` replaces the file with an empty ledger. The
//! fault-injection config, the request counters and the request log are
//! not kept: they start afresh with each process.

use std::borrow::Cow;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use axum::body::Bytes;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use crate::config::RefundStatus;
use crate::disputes::Dispute;
use crate::idempotency::{Entries, Entry, ScopedKey};
use crate::ledger::{Books, Capture, Charge, Refund};
use crate::params::Fingerprint;
use crate::response::StoredResponse;

/// The version of the format this sandbox writes (2: holds and captures;
/// 3: disputes, and succeeded refunds failing later).
const VERSION: u32 = 3;

/// The oldest version it reads (1: before holds).
const OLDEST_VERSION: u32 = 1;

/// What to do about a file that does not read back.
const RESET_HINT: &str = "move the file away or delete it to start with an empty ledger \
                          (the sandbox then forgets every charge, refund, capture and \
                          idempotency key it held)";

/// One line, as written.
#[derive(Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Line<'a> {
    /// The first line: what the file is.
    PaymentsSandboxLedger { version: u32 },
    Charge {
        charge: &'a Charge,
        created_ms: u64,
        /// A hold's deadline (Unix seconds); absent for any other charge.
        #[serde(skip_serializing_if = "Option::is_none")]
        capture_deadline: Option<u64>,
        idempotency_key: Option<&'a str>,
    },
    /// A hold captured.
    Capture(&'a Capture),
    Refund {
        refund: &'a Refund,
        idempotency_key: Option<&'a str>,
    },
    /// A pending refund settled, or a succeeded one failed.
    Settled {
        refund: &'a str,
        status: RefundStatus,
        failure_reason: Option<&'a str>,
    },
    /// A dispute opened (compacted: as it stands).
    Dispute(&'a Dispute),
    /// A dispute as it stands after a change.
    DisputeUpdate(&'a Dispute),
    /// An answer stored under an idempotency key.
    Key {
        /// SHA-256 of the API key, hex.
        account: String,
        key: &'a str,
        /// SHA-256 of the parameters, hex.
        fingerprint: String,
        first_used_ms: u64,
        status: u16,
        /// The answer's JSON body, as text.
        body: Cow<'a, str>,
    },
}

impl<'a> Line<'a> {
    pub(crate) fn key(
        key: &'a ScopedKey,
        fingerprint: &Fingerprint,
        first_used_ms: u64,
        response: &'a StoredResponse,
    ) -> Self {
        Line::Key {
            account: hex(&key.account),
            key: &key.key,
            fingerprint: hex(&fingerprint.0),
            first_used_ms,
            status: response.status.as_u16(),
            // The sandbox's answers are JSON it serialised: UTF-8.
            body: String::from_utf8_lossy(&response.body),
        }
    }
}

/// One line, as read: [`Line`]'s owned twin.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum ReadLine {
    PaymentsSandboxLedger {
        version: u32,
    },
    Charge {
        charge: Charge,
        created_ms: u64,
        /// Absent: not a hold (and every charge of a version 1 file).
        #[serde(default)]
        capture_deadline: Option<u64>,
        idempotency_key: Option<String>,
    },
    Capture(Capture),
    Refund {
        refund: Refund,
        idempotency_key: Option<String>,
    },
    Settled {
        refund: String,
        status: RefundStatus,
        failure_reason: Option<String>,
    },
    Dispute(Dispute),
    DisputeUpdate(Dispute),
    Key {
        account: String,
        key: String,
        fingerprint: String,
        first_used_ms: u64,
        status: u16,
        body: String,
    },
}

/// A ledger file, read and locked, ready to serve from
/// ([`crate::serve_with_ledger`], [`crate::SandboxHandle::start_with_ledger`]).
pub struct LedgerFile {
    pub(crate) journal: Arc<Journal>,
    pub(crate) books: Books,
    pub(crate) keys: Entries,
}

impl fmt::Debug for LedgerFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (charges, refunds, captures) = self.books.counts();
        f.debug_struct("LedgerFile")
            .field("path", &self.journal.path)
            .field("charges", &charges)
            .field("refunds", &refunds)
            .field("captures", &captures)
            .field("disputes", &self.books.dispute_count())
            .field("keys", &self.keys.len())
            .finish()
    }
}

impl LedgerFile {
    /// Opens the ledger at `path`, creating it (and its directory) if
    /// missing, and locks it; reads it back and rewrites it compacted.
    /// Fails, naming the file, if it cannot be read or written, if another
    /// sandbox has it, or if it is not a ledger this sandbox wrote.
    pub fn open(path: impl Into<PathBuf>) -> Result<LedgerFile, LedgerFileError> {
        let path = path.into();
        let fail = |problem: String| LedgerFileError {
            path: path.clone(),
            problem,
        };
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|error| fail(format!("cannot create its directory: {error}")))?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|error| fail(format!("cannot open it: {error}")))?;
        lock(&file).map_err(|error| fail(error.to_string()))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(|error| fail(format!("cannot read it: {error}")))?;
        let read = parse(&bytes).map_err(|problem| fail(format!("{problem}; {RESET_HINT}")))?;
        if read.torn > 0 {
            tracing::warn!(
                path = %path.display(),
                bytes = read.torn,
                "the ledger file's last line was only partly written (the sandbox stopped \
                 while writing it, before answering its request): dropped"
            );
        }
        let lines = read
            .books
            .lines()
            .chain(read.keys.iter().filter_map(|(key, entry)| entry.line(key)));
        let appender =
            rewrite(&path, lines).map_err(|error| fail(format!("cannot rewrite it: {error}")))?;
        // The rewritten file is locked; the old one can go.
        drop(file);
        let (charges, refunds, captures) = read.books.counts();
        tracing::info!(
            path = %path.display(),
            charges,
            refunds,
            captures,
            disputes = read.books.dispute_count(),
            keys = read.keys.len(),
            "sandbox ledger loaded"
        );
        Ok(LedgerFile {
            journal: Arc::new(Journal {
                path,
                appender: Mutex::new(Some(appender)),
            }),
            books: read.books,
            keys: read.keys,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.journal.path
    }
}

/// Why a ledger file cannot be used; names the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerFileError {
    path: PathBuf,
    problem: String,
}

impl LedgerFileError {
    /// The ledger file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl fmt::Display for LedgerFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "sandbox ledger file {}: {}",
            self.path.display(),
            self.problem
        )
    }
}

impl std::error::Error for LedgerFileError {}

/// What a file held.
#[derive(Debug, Default)]
struct Contents {
    books: Books,
    keys: Entries,
    /// Bytes of a last line without its newline, dropped.
    torn: usize,
}

/// Reads a whole file back; an empty one is a new ledger.
fn parse(bytes: &[u8]) -> Result<Contents, String> {
    let mut read = Contents::default();
    if bytes.is_empty() {
        return Ok(read);
    }
    let complete = match bytes.iter().rposition(|byte| *byte == b'\n') {
        Some(end) => &bytes[..end],
        None => return Err("it holds no complete line".to_owned()),
    };
    read.torn = bytes.len() - complete.len() - 1;
    for (index, text) in complete.split(|byte| *byte == b'\n').enumerate() {
        let number = index + 1;
        let line: ReadLine = serde_json::from_slice(text).map_err(|error| {
            // serde_json counts lines within this one line: say the column.
            let message = error.to_string();
            let message = message
                .rsplit_once(" at line ")
                .map_or(&*message, |(m, _)| m);
            let column = error.column();
            format!("line {number} is not a ledger line ({message}, at column {column})")
        })?;
        let at = |problem: String| format!("line {number}: {problem}");
        match (number, line) {
            (1, ReadLine::PaymentsSandboxLedger { version })
                if (OLDEST_VERSION..=VERSION).contains(&version) => {}
            (1, ReadLine::PaymentsSandboxLedger { version }) => {
                return Err(at(format!(
                    "format version {version}, and this sandbox reads versions \
                     {OLDEST_VERSION} to {VERSION}"
                )));
            }
            (1, _) => return Err(at("it does not start as a sandbox ledger".to_owned())),
            (_, ReadLine::PaymentsSandboxLedger { .. }) => {
                return Err(at("a second header".to_owned()));
            }
            (
                _,
                ReadLine::Charge {
                    charge,
                    created_ms,
                    capture_deadline,
                    idempotency_key,
                },
            ) => read
                .books
                .replay_charge(charge, created_ms, capture_deadline, idempotency_key),
            (_, ReadLine::Capture(capture)) => read.books.replay_capture(capture).map_err(at)?,
            (
                _,
                ReadLine::Refund {
                    refund,
                    idempotency_key,
                },
            ) => read
                .books
                .replay_refund(refund, idempotency_key)
                .map_err(at)?,
            (
                _,
                ReadLine::Settled {
                    refund,
                    status,
                    failure_reason,
                },
            ) => read
                .books
                .replay_settlement(&refund, status, failure_reason)
                .map_err(at)?,
            (_, ReadLine::Dispute(dispute)) => read.books.replay_dispute(dispute).map_err(at)?,
            (_, ReadLine::DisputeUpdate(dispute)) => {
                read.books.replay_dispute_update(dispute).map_err(at)?;
            }
            (
                _,
                ReadLine::Key {
                    account,
                    key,
                    fingerprint,
                    first_used_ms,
                    status,
                    body,
                },
            ) => {
                let account = unhex(&account).ok_or_else(|| at("a bad account hash".to_owned()))?;
                let fingerprint =
                    unhex(&fingerprint).ok_or_else(|| at("a bad fingerprint".to_owned()))?;
                let status = StatusCode::from_u16(status)
                    .map_err(|_| at(format!("a bad HTTP status {status}")))?;
                let response = StoredResponse {
                    status,
                    body: Bytes::from(body),
                };
                // A later line for the same key (reused after its
                // retention) replaces the earlier one, as in memory.
                read.keys.insert(
                    ScopedKey { account, key },
                    Entry::completed(Fingerprint(fingerprint), first_used_ms, response),
                );
            }
        }
    }
    Ok(read)
}

/// The open ledger file, appended to.
#[derive(Debug)]
pub(crate) struct Journal {
    path: PathBuf,
    /// `None` once closed, or after a write that could not be undone.
    appender: Mutex<Option<Appender>>,
}

#[derive(Debug)]
struct Appender {
    /// Opened to append, and locked.
    file: File,
    /// Bytes of whole lines: a failed write is cut back to it.
    len: u64,
}

/// A line the ledger file did not take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JournalError(String);

impl fmt::Display for JournalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for JournalError {}

impl Journal {
    fn lock(&self) -> MutexGuard<'_, Option<Appender>> {
        // Every change leaves the appender valid (or `None`).
        self.appender.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn error(&self, what: impl fmt::Display) -> JournalError {
        JournalError(format!(
            "the sandbox ledger file {} {what}",
            self.path.display()
        ))
    }

    /// Appends one line. A write that fails is cut back, so the file keeps
    /// whole lines; if even that fails the file takes no more lines.
    pub(crate) fn append(&self, line: &Line<'_>) -> Result<(), JournalError> {
        let mut text = serde_json::to_vec(line)
            .map_err(|error| self.error(format_args!("cannot take a line: {error}")))?;
        text.push(b'\n');
        let mut guard = self.lock();
        let Some(appender) = guard.as_mut() else {
            return Err(self.error("is closed"));
        };
        match appender.file.write_all(&text) {
            Ok(()) => {
                appender.len += text.len() as u64;
                Ok(())
            }
            Err(error) => {
                if let Err(cut) = appender.file.set_len(appender.len) {
                    tracing::error!(
                        path = %self.path.display(),
                        error = %cut,
                        "cannot cut a failed write back off the ledger file: it takes no \
                         more lines"
                    );
                    *guard = None;
                }
                Err(self.error(format_args!("cannot be written: {error}")))
            }
        }
    }

    /// Replaces the file by an empty ledger (`POST /_sandbox/reset`).
    pub(crate) fn restart(&self) -> Result<(), JournalError> {
        let mut guard = self.lock();
        if guard.is_none() {
            return Err(self.error("is closed"));
        }
        let appender = rewrite(&self.path, std::iter::empty())
            .map_err(|error| self.error(format_args!("cannot be replaced: {error}")))?;
        *guard = Some(appender);
        Ok(())
    }

    /// Flushes the file to disk and releases it (and its lock); later
    /// changes are refused.
    pub(crate) fn close(&self) {
        if let Some(appender) = self.lock().take()
            && let Err(error) = appender.file.sync_data()
        {
            tracing::warn!(path = %self.path.display(), %error, "syncing the ledger file");
        }
    }
}

/// Writes the header and `lines` to a temporary file beside `path`, fsyncs
/// it, renames it over `path` and fsyncs the directory; then opens `path`
/// to append, locked.
fn rewrite<'a>(path: &Path, lines: impl Iterator<Item = Line<'a>>) -> io::Result<Appender> {
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(".tmp");
    let temp = path.with_file_name(name);
    let written = write_lines(&temp, lines).and_then(|()| std::fs::rename(&temp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written?;
    sync_dir(path)?;
    let file = OpenOptions::new().append(true).open(path)?;
    lock(&file)?;
    let len = file.metadata()?.len();
    Ok(Appender { file, len })
}

fn write_lines<'a>(temp: &Path, lines: impl Iterator<Item = Line<'a>>) -> io::Result<()> {
    let mut out = BufWriter::new(File::create(temp)?);
    let header = Line::PaymentsSandboxLedger { version: VERSION };
    for line in std::iter::once(header).chain(lines) {
        serde_json::to_writer(&mut out, &line)?;
        out.write_all(b"\n")?;
    }
    let file = out.into_inner().map_err(io::IntoInnerError::into_error)?;
    file.sync_all()
}

/// Makes a rename in `path`'s directory durable.
#[cfg(unix)]
fn sync_dir(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

#[cfg(not(unix))]
fn sync_dir(_path: &Path) -> io::Result<()> {
    Ok(())
}

/// How long a lock held by someone else is waited for before giving up.
const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// An exclusive lock on the file, or why not. A lock held elsewhere is
/// tried again for [`LOCK_PATIENCE`]: the sandbox that just stopped (a
/// restarted `make run` whose old process is still exiting), or a child
/// process forked by this one that holds a copy of the descriptor until
/// its exec closes it, releases it within that; a sandbox still running
/// on the file does not.
fn lock(file: &File) -> io::Result<()> {
    let started = std::time::Instant::now();
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(()),
            Err(std::fs::TryLockError::WouldBlock) if started.elapsed() < LOCK_PATIENCE => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    "another sandbox is using it (each sandbox needs a ledger file of its own)",
                ));
            }
            Err(std::fs::TryLockError::Error(error)) => return Err(error),
        }
    }
}

fn hex(bytes: &[u8; 32]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn unhex(text: &str) -> Option<[u8; 32]> {
    let mut bytes = [0u8; 32];
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    for (byte, pair) in bytes.iter_mut().zip(text.as_bytes().chunks(2)) {
        *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        let bytes: [u8; 32] = std::array::from_fn(|i| (i * 8) as u8);
        assert_eq!(unhex(&hex(&bytes)), Some(bytes));
        assert_eq!(unhex("zz"), None);
        assert_eq!(unhex(&"é".repeat(32)), None);
    }

    #[test]
    fn an_empty_file_is_a_new_ledger() {
        let read = parse(b"");
        assert!(read.is_ok_and(|read| read.books.counts() == (0, 0, 0) && read.keys.is_empty()));
    }

    /// A charge line as a version 1 file has it (no hold, no
    /// `amount_captured`, no `payment_method_details`).
    const OLD_CHARGE: &str = r#"{"charge":{"charge":{"id":"ch_1","amount":1000,"amount_refunded":0,"currency":"gbp","status":"succeeded","paid":true,"captured":true,"refunded":false,"livemode":false,"source":"tok_visa","description":null,"metadata":{},"created":1700000000,"failure_code":null,"failure_message":null},"created_ms":1700000000000,"idempotency_key":"k"}}"#;

    #[test]
    fn version_1_files_still_read_and_captures_replay() {
        let v1 = format!("{{\"payments_sandbox_ledger\":{{\"version\":1}}}}\n{OLD_CHARGE}\n");
        assert!(parse(v1.as_bytes()).is_ok_and(|read| read.books.counts() == (1, 0, 0)));
        // A charge captured when made takes no capture.
        let capture =
            r#"{"capture":{"charge":"ch_1","amount":1000,"idempotency_key":null,"created":1}}"#;
        let refused = parse(format!("{v1}{capture}\n").as_bytes()).map(|read| read.books.counts());
        assert!(
            refused
                .as_ref()
                .is_err_and(|error| error.contains("line 3: charge ch_1 cannot take a capture")),
            "{refused:?}"
        );
        // A hold (its deadline beside it) takes one.
        let hold = OLD_CHARGE.replace(
            r#""created_ms""#,
            r#""capture_deadline":1700604800,"created_ms""#,
        );
        let v2 = format!("{{\"payments_sandbox_ledger\":{{\"version\":2}}}}\n{hold}\n{capture}\n");
        assert!(parse(v2.as_bytes()).is_ok_and(|read| read.books.counts() == (1, 0, 1)));
    }

    #[test]
    fn a_torn_last_line_is_dropped_and_anything_else_refused() {
        let header = b"{\"payments_sandbox_ledger\":{\"version\":1}}\n";
        let tail = b"{\"charge\":{\"id\":";
        let torn = [&header[..], tail].concat();
        assert!(parse(&torn).is_ok_and(|read| read.torn == tail.len()));
        for (bytes, needle) in [
            (&b"{\"payments_sandbox_ledger\""[..], "no complete line"),
            (b"{}\n", "line 1 is not a ledger line"),
            (
                b"{\"payments_sandbox_ledger\":{\"version\":4}}\n",
                "line 1: format version 4",
            ),
            (
                &[&header[..], b"{\"charge\":{\"id\":1}}\n"].concat(),
                "line 2 is not a ledger line",
            ),
            (
                &[&header[..], &header[..]].concat(),
                "line 2: a second header",
            ),
            (
                &[
                    &header[..],
                    br#"{"settled":{"refund":"re_1","status":"failed","failure_reason":null}}"#,
                    b"\n",
                ]
                .concat(),
                "line 2: refund re_1 cannot be settled",
            ),
        ] {
            match parse(bytes) {
                Ok(_) => panic!("{:?} read back", String::from_utf8_lossy(bytes)),
                Err(error) => assert!(error.contains(needle), "{error}"),
            }
        }
    }
}
