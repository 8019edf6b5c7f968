//! Files that hold events or secrets (stores, spools, event logs) are created readable by their
//! owner only: folders 0700, files 0600. Existing files and folders keep their modes, which are
//! the operator's choice.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

/// Mode of the folders oncegate creates.
pub const DIR_MODE: u32 = 0o700;
/// Mode of the files oncegate creates.
pub const FILE_MODE: u32 = 0o600;

/// Creates `dir` and its missing parents, each with mode 0700.
pub fn create_dir_all(dir: &Path) -> io::Result<()> {
    if dir.as_os_str().is_empty() || dir.is_dir() {
        return Ok(());
    }
    DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir)
}

/// Creates the folder that will hold `file`, if it has one.
pub fn create_parent(file: &Path) -> io::Result<()> {
    match file.parent() {
        Some(parent) => create_dir_all(parent),
        None => Ok(()),
    }
}

/// Creates `path` as an empty file with mode 0600 unless it exists (its folder too), so that
/// whatever opens it next never makes it readable by others.
pub fn create_private(path: &Path) -> io::Result<()> {
    create_parent(path)?;
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(error) => Err(error),
    }
}

/// Opens `path` for appending, creating it (mode 0600) and its folder (0700) when missing. A
/// symbolic link at `path` is refused (`ELOOP`): decrypted events never go through one into
/// some other file.
pub fn open_append(path: &Path) -> io::Result<File> {
    create_parent(path)?;
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|error| refuse_link(path, error))
}

/// Opens the existing file `path` to read and write, refusing a symbolic link as
/// [`open_append`] does.
pub fn open_existing(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|error| refuse_link(path, error))
}

/// `ELOOP` from `O_NOFOLLOW` said as what it is.
fn refuse_link(path: &Path, error: io::Error) -> io::Error {
    if error.raw_os_error() == Some(libc::ELOOP) {
        return io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is a symbolic link: events are written to the file itself, never through a                  link; name the file it points to",
                path.display()
            ),
        );
    }
    error
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    /// A link at the events file's path is refused, whatever it points to, and the file it
    /// points to is left alone.
    #[test]
    fn a_symbolic_link_is_never_written_through() {
        let dir = tempfile::tempdir().expect("dir");
        let target = dir.path().join("other");
        std::fs::write(&target, "keep").expect("seed");
        let link = dir.path().join("events.jsonl");
        std::os::unix::fs::symlink(&target, &link).expect("link");
        for error in [
            super::open_append(&link).expect_err("a link"),
            super::open_existing(&link).expect_err("a link"),
        ] {
            assert!(error.to_string().contains("symbolic link"), "{error}");
        }
        assert_eq!(std::fs::read_to_string(&target).expect("read"), "keep");
    }

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path)
            .expect("metadata")
            .permissions()
            .mode()
            & 0o777
    }

    #[test]
    fn new_folders_and_files_are_the_owners_only_and_old_ones_keep_their_mode() {
        let root = tempfile::tempdir().expect("dir");
        let file = root.path().join("a/b/store.redb");
        create_private(&file).expect("create");
        assert_eq!(mode(&root.path().join("a")), DIR_MODE);
        assert_eq!(mode(&root.path().join("a/b")), DIR_MODE);
        assert_eq!(mode(&file), FILE_MODE);
        let log = root.path().join("c/events.jsonl");
        drop(open_append(&log).expect("append"));
        assert_eq!(
            (mode(&root.path().join("c")), mode(&log)),
            (DIR_MODE, FILE_MODE)
        );
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        create_private(&file).expect("again");
        assert_eq!(mode(&file), 0o640, "an existing file keeps its mode");
    }
}
