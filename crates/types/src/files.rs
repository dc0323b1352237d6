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

/// What the OS said, without the path tempfile adds ("Permission denied (os error 13)").
fn os_reason(e: &std::io::Error) -> String {
    let text = e.to_string();
    match text.find(" at path ") {
        Some(at) => text[..at].to_string(),
        None => text,
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
    let dir = parent_of(path);
    if !dir.exists() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("the directory {} does not exist", dir.display()),
        ));
    }
    if !dir.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotADirectory,
            format!("{} is not a directory", dir.display()),
        ));
    }
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{}.", name.to_string_lossy()))
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(|e| {
            // tempfile names its random file; the user named the directory
            std::io::Error::new(
                e.kind(),
                format!(
                    "cannot create a file in {}: {}",
                    dir.display(),
                    os_reason(&e)
                ),
            )
        })?;
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

/// An error unless a file can be created at `path` (or replace the one there): its directory
/// exists and takes a new file, and `path` is not a directory. Checked by creating and removing
/// a temporary file beside it, before work whose result would go there.
pub fn check_writable_file(path: &Path) -> std::io::Result<()> {
    if path.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::IsADirectory,
            "is a directory, not a file",
        ));
    }
    staged(path, b"").map(drop)
}

/// Creates `dir` (and its parents) if missing, then checks that a file can be written in it.
pub fn check_writable_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    if !dir.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotADirectory,
            "is not a directory",
        ));
    }
    check_writable_file(&dir.join("report.json"))
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
    fn a_missing_directory_or_a_file_in_its_place_is_named() {
        let d = tempfile::tempdir().unwrap();
        let e = check_writable_file(&d.path().join("no/such/x.json")).unwrap_err();
        assert!(
            e.to_string().contains("does not exist") && e.to_string().contains("no/such"),
            "{e}"
        );
        std::fs::write(d.path().join("f"), b"").unwrap();
        let e = check_writable_file(&d.path().join("f/x.json")).unwrap_err();
        assert!(e.to_string().contains("is not a directory"), "{e}");
        assert!(!e.to_string().contains(".x.json."), "{e}");
        assert_eq!(names(d.path()), ["f"]);
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
    fn destinations_are_checked_without_leaving_anything() {
        let dir = tempfile::tempdir().unwrap();
        check_writable_file(&dir.path().join("x.json")).unwrap();
        check_writable_dir(&dir.path().join("a/b")).unwrap();
        assert!(dir.path().join("a/b").is_dir());
        assert!(names(&dir.path().join("a/b")).is_empty());
        assert!(names(dir.path()).iter().all(|n| n == "a"));
        assert!(check_writable_file(dir.path()).is_err());
        assert!(check_writable_file(Path::new("/proc/nope/x.json")).is_err());
        assert!(check_writable_dir(Path::new("/proc/x")).is_err());
        let file = dir.path().join("f");
        std::fs::write(&file, b"").unwrap();
        assert!(check_writable_dir(&file).is_err());
    }

    #[test]
    fn an_unwritable_place_is_an_error() {
        assert!(write_atomically(Path::new("/proc/gpukit-nope/x.json"), b"x").is_err());
        assert!(write_atomically(Path::new("/"), b"x").is_err());
    }
}
