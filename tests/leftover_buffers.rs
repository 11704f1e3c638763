//! Host buffers leave nothing behind, however their program ends, and give their memory and
//! their file descriptor back when dropped; `sweep_stale_buffers` removes the `/dev/shm` names
//! that killed programs of earlier versions left.
//!
//! The program is this test binary again, started for [`child_program`] with a role: it builds
//! an L4 Worker with a SUB worker and a nested L3 Worker (with a SUB worker of its own), writes a
//! 64 MiB buffer from both SUB workers (so a child and a grandchild map it), prints the buffer's
//! memfd name, then ends as the role says (or, in the `handle` role, handles the terminal's
//! signals, runs its work again and closes). After each ending, within one second, no process
//! of its tree is left, no process holds or maps the buffer (so its memory is freed) and
//! nothing new is in `/dev/shm`.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use simpler::{
    HostFn, OrchFn, Orchestrator, Result as SimplerResult, TaskArgs, Worker, chip::CallConfig,
    memory::sweep_stale_buffers, status::Level,
};

/// Set, in the program a test starts, to the way it must end: `wait` (until a signal ends it),
/// `exit` (`std::process::exit` with the Worker and the buffer alive) or `abort`, the last two
/// once the test writes a line to its stdin, or `handle` (after the three terminal signals, the
/// work again and `close`).
const ROLE_ENV: &str = "SIMPLER_LEFTOVER_ROLE";

/// The buffer the program writes: 64 MiB.
const BUFFER_BYTES: usize = 64 << 20;

/// The nested L3's orchestration: fill the tensor with the scalar on its SUB worker.
fn l3_fill(orch: &mut Orchestrator<'_>, args: &TaskArgs, _: &CallConfig) -> SimplerResult<()> {
    let fill = HostFn::new("fill", fill).handle();
    let mut a = TaskArgs::new();
    a.output(args.tensor(0).expect("a tensor"))?.scalar(args.scalar_at(0).expect("a scalar"));
    orch.submit_sub(&fill, a).map(|_| ())
}

/// The signals a terminal sends to its whole foreground process group.
const TERMINAL_SIGNALS: [i32; 3] = [libc::SIGHUP, libc::SIGQUIT, libc::SIGINT];

/// The writing end of the pipe the `handle` role's signal handler writes to.
static SIGNALLED: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

#[expect(unsafe_code, reason = "write(2) from a signal handler has no safe wrapper")]
extern "C" fn on_terminal_signal(_: libc::c_int) {
    let fd = SIGNALLED.load(std::sync::atomic::Ordering::Relaxed);
    // SAFETY: write(2) is async-signal-safe; one byte from a static into the pipe made below.
    unsafe { libc::write(fd, b"s".as_ptr().cast(), 1) };
}

/// What a program that cleans up on Ctrl-C does (as the `ctrlc` or `signal-hook` crates would
/// set it up): its own handler for [`TERMINAL_SIGNALS`], which writes a byte to a pipe per
/// signal; returns the pipe's reading end.
#[expect(unsafe_code, reason = "pipe(2) and sigaction(2) have no safe wrapper in std")]
fn handle_terminal_signals() -> std::fs::File {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: pipe(2) writes two descriptors into the array, which outlives the call.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    SIGNALLED.store(fds[1], std::sync::atomic::Ordering::Relaxed);
    for sig in TERMINAL_SIGNALS {
        // SAFETY: a zeroed sigaction with a handler that only calls write(2) (async-signal-safe);
        // the struct lives for the call.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_terminal_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            assert_eq!(libc::sigaction(sig, &action, std::ptr::null_mut()), 0);
        }
    }
    // SAFETY: fds[0] is the pipe's reading end, just made and owned by nothing else.
    unsafe { std::fs::File::from_raw_fd(fds[0]) }
}

