//! Host buffers of a program that ends without dropping them: which endings leave their
//! `/dev/shm` names, and `sweep_stale_buffers`, which removes the names of dead processes (every
//! `Worker::init` runs it).
//!
//! The program is this test binary again, started for [`child_program`] with a role: it builds a
//! Worker, creates a buffer, prints the names it holds, then ends as the role says.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use simpler::sweep_stale_buffers;

/// Set, in the program a test starts, to the way it must end: `wait` (until killed) or `exit`
/// (`std::process::exit` with the Worker and the buffer alive).
const ROLE_ENV: &str = "SIMPLER_LEFTOVER_ROLE";

/// Not a test of its own: does nothing unless a test below started this binary with
/// [`ROLE_ENV`] set.
#[test]
fn child_program() {
    let Some(role) = std::env::var(ROLE_ENV).ok() else { return };
    let mut worker = subs(1).build().unwrap();
    worker.init().unwrap();
    let buf = worker.create_buffer(1 << 20).unwrap();
    buf.write(0, &[7u64; 512]).unwrap(); // backed by memory now
    let mut out = std::io::stdout().lock();
    writeln!(out, "NAMES {}", leftover_shm().join(" ")).unwrap();
    out.flush().unwrap();
    match role.as_str() {
        "exit" => std::process::exit(0),
        _ => loop {
            std::thread::park(); // until the test kills it
        },
    }
}

/// The program started for [`child_program`]: killed and reaped on drop, and every name it
/// made unlinked, so a failing test leaves nothing behind.
struct Program {
    child: std::process::Child,
    pid: i32,
    reaped: bool,
}

impl Program {
    /// Starts the program with `role`; returns it with the names of its buffers.
    fn start(role: &str) -> (Program, Vec<String>) {
        let exe = std::env::current_exe().expect("the test binary");
        let mut child = Command::new(exe)
            .args(["child_program", "--exact", "--nocapture", "--test-threads=1"])
            .env(ROLE_ENV, role)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the program");
        let pid = child.id() as i32;
        let stdout = child.stdout.take().expect("piped stdout");
        let mut program = Program { child, pid, reaped: false };
        let names = BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            // libtest may print the test's name on the same line first.
            .find_map(|line| {
                line.split_once("NAMES ").map(|(_, n)| n.split_whitespace().map(String::from).collect())
            })
            .unwrap_or_else(|| {
                program.reap();
                panic!("the program ended before naming its buffers")
            });
        (program, names)
    }

    fn reap(&mut self) -> std::process::ExitStatus {
        self.reaped = true;
        self.child.wait().expect("reaping the program")
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        for name in shm_of(self.pid) {
            let _ = std::fs::remove_file(format!("/dev/shm/{name}"));
        }
    }
}

fn exists(name: &str) -> bool {
    std::path::Path::new("/dev/shm").join(name).exists()
}

#[test]
fn a_killed_program_leaves_its_buffers_until_the_sweep_removes_them() {
    if !in_own_process() {
        return;
    }
    let rig = Rig::start(subs(1), []).0;
    let mine = u64_buffer(&rig, 8);
    let (mut program, names) = Program::start("wait");
    assert_eq!(names.len(), 1, "one buffer: {names:?}");
    assert!(names[0].contains(&format!("-{}-b", program.pid)), "{names:?}");

    // Both creators are alive: the sweep keeps every name of theirs.
    let report = sweep_stale_buffers().unwrap();
    assert!(report.kept >= 2, "{report:?}");
    assert!(exists(&names[0]) && !leftover_shm().is_empty(), "a live process's buffers are kept");

    sigkill(program.pid);
    wait_for("the program to die", Duration::from_secs(10), || !process_alive(program.pid));
    // Until its parent reaps it, the killed program still exists (a zombie): kept.
    assert!(sweep_stale_buffers().is_ok());
    assert!(exists(&names[0]), "SIGKILL leaves the name behind");
    let status = program.reap();
    assert!(!status.success(), "killed: {status:?}");
    assert!(exists(&names[0]), "nothing removes it by itself");

    let report = sweep_stale_buffers().unwrap();
    // (Another program's sweep may have come first.)
    if report.removed.contains(&names[0]) {
        assert!(report.bytes_freed >= 1 << 20, "{report:?}");
    }
    assert!(!exists(&names[0]), "the sweep removes a dead process's buffer");
    assert!(shm_of(program.pid).is_empty());
    assert_eq!(mine.read::<u64>(0, 1).unwrap(), vec![0], "this process's buffer is intact");
    assert_eq!(leftover_shm().len(), 1, "this live process's buffer is kept");
}

#[test]
fn a_program_that_exits_without_dropping_leaves_no_buffer() {
    if !in_own_process() {
        return;
    }
    let (mut program, names) = Program::start("exit");
    assert_eq!(names.len(), 1, "one buffer: {names:?}");
    let status = program.reap();
    assert!(status.success(), "std::process::exit(0): {status:?}");
    assert!(!exists(&names[0]), "exit unlinked {}", names[0]);
    assert!(shm_of(program.pid).is_empty());
}
