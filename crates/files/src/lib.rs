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

/// Opens `path` for appending, creating it (mode 0600) and its folder (0700) when missing.
pub fn open_append(path: &Path) -> io::Result<File> {
    create_parent(path)?;
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(FILE_MODE)
        .open(path)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

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
