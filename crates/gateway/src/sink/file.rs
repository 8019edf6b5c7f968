//! A file sink's writer: one thread appends the lines of every delivery that arrives while it
//! writes, syncs them to disk once for the whole batch, and only then answers each delivery — so
//! an event is completed only after its line is durable, at one sync per batch, not per event.

use std::fs::File;
use std::io::{self, Write};
use std::sync::mpsc;

use tokio::sync::oneshot;

/// Lines one batch may gather before it is written.
const MOST_LINES: usize = 4096;
/// Bytes one batch may gather before it is written.
const MOST_BYTES: usize = 4 << 20;
/// How long a small batch waits for more lines before it is synced, and the size from which
/// it does not: a sync costs the machine about the same whatever it carries.
const GATHER_WAIT: std::time::Duration = std::time::Duration::from_millis(2);
const GATHER_LINES: usize = 1024;

/// One line waiting for its batch's sync.
struct Waiting {
    line: Vec<u8>,
    synced: oneshot::Sender<Result<(), String>>,
}

/// The sending side of a file's writer thread; the thread ends when this is dropped.
#[derive(Debug)]
pub(crate) struct FileLines {
    waiting: mpsc::Sender<Waiting>,
}

impl FileLines {
    /// Starts the writer thread for `file` (opened for appending).
    pub(crate) fn start(file: File, name: String) -> io::Result<Self> {
        let (waiting, batches) = mpsc::channel();
        let length = file.metadata()?.len();
        std::thread::Builder::new()
            .name("oncegate-file-sink".into())
            .spawn(move || write_batches(file, length, &name, &batches))?;
        Ok(Self { waiting })
    }

    /// Appends `line` (ending in a newline) and returns once it is synced to disk.
    pub(crate) async fn append(&self, line: Vec<u8>) -> Result<(), String> {
        let (synced, answer) = oneshot::channel();
        self.waiting
            .send(Waiting { line, synced })
            .map_err(|_| "the file sink's writer has stopped".to_owned())?;
        answer
            .await
            .map_err(|_| "the file sink's writer has stopped".to_owned())?
    }
}

/// Cuts off a line that a crash left half-written at the end of the file at `path` (the
/// process killed, or the machine lost, between a batch's write and its sync): the bytes after
/// the last newline. Its events were never answered (a batch is answered after its sync), so
/// they are delivered again; appended after the torn bytes instead, the first of them would
/// share its line with them and break every reader of the file. Returns the bytes cut (0 for a
/// file that ends in a newline, an empty one, or none). A tail that is not the start of one of
/// this sink's lines (`{"id":`), or longer than any batch, is not this sink's to cut: an error
/// (the path names some other file), and nothing is changed.
pub(crate) fn cut_torn_tail(path: &std::path::Path) -> io::Result<u64> {
    use std::io::{Read, Seek, SeekFrom};
    const CHUNK: u64 = 64 * 1024;
    /// Longer than a batch (`MOST_BYTES` and the line that passed it) can be.
    const LONGEST_TAIL: u64 = 64 << 20;
    const LINE_START: &[u8] = b"{\"id\":";
    let mut file = match oncegate_files::open_existing(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(error) => return Err(error),
    };
    let length = file.metadata()?.len();
    let mut end = length;
    let mut chunk = Vec::new();
    // Backwards from the end, a chunk at a time, to the last newline (or the file's start).
    let keep = loop {
        if end == 0 {
            break 0;
        }
        if length - end > LONGEST_TAIL {
            return Err(not_ours(length - end));
        }
        let start = end.saturating_sub(CHUNK);
        chunk.resize(usize::try_from(end - start).unwrap_or(0), 0);
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut chunk)?;
        if let Some(at) = chunk.iter().rposition(|&b| b == b'\n') {
            break start + at as u64 + 1;
        }
        end = start;
    };
    if keep < length {
        // A power loss on a file system that commits the size before the data leaves zeros
        // where the last write's bytes were to be: torn too, with any start of a line after.
        let mut line = keep;
        file.seek(SeekFrom::Start(keep))?;
        while line < length {
            chunk.resize(usize::try_from((length - line).min(CHUNK)).unwrap_or(0), 0);
            file.read_exact(&mut chunk)?;
            match chunk.iter().position(|&b| b != 0) {
                Some(at) => {
                    line += at as u64;
                    break;
                }
                None => line += chunk.len() as u64,
            }
        }
        let mut start = vec![
            0;
            LINE_START
                .len()
                .min(usize::try_from(length - line).unwrap_or(0))
        ];
        file.seek(SeekFrom::Start(line))?;
        file.read_exact(&mut start)?;
        if !LINE_START.starts_with(&start) {
            return Err(not_ours(length - keep));
        }
        file.set_len(keep)?;
        file.sync_data()?;
        if line > keep {
            tracing::warn!(
                path = %path.display(),
                zeros = line - keep,
                "the events file ended in zeros (a power loss before its last write reached the \
                 disk): cut off with what followed; those events are delivered again"
            );
        }
    }
    Ok(length - keep)
}

