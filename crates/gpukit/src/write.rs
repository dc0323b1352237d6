//! Writing report files so that a reader never sees half of one.

use anyhow::{Context, Result};
use std::path::Path;

/// Writes every (name, bytes) into `dir` through temporary files renamed into place at the end:
/// an interrupted run leaves the previous reports (or none), never a truncated one.
pub fn write_files_atomically(dir: &Path, files: &[(&str, Vec<u8>)]) -> Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create report directory {}", dir.display()))?;
    let mut staged = Vec::new();
    for (name, bytes) in files {
        let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
        let result = std::fs::write(&tmp, bytes)
            .and_then(|_| std::fs::File::open(&tmp)?.sync_all())
            .with_context(|| format!("cannot write {}", tmp.display()));
        if let Err(e) = result {
            for (t, _) in &staged {
                let _ = std::fs::remove_file(t);
            }
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        staged.push((tmp, dir.join(name)));
    }
    for (tmp, dest) in staged {
        std::fs::rename(&tmp, &dest)
            .with_context(|| format!("cannot move {} to {}", tmp.display(), dest.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_all_files_and_leaves_no_temporaries() {
        let dir = std::env::temp_dir().join(format!("gpukit-write-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        write_files_atomically(
            &dir,
            &[("a.json", b"{}".to_vec()), ("b.md", b"# b".to_vec())],
        )
        .unwrap();
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["a.json", "b.md"]);
        assert_eq!(std::fs::read(dir.join("b.md")).unwrap(), b"# b");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unwritable_directory_is_an_error_naming_it() {
        let e =
            write_files_atomically(Path::new("/proc/gpukit-nope"), &[("a", vec![])]).unwrap_err();
        assert!(format!("{e:#}").contains("/proc/gpukit-nope"), "{e:#}");
    }
}
