//! How the binaries' allocator (mimalloc, declared in `src/main.rs` and the API bench) gives
//! memory back to the OS.

use std::os::unix::process::CommandExt;

/// mimalloc's option for how many milliseconds memory freed stays with the process before it
/// goes back to the OS, and the value the binaries run with unless the option is set: 10 ms,
/// mimalloc 2's default, rather than mimalloc 3's second. While the farms wrote, the second
/// kept memory the mirror had freed: the 10,000-RC farm bench's server peaked at 240 and 245
/// MiB with 10 ms, against 254 to 263 MiB with the second, and `/healthz`, GET one RC,
/// durable PATCH and the scheduling were as fast (README, Memory).
pub const PURGE_DELAY: (&str, &str) = ("MIMALLOC_PURGE_DELAY", "10");

/// mimalloc reads its options from the environment as the process loads, and setting one
/// later takes an unsafe call. So a process started without [`PURGE_DELAY`] set starts itself
/// again with it: `exec` keeps its process id, arguments and the rest of its environment. If
/// that fails, it goes on as it is. Call it first thing in `main`, before any thread starts.
pub fn start_again_with_allocator_options() {
    let (option, value) = PURGE_DELAY;
    if std::env::var_os(option).is_some() {
        return;
    }
    let Ok(binary) = std::env::current_exe() else {
        return;
    };
    let mut args = std::env::args_os();
    let name = args.next().unwrap_or_else(|| binary.clone().into());
    let failed = std::process::Command::new(&binary)
        .arg0(name)
        .args(args)
        .env(option, value)
        .exec();
    eprintln!("could not start again with {option}={value} ({failed}); going on without it");
}