/// A file whose last `tail` bytes are no torn line of this sink.
fn not_ours(tail: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "it ends in {tail} bytes or more without a line end that are no line of this sink \
             (each starts with {{\"id\":): is this the events file? Move it away, or end it \
             with a newline"
        ),
    )
}

/// The writer thread: a batch is whatever waits when the previous sync ends, plus, when more
/// than one line waited, what comes within `GATHER_WAIT` while it is small.
fn write_batches(mut file: File, mut length: u64, name: &str, batches: &mpsc::Receiver<Waiting>) {
    let mut buffer = Vec::new();
    while let Ok(first) = batches.recv() {
        let mut batch = vec![first];
        let mut bytes = batch[0].line.len();
        let gathering = std::time::Instant::now() + GATHER_WAIT;
        loop {
            while batch.len() < MOST_LINES && bytes < MOST_BYTES {
                match batches.try_recv() {
                    Ok(next) => {
                        bytes += next.line.len();
                        batch.push(next);
                    }
                    Err(_) => break,
                }
            }
            let left = gathering.saturating_duration_since(std::time::Instant::now());
            // A lone line does not wait: one chat's events come one after another (each
            // after the previous one's sync), and waiting would only slow that chat down.
            if batch.len() < 2
                || batch.len() >= GATHER_LINES
                || bytes >= MOST_BYTES
                || left.is_zero()
            {
                break;
            }
            // A sleep, not a wait on the channel: senders wake nobody while a batch gathers.
            std::thread::sleep(left);
        }
        buffer.clear();
        for waiting in &batch {
            buffer.extend_from_slice(&waiting.line);
        }
        let written = file.write_all(&buffer).and_then(|()| file.sync_data());
        let answer = match written {
            Ok(()) => {
                length += buffer.len() as u64;
                Ok(())
            }
            Err(error) => {
                // Cut a half-written batch off: its events are retried, and a torn line
                // would break every reader of the file.
                let cut = file.set_len(length).and_then(|()| file.sync_data());
                let cut = match cut {
                    Ok(()) => String::new(),
                    Err(cut) => format!(" (and cutting the partial batch off failed: {cut})"),
                };
                Err(format!("cannot write {name}: {error}{cut}"))
            }
        };
        for waiting in batch {
            let _ = waiting.synced.send(answer.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Many deliveries at once: each returns only once its line is in the file, every line
    /// whole and once, in fewer syncs than lines.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_lines_are_each_written_whole_once_before_they_return() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("events.jsonl");
        let file = oncegate_files::open_append(&path).expect("open");
        let lines =
            std::sync::Arc::new(FileLines::start(file, "events.jsonl".into()).expect("start"));
        let tasks: Vec<_> = (0..400)
            .map(|n| {
                let (lines, path) = (lines.clone(), path.clone());
                tokio::spawn(async move {
                    let line = format!("{{\"n\":{n},\"pad\":\"{}\"}}\n", "x".repeat(n % 97));
                    lines
                        .append(line.clone().into_bytes())
                        .await
                        .expect("append");
                    let now = std::fs::read_to_string(&path).expect("read");
                    assert!(
                        now.lines().any(|l| format!("{l}\n") == line),
                        "line {n} is in the file on return"
                    );
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("join");
        }
        let text = std::fs::read_to_string(&path).expect("read");
        let mut seen: Vec<u64> = text
            .lines()
            .map(|l| {
                let doc: serde_json::Value = serde_json::from_str(l).expect("a whole JSON line");
                doc["n"].as_u64().expect("n")
            })
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..400).collect::<Vec<u64>>());
    }

    /// What a crash between a batch's write and its sync leaves (a last line without its
    /// newline) is cut off before anything is appended; whole lines stay, and a file without
    /// any newline, an empty one or none is handled. The tail is longer than one read chunk
    /// in one case, so the backwards search crosses chunks. A file whose end is no line of
    /// this sink is not cut: its path names some other file.
    #[test]
    fn a_torn_last_line_is_cut_off_and_whole_ones_kept() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("events.jsonl");
        let long_tail = format!("{{\"id\":\"msg_{}", "x".repeat(200_000));
        for (before, after) in [
            (
                "{\"id\":1}\n{\"id\":2}\n{\"id\":\"ms",
                "{\"id\":1}\n{\"id\":2}\n",
            ),
            ("{\"id\":1}\n", "{\"id\":1}\n"),
            ("{\"id\":1}\n{\"i", "{\"id\":1}\n"),
            ("{\"id\":", ""),
            ("", ""),
            (&format!("{{\"id\":1}}\n{long_tail}"), "{\"id\":1}\n"),
            // What a power loss leaves when the size reached the disk before the data.
            ("{\"id\":1}\n\0\0\0\0", "{\"id\":1}\n"),
            ("{\"id\":1}\n\0\0\0\0{\"id\":2,\"ev", "{\"id\":1}\n"),
            (
                &format!("{{\"id\":1}}\n{}", "\0".repeat(100_000)),
                "{\"id\":1}\n",
            ),
            (&format!("{}{{\"i", "\0".repeat(4096)), ""),
        ] {
            std::fs::write(&path, before).expect("seed");
            let cut = cut_torn_tail(&path).expect("cut");
            assert_eq!(std::fs::read_to_string(&path).expect("read"), after);
            assert_eq!(cut, (before.len() - after.len()) as u64);
        }
        let none = dir.path().join("none.jsonl");
        assert_eq!(cut_torn_tail(&none).expect("none"), 0);
        assert!(!none.exists(), "nothing is created");
        // Some other file (no line of ours at its end): refused, and left as it was.
        for other in [
            "#!/bin/sh\necho hi",
            "binary\u{0}data",
            "\u{0}\u{0}\u{0}#!/bin/sh",
        ] {
            std::fs::write(&path, other).expect("seed");
            let error = cut_torn_tail(&path).expect_err(other);
            assert_eq!(error.kind(), io::ErrorKind::InvalidData);
            assert!(
                error.to_string().contains("is this the events file"),
                "{error}"
            );
            assert_eq!(std::fs::read_to_string(&path).expect("read"), other);
        }
    }

    /// A write that fails answers every delivery of its batch with the reason, and leaves no
    /// torn line behind.
    #[tokio::test]
    async fn a_failed_write_is_answered_and_leaves_the_file_as_it_was() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("events.jsonl");
        std::fs::write(&path, b"{\"before\":1}\n").expect("seed");
        // Opened read-only: every write fails, as a full or broken disk would.
        let file = File::open(&path).expect("open");
        let lines = FileLines::start(file, "events.jsonl".into()).expect("start");
        let error = lines
            .append(b"{\"n\":1}\n".to_vec())
            .await
            .expect_err("the write fails");
        assert!(error.starts_with("cannot write events.jsonl:"), "{error}");
        assert_eq!(std::fs::read(&path).expect("read"), b"{\"before\":1}\n");
    }
}
