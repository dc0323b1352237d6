//! Files written whole or not at all: a reader (or a crash) sees the old file or the complete
//! new one, never half of one, and a failed write leaves no temporary file behind. Every report,
//! checkpoint, cache and weights file gpukit writes goes through here.

use std::io::Write;
use std::path::{Path, PathBuf};

/// The directory a temporary sibling of `path` goes in (the same one, so that the final rename
/// is atomic; `.` for a bare file name).
fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// A temporary file beside `path`, holding `bytes`, synced to disk (removed when dropped
/// unpersisted).
fn staged(path: &Path, bytes: &[u8]) -> std::io::Result<tempfile::NamedTempFile> {
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} does not name a file", path.display()),
        )
    })?;
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{}.", name.to_string_lossy()))
        .suffix(".tmp")
        .tempfile_in(parent_of(path))?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    Ok(tmp)
}

/// Writes `bytes` to `path` through a synced temporary file beside it, renamed into place.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    staged(path, bytes)?
        .persist(path)
        .map(drop)
        .map_err(|e| e.error)
}

/// Writes every `(name, bytes)` into `dir` (which must exist): all are staged first, then
/// renamed into place, so an error while staging leaves every earlier file as it was. Returns
/// the paths written.
pub fn write_all_atomically(
    dir: &Path,
    files: &[(&str, Vec<u8>)],
) -> std::io::Result<Vec<PathBuf>> {
    let mut staged_files = Vec::new();
    for (name, bytes) in files {
        let dest = dir.join(name);
        staged_files.push((staged(&dest, bytes)?, dest));
    }
    let mut written = Vec::new();
    for (tmp, dest) in staged_files {
        tmp.persist(&dest).map_err(|e| e.error)?;
        written.push(dest);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn writes_whole_files_and_leaves_no_temporaries() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.json");
        std::fs::write(&p, b"old").unwrap();
        write_atomically(&p, b"{}").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"{}");
        write_all_atomically(dir.path(), &[("b.md", b"# b".to_vec()), ("c", vec![1])]).unwrap();
        assert_eq!(names(dir.path()), ["a.json", "b.md", "c"]);
    }

    #[test]
    fn a_directory_as_target_fails_and_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("sub");
        std::fs::create_dir(&target).unwrap();
        assert!(write_atomically(&target, b"x").is_err());
        assert_eq!(names(dir.path()), ["sub"]);
        assert!(names(&target).is_empty());
    }

    #[test]
    fn an_unwritable_place_is_an_error() {
        assert!(write_atomically(Path::new("/proc/gpukit-nope/x.json"), b"x").is_err());
        assert!(write_atomically(Path::new("/"), b"x").is_err());
    }
}
