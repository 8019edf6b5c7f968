//! Damage at rest in the newest segment: a crash can tear only the end of the last write, so a
//! changed byte or a zeroed block with acknowledged events after it is refused with the file
//! and the offset named, never cut; a torn tail is cut, kept beside the segment and said.

use std::path::{Path, PathBuf};
use std::time::Duration;

use oncegate_contract::{block_on, event, key};
use oncegate_core::DedupStore;
use oncegate_journal::{JournalConfig, OpenError};

const HOUR: Duration = Duration::from_secs(3600);
const EVENTS: u32 = 400;

/// A folder holding `EVENTS` acknowledged events, each admitted (and synced) on its own, all
/// in the newest segment.
fn folder() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("dir");
    block_on(async {
        let store = oncegate_journal::open(JournalConfig::at(dir.path())).expect("open");
        for id in 0..EVENTS {
            let name = format!("d{id}");
            store
                .admit(event(&name, None), &[key(&name)], HOUR)
                .await
                .expect("admit");
        }
    });
    let segment = dir.path().join(format!("segment-{:016x}.log", 0));
    (dir, segment)
}

fn queued(dir: &Path) -> Result<u64, OpenError> {
    let store = oncegate_journal::open(JournalConfig::at(dir))?;
    Ok(block_on(store.queued()).expect("queued"))
}

/// Opening refuses, naming the segment and an offset at or before `changed`; the file is left
/// as it was.
fn assert_refused(dir: &Path, segment: &Path, changed: usize) {
    let before = std::fs::read(segment).expect("read");
    match queued(dir) {
        Err(error @ OpenError::Corrupt { .. }) => {
            let text = error.to_string();
            assert!(text.contains("segment-0000000000000000.log"), "{text}");
            let at: usize = text
                .split("damaged at byte ")
                .nth(1)
                .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|digits| digits.parse().ok())
                .unwrap_or_else(|| panic!("no offset in {text}"));
            assert!(
                at <= changed && changed - at < 1 << 12,
                "offset {at} for a change at {changed}: {text}"
            );
            assert!(text.contains(&format!("truncate -s {at}")), "{text}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(
        std::fs::read(segment).expect("read"),
        before,
        "left as it was"
    );
}

#[test]
fn a_flipped_byte_in_the_newest_segment_is_refused_not_cut() {
    let (dir, segment) = folder();
    let mut bytes = std::fs::read(&segment).expect("read");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::fs::write(&segment, &bytes).expect("write");
    assert_refused(dir.path(), &segment, middle);
}

#[test]
fn a_zeroed_block_in_the_newest_segment_is_refused_not_cut() {
    let (dir, segment) = folder();
    let mut bytes = std::fs::read(&segment).expect("read");
    let block = bytes.len() / 2 / 4096 * 4096;
    assert!(bytes.len() > block + 3 * 4096, "{} bytes", bytes.len());
    bytes[block..block + 4096].fill(0);
    std::fs::write(&segment, &bytes).expect("write");
    assert_refused(dir.path(), &segment, block);
}

#[test]
fn a_torn_tail_is_cut_kept_beside_the_segment_and_the_rest_stays() {
    let (dir, segment) = folder();
    let bytes = std::fs::read(&segment).expect("read");
    // The last write cut short, as a crash during it leaves it.
    let kept = bytes.len() - 7;
    std::fs::write(&segment, &bytes[..kept]).expect("write");
    let log = Log::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(log.clone())
        .with_ansi(false)
        .finish();
    let reopened = tracing::subscriber::with_default(subscriber, || queued(dir.path()));
    assert_eq!(reopened.expect("open"), u64::from(EVENTS) - 1);
    let sides: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .expect("list")
        .filter_map(|entry| Some(entry.ok()?.path()))
        .filter(|path| path.to_string_lossy().contains(".cut-at-"))
        .collect();
    assert_eq!(sides.len(), 1, "{sides:?}");
    let side = std::fs::read(&sides[0]).expect("read the side file");
    let name = sides[0]
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    let at: usize = name
        .rsplit('-')
        .next()
        .expect("offset")
        .parse()
        .expect("a number");
    assert_eq!(&bytes[at..kept], &side[..], "the cut bytes are kept");
    assert!(
        side.len() < 200,
        "only the torn frame is cut: {}",
        side.len()
    );
    let said = log.text();
    assert!(
        said.contains("WARN")
            && said.contains(&format!("bytes={}", side.len()))
            && said.contains(&name),
        "the cut is said with its byte count and where it is kept: {said}"
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&sides[0])
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "the side file is the owner's only");
    }
}

/// A log that tests read back.
#[derive(Clone, Default)]
struct Log(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Log {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log")).into_owned()
    }
}

impl std::io::Write for Log {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log").extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Log {
    type Writer = Log;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}
