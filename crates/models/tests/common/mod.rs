//! What the safetensors and ONNX fuzz tests and the corpus replay check of every outcome: an
//! error is bad input naming the file, and no single allocation was far beyond the file's size
//! (a header claiming a huge tensor must be refused before anything that size is allocated).

use gpukit_models::Error;
use gpukit_types::{ErrorKind, HasKind};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::Path;

/// The system allocator, noting the largest single request made on each thread.
pub struct Alloc;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // try_with: the allocator also runs while a thread's locals are being torn down
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl GlobalAlloc for Alloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Runs `f` and returns its value with the largest single allocation it made on this thread.
pub fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|l| l.set(0));
    let value = f();
    (value, LARGEST.with(Cell::get))
}

/// Runs a reader on a file of `file_len` bytes at `path` and checks its outcome: no allocation
/// over four times the file (f16 decoded to f32 doubles it) plus 1 MiB, and an error that is
/// bad input and names the file. Returns the value, or the error's message.
// not every test binary that includes this module reads safetensors
#[allow(dead_code)]
pub fn check_read<T>(
    path: &Path,
    file_len: usize,
    read: impl FnOnce() -> Result<T, Error>,
) -> Result<T, String> {
    let (outcome, largest) = largest_allocation(read);
    let limit = file_len.saturating_mul(4) + (1 << 20);
    assert!(
        largest <= limit,
        "{}: an allocation of {largest} bytes for a file of {file_len}",
        path.display()
    );
    outcome.map_err(|e| {
        let msg = e.to_string();
        assert!(matches!(e, Error::Weights(_)), "not a weights error: {msg}");
        assert_eq!(e.kind(), ErrorKind::BadInput, "{msg}");
        let name = path.file_name().unwrap().to_string_lossy();
        assert!(
            msg.contains(&*name),
            "the message does not name the file: {msg}"
        );
        // the problem follows the file's name
        let (_, problem) = msg.split_once(&*name).unwrap();
        assert!(problem.trim_start_matches(':').trim().len() > 5, "{msg}");
        msg
    })
}

/// The cases of a fuzz property: `default` unless `PROPTEST_CASES` asks for more (or fewer), at
/// most `cap`. Persistence is off: crashing inputs are kept in a corpus instead.
#[allow(dead_code)] // the corpus replay has no property
pub fn config(default: u32, cap: u32) -> proptest::test_runner::Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
        .min(cap);
    proptest::test_runner::Config {
        cases,
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    }
}