/// Not a test of its own: does nothing unless a test below started this binary with
/// [`ROLE_ENV`] set.
#[test]
fn child_program() {
    let Some(role) = std::env::var(ROLE_ENV).ok() else { return };
    let signalled = (role == "handle").then(handle_terminal_signals);
    let mut l3 = Worker::builder().sub_workers(1).build().unwrap();
    l3.register(HostFn::new("fill", fill)).unwrap();
    let mut worker = Worker::builder().level(Level::Network1).sub_workers(1).worker(l3).build().unwrap();
    let fill_here = worker.register(HostFn::new("fill", fill)).unwrap();
    let nested = 0;
    let fill_below = worker.register_orch(OrchFn::new("l3_fill", l3_fill)).unwrap();
    worker.init().unwrap();
    let buf = worker.create_buffer(BUFFER_BYTES).unwrap();
    let words = BUFFER_BYTES / 8;
    let t = u64s(&buf, 0, words);
    // The buffer filled with `here` by the SUB worker, then with `below` by the nested one's.
    let fill_twice = |here: u64, below: u64| {
        worker.run(|orch| {
            let mut a = TaskArgs::new();
            a.output(&t)?.scalar(here);
            orch.submit_sub(&fill_here, a)?;
            let mut b = TaskArgs::new();
            b.output(&t)?.scalar(below);
            orch.submit_next_level(&fill_below, b, CallConfig::default(), nested)?;
            Ok(())
        })
    };
    fill_twice(7, 9).unwrap();
    assert_eq!(read_u64(&buf, words - 1, 1), vec![9], "written by the grandchild, after the child");
    let me = std::process::id() as i32;
    let label = memfd_users()
        .into_iter()
        .find(|(pid, label)| *pid == me && buffer_creator(label) == Some(me))
        .map(|(_, label)| label)
        .expect("this process holds its buffer's memfd");
    let mut out = std::io::stdout().lock();
    writeln!(out, "BUFFER {label}").unwrap();
    out.flush().unwrap();
    match role.as_str() {
        "handle" => {
            // Each terminal signal once (to the program's group and to each worker), then the
            // same work again: the Worker's processes are all still there, and the Worker
            // closes as usual.
            let mut got = [0u8; TERMINAL_SIGNALS.len()];
            std::io::Read::read_exact(&mut signalled.expect("handlers"), &mut got).unwrap();
            fill_twice(11, 13).expect("the Worker's processes outlive the terminal's signals");
            assert_eq!(read_u64(&buf, words - 1, 1), vec![13]);
            drop((t, buf)); // the closure's borrows end at its last use above
            worker.close().expect("the Worker closes");
        }
        "exit" | "abort" => {
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).unwrap();
            if role == "exit" {
                std::process::exit(0);
            }
            std::process::abort();
        }
        _ => loop {
            std::thread::park(); // until a signal ends it
        },
    }
}

/// The program started for [`child_program`], in a process group of its own: its group is
/// killed and it is reaped on drop, so a failing test leaves no process behind.
struct Program {
    child: std::process::Child,
    pid: i32,
    reaped: bool,
}

impl Program {
    /// Starts the program with `role`; returns it with its buffer's memfd name.
    fn start(role: &str) -> (Program, String) {
        let exe = std::env::current_exe().expect("the test binary");
        let mut child = Command::new(exe)
            .args(["child_program", "--exact", "--nocapture", "--test-threads=1"])
            .env(ROLE_ENV, role)
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the program");
        let pid = child.id() as i32;
        let stdout = child.stdout.take().expect("piped stdout");
        let mut program = Program { child, pid, reaped: false };
        let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
        let label = lines
            .by_ref()
            // libtest may print the test's name on the same line first.
            .find_map(|line| line.split_once("BUFFER ").map(|(_, l)| l.trim().to_string()))
            .unwrap_or_else(|| {
                program.reap();
                panic!("the program ended before naming its buffer")
            });
        // The rest is read and dropped, so a program that ends normally can still print.
        std::thread::spawn(move || lines.for_each(drop));
        (program, label)
    }

    /// Tells an `exit` or `abort` program to end.
    fn tell_to_end(&mut self) {
        let stdin = self.child.stdin.as_mut().expect("piped stdin");
        stdin.write_all(b"end\n").and_then(|()| stdin.flush()).expect("writing to the program");
    }

    fn reap(&mut self) -> std::process::ExitStatus {
        self.reaped = true;
        self.child.wait().expect("reaping the program")
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        if !self.reaped {
            // Its own process group; its workers, in groups of their own, follow it (their
            // parent-death signal).
            send_signal(-self.pid, libc::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// The live processes that hold or map the memfd `label`.
fn users_of(label: &str) -> Vec<i32> {
    let mut pids: Vec<i32> = memfd_users().into_iter().filter(|(_, l)| l == label).map(|(p, _)| p).collect();
    pids.dedup();
    pids
}

/// The `/dev/shm` names made by any of `pids`.
fn shm_names_of(pids: &[i32]) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| buffer_creator(name).is_some_and(|p| pids.contains(&p)))
                .collect()
        })
        .unwrap_or_default()
}

