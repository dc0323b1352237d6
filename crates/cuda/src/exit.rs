//! Ending the process once its work is done and its output written, without the exit handlers
//! that the CUDA libraries register (cuDNN, cuBLAS, NVRTC and the driver tear down their state
//! in them, long after gpukit dropped everything it opened). The operating system takes back
//! the process's memory, files and GPU context as it does for any process that ends.

use std::io::Write;

extern "C" {
    /// POSIX `_exit`: ends the process at once, with no exit handlers.
    fn _exit(status: i32) -> !;
}

/// Flushes standard output and error, then ends the process with `code` without running exit
/// handlers. Only for the end of `main`: anything not yet written by then is lost.
pub fn now(code: u8) -> ! {
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: `_exit` takes any status and does not return; the streams Rust buffers were
    // flushed above, and the files gpukit writes are closed before its commands return.
    unsafe { _exit(i32::from(code)) }
}
