//! Files written whole or not at all: a reader (or a crash) sees the old file or the complete
//! new one, never half of one, and a failed write leaves no temporary file behind. Every report,
//! checkpoint, cache and weights file gpukit writes goes through here.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
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
    // a new file gets what the user's umask gives (0644 under 022), a replaced one keeps its
    // mode; tempfile alone would leave 0600 on every report
    let mode = std::fs::metadata(path)
        .ok()
        .filter(std::fs::Metadata::is_file)
        .map(|m| m.permissions())
        .unwrap_or_else(|| std::fs::Permissions::from_mode(0o666));
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{}.", name.to_string_lossy()))
        .suffix(".tmp")
        .permissions(mode.clone())
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
    // an existing file's mode is set as it was (the umask applies only to new files)
    if std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        tmp.as_file().set_permissions(mode)?;
    }
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    Ok(tmp)
}

/// Whether `a` and `b` are the same file on disk (the same device and inode: through links,
/// `./` and `..` alike); false when either does not exist.
pub fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// An error naming both flags when the output `(flag, path)` is one of the `inputs`: writing
/// it would destroy what the command reads.
pub fn check_not_an_input(output: (&str, &Path), inputs: &[(&str, &Path)]) -> Result<(), String> {
    match inputs.iter().find(|(_, input)| same_file(output.1, input)) {
        Some((input_flag, _)) => Err(format!(
            "{} {}: is also the input {input_flag}; writing it would destroy what is read \
             (choose another file)",
            output.0,
            output.1.display()
        )),
        None => Ok(()),
    }
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

/// Checks that files can be written in `dir`, or that it can be created, without leaving
/// anything behind: an existing directory takes a test file; a missing one's nearest existing
/// ancestor takes a test directory. [`write_all_atomically`] creates it when the files are
/// ready, so a run that fails first leaves no empty folder.
pub fn check_writable_dir(dir: &Path) -> std::io::Result<()> {
    if dir.exists() {
        if !dir.is_dir() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotADirectory,
                "is not a directory",
            ));
        }
        return check_writable_file(&dir.join("report.json"));
    }
    let mut base = dir;
    while !base.exists() {
        base = match base.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
    }
    if !base.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotADirectory,
            format!("{} is not a directory", base.display()),
        ));
    }
    tempfile::Builder::new()
        .prefix(".gpukit-check.")
        .tempdir_in(base)
        .map(drop)
        .map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!(
                    "cannot create a directory in {}: {}",
                    base.display(),
                    os_reason(&e)
                ),
            )
        })
}

/// Writes every `(name, bytes)` into `dir` (created if missing): all are staged first, then
/// renamed into place, so an error while staging leaves every earlier file as it was. Returns
/// the paths written.
pub fn write_all_atomically(
    dir: &Path,
    files: &[(&str, Vec<u8>)],
) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
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

    /// The umask of this process, read back from a file made with mode 0666.
    fn umask_mode(dir: &Path) -> u32 {
        let probe = dir.join("probe");
        std::fs::write(&probe, b"").unwrap();
        let mode = std::fs::metadata(&probe).unwrap().permissions().mode() & 0o777;
        std::fs::remove_file(probe).unwrap();
        mode
    }

    #[test]
    fn new_files_follow_the_umask_and_replaced_files_keep_their_mode() {
        let dir = tempfile::tempdir().unwrap();
        let expected = umask_mode(dir.path());
        let p = dir.path().join("report.json");
        write_atomically(&p, b"{}").unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, expected, "{mode:o} vs {expected:o}");
        assert_ne!(mode, 0o600, "a report must not be private to its writer");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        write_atomically(&p, b"{1}").unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640);
        let written = write_all_atomically(&dir.path().join("out"), &[("a.md", vec![1])]).unwrap();
        let mode = std::fs::metadata(&written[0]).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, expected);
    }

    #[test]
    fn an_output_that_is_an_input_is_named_through_links() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("R.json");
        std::fs::write(&input, b"{}").unwrap();
        let link = dir.path().join("L.json");
        std::os::unix::fs::symlink(&input, &link).unwrap();
        let dotted = dir.path().join(".").join("R.json");
        for out in [&input, &link, &dotted] {
            let e = check_not_an_input(("--out", out), &[("REPORT", &input)]).unwrap_err();
            assert!(e.contains("--out") && e.contains("REPORT"), "{e}");
        }
        let other = dir.path().join("R.html");
        assert!(check_not_an_input(("--out", &other), &[("REPORT", &input)]).is_ok());
        assert!(!same_file(&other, &other), "a missing file is no input");
    }

    #[test]
    fn destinations_are_checked_without_leaving_anything() {
        let dir = tempfile::tempdir().unwrap();
        check_writable_file(&dir.path().join("x.json")).unwrap();
        check_writable_dir(&dir.path().join("a/b")).unwrap();
        assert!(!dir.path().join("a").exists(), "the check made a folder");
        assert!(names(dir.path()).is_empty());
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        check_writable_dir(&dir.path().join("a/b")).unwrap();
        assert!(names(&dir.path().join("a/b")).is_empty());
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