/// How the program is ended.
#[derive(Clone, Copy, Debug)]
enum Ending {
    /// This signal to the program.
    Signal(i32),
    /// This signal to the program's process group (Ctrl-C in a terminal).
    GroupSignal(i32),
    /// `std::process::exit(0)`.
    Exit,
    /// `std::process::abort()`.
    Abort,
    /// Ctrl-C, Ctrl-Backslash and a hang-up to the program's process group, which the program
    /// handles: it runs its work again and closes its Worker.
    Handled,
}

/// Starts the program, checks that its tree maps its buffer, ends it as `ending` says, and
/// checks that within one second of its death nothing of it is left.
fn ends_leaving_nothing(ending: Ending) {
    let role = match ending {
        Ending::Exit => "exit",
        Ending::Abort => "abort",
        Ending::Handled => "handle",
        _ => "wait",
    };
    let (mut program, label) = Program::start(role);
    assert_eq!(buffer_creator(&label), Some(program.pid), "{label}");
    // The program, its SUB worker, its nested Worker and that one's SUB worker.
    let tree = descendants(program.pid);
    assert!(tree.len() >= 4, "the program's tree: {tree:?}");
    let users = users_of(&label);
    assert!(users.contains(&program.pid), "the program holds its buffer: {users:?}");
    assert!(users.len() >= 3, "the program and both SUB workers map the buffer: {users:?} (tree {tree:?})");
    assert!(users.iter().all(|p| tree.contains(p)), "only the program's tree uses it: {users:?} vs {tree:?}");

    let expected_signal = match ending {
        Ending::Signal(sig) => {
            assert!(send_signal(program.pid, sig));
            Some(sig)
        }
        Ending::GroupSignal(sig) => {
            assert!(send_signal(-program.pid, sig));
            Some(sig)
        }
        Ending::Exit => {
            program.tell_to_end();
            None
        }
        Ending::Abort => {
            program.tell_to_end();
            Some(libc::SIGABRT)
        }
        Ending::Handled => {
            // To the program's group, as a terminal does. Its workers are in groups of their
            // own, which a terminal's signals do not reach; they are sent them too, one by one,
            // as if they were in the foreground group: they ignore them.
            for sig in TERMINAL_SIGNALS {
                assert!(send_signal(-program.pid, sig));
                for &worker in &tree[1..] {
                    assert!(send_signal(worker, sig), "worker process {worker} is gone");
                }
            }
            None
        }
    };
    let status = program.reap();
    let died = Instant::now();
    match expected_signal {
        Some(sig) => assert_eq!(status.signal(), Some(sig), "{ending:?}: {status:?}"),
        None => assert!(status.success(), "{ending:?}: {status:?}"),
    }
    // Processes first (cheap to poll, so the time measured is theirs), then who holds the buffer
    // (a scan of every process's descriptors and mappings).
    let deadline = died + Duration::from_secs(1);
    let tree_gone = spin_until(deadline, || tree.iter().all(|&p| !process_alive(p)));
    let tree_took = died.elapsed();
    if !(tree_gone && spin_until(deadline, || users_of(&label).is_empty())) {
        let alive: Vec<i32> = tree.iter().copied().filter(|&p| process_alive(p)).collect();
        panic!(
            "{ending:?}: one second after the program died, processes {alive:?} of its tree {tree:?} are alive and {:?} hold its buffer {label}",
            users_of(&label)
        );
    }
    eprintln!(
        "{ending:?}: the tree was gone {tree_took:?} after the program was reaped, its buffer {:?} after",
        died.elapsed()
    );
    assert!(shm_names_of(&tree).is_empty(), "{ending:?}: /dev/shm names left: {:?}", shm_names_of(&tree));
}

#[isolated_test]
fn a_program_killed_by_sigkill_leaves_nothing() {
    ends_leaving_nothing(Ending::Signal(libc::SIGKILL));
}

#[isolated_test]
fn a_program_ended_by_sigterm_leaves_nothing() {
    ends_leaving_nothing(Ending::Signal(libc::SIGTERM));
}

#[isolated_test]
fn a_program_interrupted_by_ctrl_c_leaves_nothing() {
    ends_leaving_nothing(Ending::GroupSignal(libc::SIGINT));
}

