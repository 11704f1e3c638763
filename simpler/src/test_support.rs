//! Hidden support for tests that fork: run each one in a process of its own under any harness.
//!
//! Not part of the public API: nothing here is stable, and the library itself never calls it.
//!
//! Forking is only safe while no other thread of the process can hold a lock the child needs,
//! and the tests' leak checks (no process, no host buffer of this process left) only mean
//! something while no other test runs in the process. `cargo nextest` runs every test in a
//! process of its own; plain `cargo test` runs many tests on threads of one process. A test that
//! forks is therefore written with [`isolated_test`] in place of `#[test]`:
//!
//! ```
//! use simpler::test_support::isolated_test;
//!
//! #[isolated_test]
//! fn a_test_that_forks() {
//!     // ... build and init a Worker ...
//! }
//! # fn main() {}
//! ```
//!
//! which is a `#[test]` that starts with the guard [`in_own_process`]:
//!
//! ```
//! #[test]
//! fn a_test_that_forks() {
//!     if !simpler::test_support::in_own_process() {
//!         return; // it ran, and passed, in a process of its own
//!     }
//!     // ... build and init a Worker ...
//! }
//! # fn main() {}
//! ```
//!
//! Under `cargo test` the first call reruns the test binary for exactly this test (the
//! pattern of rayon-core's crash tests), forwards its output to the harness, and panics unless
//! that run passed. The rerun, and a run under nextest, carry on with the test body.

/// A `#[test]` that runs alone in a process of its own: written in place of `#[test]`, it
/// emits the test with [`in_own_process`] as its guard, so under `cargo test` the test reruns
/// itself alone and its thread in the shared harness returns at once.
///
/// The test takes no parameters and returns `()`. Other attributes (`#[ignore]`, doc
/// comments, lint levels) stay as they are. The one option, `crate = path`, names `simpler`
/// where it is renamed; the library's own unit tests write
/// `#[crate::test_support::isolated_test(crate = crate)]`.
///
/// # Examples
///
/// ```
/// use simpler::test_support::isolated_test;
///
/// #[isolated_test]
/// fn one_sub_worker_starts_and_closes() {
///     let mut worker = simpler::Worker::builder().sub_workers(1).build().unwrap();
///     worker.init().unwrap();
///     worker.close().unwrap();
/// }
/// # fn main() {}
/// ```
pub use simpler_macros::isolated_test;

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{Id, WaitPidFlag, waitid};
use nix::unistd::Pid;

/// Set in a rerun to the name of the one test it runs.
const ALONE_ENV: &str = "SIMPLER_TEST_ALONE";

/// A rerun still going after this long is killed and fails the test: nextest's limit in
/// `.config/nextest.toml` (4 periods of 30 s), so a hang never eats a `cargo test` run either.
const RERUN_LIMIT: Duration = Duration::from_secs(120);

/// After the rerun exits, how long its output pipes may stay open (held by a process of the
/// test tree that outlived it) before the test fails.
const PIPE_LIMIT: Duration = Duration::from_secs(10);

/// True when the calling test runs alone in its process, so it may fork: under
/// `cargo nextest` (one test per process), in the rerun this function starts, or when the
/// harness runs tests on its main thread (one at a time, no other thread).
///
/// Otherwise (plain `cargo test`: tests on threads of one process) it reruns the test binary
/// for exactly this test, in a process of its own, and returns false: the caller returns at
/// once. It panics, with the rerun's output shown, when the rerun failed, did not run the test,
/// or ran past two minutes (it is then killed).
///
/// The test is named by its thread, which libtest names after the test.
///
/// # Examples
///
/// ```
/// # fn main() -> simpler::Result<()> {
/// // The first lines of a `#[test]` that forks (what `#[isolated_test]` writes):
/// if !simpler::test_support::in_own_process() {
///     return Ok(()); // it ran, and passed, in a process of its own
/// }
/// let mut worker = simpler::Worker::builder().sub_workers(1).build()?;
/// worker.init()?;
/// worker.close()?;
/// # Ok(())
/// # }
/// ```
#[track_caller]
pub fn in_own_process() -> bool {
    if std::env::var_os("NEXTEST_EXECUTION_MODE").is_some_and(|mode| mode == "process-per-test") {
        return true;
    }
    let thread = std::thread::current();
    let name = match thread.name() {
        // No name to rerun by, but no other test either: the harness runs one at a time here.
        None | Some("main") => return true,
        Some(name) => name,
    };
    if std::env::var_os(ALONE_ENV).is_some_and(|alone| alone == name) {
        return true;
    }
    rerun_alone(name);
    false
}

/// Runs the current test binary for test `name` only and panics unless it passed.
#[track_caller]
fn rerun_alone(name: &str) {
    let exe = std::env::current_exe().expect("the path of the test binary");
    let mut child = Command::new(&exe)
        .args([name, "--exact", "--nocapture", "--include-ignored", "--test-threads=1"])
        .env(ALONE_ENV, name)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("rerunning test {name} alone ({}): {e}", exe.display()));
    let pid = Pid::from_raw(i32::try_from(child.id()).expect("a pid fits in i32"));

    // Collect both pipes on threads of their own, so neither can fill up and stall the rerun.
    let pipe = |mut r: Box<dyn Read + Send>| {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = r.read_to_end(&mut bytes);
            let _ = tx.send(bytes);
        });
        rx
    };
    let stdout = pipe(Box::new(child.stdout.take().expect("piped stdout")));
    let stderr = pipe(Box::new(child.stderr.take().expect("piped stderr")));

    // The watchdog kills the rerun at the limit. The rerun is not reaped before the watchdog
    // has stopped (the wait below leaves it a zombie), so its pid cannot have been reused.
    let (done, stop) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        let late = stop.recv_timeout(RERUN_LIMIT) == Err(mpsc::RecvTimeoutError::Timeout);
        if late {
            let _ = kill(pid, Signal::SIGKILL);
        }
        late
    });
    loop {
        match waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT) {
            Err(Errno::EINTR) => continue,
            Err(e) => panic!("waiting for the rerun of test {name}: {e}"),
            Ok(_) => break,
        }
    }
    drop(done);
    let timed_out = watchdog.join().expect("the watchdog thread");
    let status = child.wait().expect("reaping the rerun");

    let output = |rx: mpsc::Receiver<Vec<u8>>| rx.recv_timeout(PIPE_LIMIT).ok();
    let (out, err) = (output(stdout), output(stderr));
    let text =
        |bytes: &Option<Vec<u8>>| String::from_utf8_lossy(bytes.as_deref().unwrap_or_default()).into_owned();
    let out_text = text(&out);
    // Through the harness's capture: shown when the test fails (or with `--nocapture`).
    eprint!("---- {name}, rerun alone: stdout ----\n{out_text}---- stderr ----\n{}", text(&err));

    assert!(!timed_out, "test {name} still ran alone after {RERUN_LIMIT:?} and was killed");
    assert!(status.success(), "test {name} failed when run alone ({status}); its output is above");
    assert!(
        out.is_some() && err.is_some(),
        "test {name} passed alone, but a process it started still held its output {PIPE_LIMIT:?} later"
    );
    assert!(
        out_text.contains("test result: ok. 1 passed;"),
        "the rerun of test {name} did not run exactly that test; its output is above"
    );
}