/// The terminal's signals reach the foreground group, the program's, and not its workers (each
/// leads a process group of its own), which ignore them anyway: a program that handles them
/// (to finish its work and close) keeps its workers.
#[isolated_test]
fn a_program_that_handles_ctrl_c_finishes_its_work_with_its_workers_and_leaves_nothing() {
    ends_leaving_nothing(Ending::Handled);
}

#[isolated_test]
fn a_program_that_exits_without_dropping_leaves_nothing() {
    ends_leaving_nothing(Ending::Exit);
}

#[isolated_test]
fn a_program_that_aborts_leaves_nothing() {
    ends_leaving_nothing(Ending::Abort);
}

#[isolated_test]
fn dropped_buffers_give_back_their_descriptor_and_their_memory() {
    let (rig, [fill_h, noop_h]) = Rig::start(subs(1), [("fill", fill), ("noop", noop)]);
    let fill_with = |buf: &simpler::Buffer, v: u64| {
        let t = u64s(buf, 0, buf.nbytes() / 8);
        rig.run(|orch| {
            let mut a = TaskArgs::new();
            a.output(&t)?.scalar(v);
            orch.submit_sub(&fill_h, a).map(|_| ())
        })
        .unwrap();
    };
    let fds = || std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd").count();
    fill_with(&u64_buffer(&rig, 8), 1); // anything the first run opens, once
    let before = fds();
    let live: Vec<simpler::Buffer> = (0..8).map(|_| u64_buffer(&rig, 512)).collect();
    assert_eq!(fds(), before + 8, "one descriptor per live buffer");
    drop(live);
    assert_eq!(fds(), before, "a dropped buffer closes its descriptor");
    let mut large = Vec::new();
    for i in 0..40 {
        let buf = rig.create_buffer(2 << 20).unwrap(); // large: the child drops its mapping too
        fill_with(&buf, i);
        assert_eq!(read_u64(&buf, (2 << 20) / 8 - 1, 1), vec![i]);
        let id = buf.desc().identity();
        large.push(format!("sp-{:08x}-{}-b{}", id.owner() as u32, std::process::id(), id.buffer_id()));
    }
    assert_eq!(fds(), before, "create/drop cycles leave no descriptor");
    let mapped =
        || -> Vec<(i32, String)> { memfd_users().into_iter().filter(|(_, l)| large.contains(l)).collect() };
    assert!(!mapped().is_empty(), "the SUB worker still maps the last large buffers");
    // The SUB worker looks for dropped large buffers every few tasks: after enough, nothing
    // holds or maps any of them, so their memory is freed. (Small ones wait for its cache.)
    for _ in 0..20 {
        rig.run(|orch| orch.submit_sub(&noop_h, TaskArgs::new()).map(|_| ())).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    assert!(spin_until(deadline, || mapped().is_empty()), "still mapped: {:?}", mapped());
}

#[isolated_test]
fn the_sweep_removes_names_of_dead_processes_left_by_earlier_versions() {
    // A process that has ended (reaped): its pid names no process, unless reused meanwhile,
    // which the sweep's start-time rule then tells apart.
    let mut gone = Command::new("true").spawn().expect("starting `true`");
    let dead = gone.id() as i32;
    gone.wait().unwrap();
    let me = std::process::id() as i32;
    let stale = format!("sp-0a1b2c3d-{dead}-b1");
    let alive = format!("sp-0a1b2c3d-{me}-b2");
    let other = format!("not-simpler-{dead}");
    struct Unlink(Vec<String>);
    impl Drop for Unlink {
        fn drop(&mut self) {
            for name in &self.0 {
                let _ = std::fs::remove_file(format!("/dev/shm/{name}"));
            }
        }
    }
    let _cleanup = Unlink(vec![stale.clone(), alive.clone(), other.clone()]);
    for name in [&stale, &alive, &other] {
        std::fs::write(format!("/dev/shm/{name}"), vec![1u8; 4096]).unwrap();
    }
    let exists = |name: &str| std::path::Path::new("/dev/shm").join(name).exists();
    let report = sweep_stale_buffers().unwrap();
    assert!(!exists(&stale), "a dead process's name is removed: {report:?}");
    // (Another program's sweep may have come first.)
    if report.removed.contains(&stale) {
        assert!(report.bytes_freed >= 4096, "{report:?}");
    }
    assert!(exists(&alive), "a live process's name is kept: {report:?}");
    assert!(report.kept >= 1, "{report:?}");
    assert!(exists(&other), "a name this library does not make is left alone");
}
