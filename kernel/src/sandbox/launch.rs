//! The daemon's side of starting a sandbox: `clone3` into the requested
//! namespaces and, in the child, nothing but placing descriptors and
//! executing the daemon's own binary as the sandbox's init.
//!
//! Between `clone3` and `execve` the child is a copy of a multi-threaded
//! process: other threads' locks may be held forever, so it must not
//! allocate or lock. Everything it needs — argv, environment, the
//! descriptor table — is prepared before the clone, and the child only
//! makes raw system calls.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use agentos_proto::ErrorCode;
use nix::sys::socket::{sendmsg, socketpair, AddressFamily, MsgFlags, SockFlag, SockType};

use super::init;
use super::spec::{fds, Claim, ControlMessage, SandboxSpec};
use super::status::{Status, StatusReader};
use crate::cgroup::CgroupJoin;
use crate::fd;
use crate::process;

/// Descriptors are staged above this number before the clone, so that
/// placing them at their fixed numbers in the child never overwrites one
/// still to be placed.
const STAGING_FLOOR: RawFd = 100;

/// Starts sandboxes. One per daemon; it owns the lifeline.
#[derive(Debug)]
pub struct Launcher {
    init_program: CString,
    /// Every init holds a copy of the read end; only we hold the write end,
    /// so when the daemon dies, however it dies, every init sees it close.
    lifeline_read: OwnedFd,
    _lifeline_write: OwnedFd,
}

/// What to start.
#[derive(Debug)]
pub struct LaunchRequest {
    /// The sandbox's shape.
    pub spec: SandboxSpec,
    /// The cgroup to put the whole sandbox in, init included.
    pub cgroup: Option<CgroupJoin<File>>,
    /// With a user namespace: the host uid and gid that uid 0 inside maps to.
    pub map_to: Option<(u32, u32)>,
}

/// A started sandbox, prepared and waiting for its claim.
#[derive(Debug)]
pub struct Launched {
    /// The init's pid on the host.
    pub pid: i32,
    /// A pidfd for the init: readable when it exits.
    pub pidfd: OwnedFd,
    /// The init's status lines.
    pub status: StatusReader,
    /// Where the claim goes.
    pub control: Control,
}

/// The daemon's end of a sandbox's control socket.
#[derive(Debug)]
pub struct Control {
    socket: OwnedFd,
}

impl Control {
    /// Hands the sandbox its workload, the log its output goes to and, if
    /// given, the workload's channel to the daemon (see `fds::CHANNEL`). The
    /// claim travels in a memfd, so its size is never a concern, and the
    /// send never blocks: each control socket carries three small messages.
    pub fn claim(&self, claim: &Claim, log: &File) -> io::Result<()> {
        self.claim_with_channel(claim, log, None)
    }

    /// [`claim`](Self::claim), handing the workload `channel` too.
    pub fn claim_with_channel(
        &self,
        claim: &Claim,
        log: &File,
        channel: Option<BorrowedFd<'_>>,
    ) -> io::Result<()> {
        let memfd = json_memfd(c"agentos-claim", claim)?;
        let mut fds = vec![memfd.as_fd(), log.as_fd()];
        fds.extend(channel);
        fd::send_with_fds(self.socket.as_fd(), ControlMessage::Claim.tag(), &fds)?;
        Ok(())
    }

    /// Lets the claimed sandbox start its workload: its cgroup is ready.
    pub fn start(&self) -> io::Result<()> {
        sendmsg::<()>(
            self.socket.as_raw_fd(),
            &[IoSlice::new(ControlMessage::Start.tag())],
            &[],
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
            None,
        )?;
        Ok(())
    }
}

impl Launcher {
    /// A launcher that executes `init_program` (the daemon itself:
    /// `/proc/self/exe`) in the init role.
    pub fn new(init_program: &Path) -> io::Result<Launcher> {
        let (lifeline_read, lifeline_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        Ok(Launcher {
            init_program: CString::new(init_program.as_os_str().as_bytes())
                .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
            lifeline_read,
            _lifeline_write: lifeline_write,
        })
    }

    /// Starts a sandbox. Returns once the init is running, has been told to
    /// go and is in its cgroup; it then prepares its root and waits for a
    /// claim (see [`Control::claim`]). How that goes is reported on the
    /// status pipe.
    pub fn launch(&self, request: LaunchRequest) -> io::Result<Launched> {
        let spec_fd = json_memfd(c"agentos-spec", &request.spec)?;
        let (status_read, status_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let (control, control_init) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )?;
        let dev_null = File::options().read(true).write(true).open("/dev/null")?;

        // Where each descriptor must end up in the child.
        let placement: Vec<(RawFd, RawFd)> = vec![
            (dev_null.as_raw_fd(), 0),
            (dev_null.as_raw_fd(), 1),
            (dev_null.as_raw_fd(), 2),
            (spec_fd.as_raw_fd(), fds::SPEC),
            (status_write.as_raw_fd(), fds::STATUS),
            (control_init.as_raw_fd(), fds::CONTROL),
            (self.lifeline_read.as_raw_fd(), fds::LIFELINE),
        ];
        let staged: Vec<(OwnedFd, RawFd)> = placement
            .iter()
            .map(|(source, target)| Ok((stage(*source)?, *target)))
            .collect::<io::Result<_>>()?;
        let moves: Vec<(RawFd, RawFd)> =
            staged.iter().map(|(fd, t)| (fd.as_raw_fd(), *t)).collect();
        let first_free = fds::LIFELINE + 1;
        let join: Vec<RawFd> = match &request.cgroup {
            Some(CgroupJoin::JoinSelf(tasks)) => tasks.iter().map(AsRawFd::as_raw_fd).collect(),
            _ => Vec::new(),
        };
        let join_failure = Status::Error {
            code: ErrorCode::Internal,
            message: "the sandbox cannot join its cgroup".into(),
        }
        .encode();
        let (_, staged_status) = staged
            .iter()
            .map(|(fd, target)| (*target, fd.as_raw_fd()))
            .find(|(target, _)| *target == fds::STATUS)
            .expect("the status pipe is always placed");
        let cgroup_join = CgroupSelfJoin {
            tasks: &join,
            report_to: staged_status,
            failure: join_failure.as_bytes(),
        };

        let argv0 = CString::from(c"agentosd");
        let argv1 =
            CString::new(init::ARG).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let argv = [argv0.as_ptr(), argv1.as_ptr(), std::ptr::null()];
        let envp = [std::ptr::null::<libc::c_char>()];

        let mut pidfd: RawFd = -1;
        let mut args = CloneArgs {
            flags: libc::CLONE_PIDFD as u64 | CLONE_CLEAR_SIGHAND | namespace_flags(&request.spec),
            pidfd: &mut pidfd as *mut RawFd as u64,
            exit_signal: libc::SIGCHLD as u64,
            ..CloneArgs::default()
        };
        if let Some(CgroupJoin::Into(dir)) = &request.cgroup {
            args.flags |= CLONE_INTO_CGROUP;
            args.cgroup = dir.as_raw_fd() as u64;
        }
        // SAFETY: clone3 with a fully initialised argument struct and no
        // new stack (fork semantics). In the child, only async-signal-safe
        // system calls run on data prepared above, ending in execve or _exit.
        let pid = unsafe {
            libc::syscall(
                libc::SYS_clone3,
                &mut args as *mut CloneArgs,
                std::mem::size_of::<CloneArgs>(),
            )
        };
        if pid == 0 {
            // SAFETY: see above: raw syscalls only, then exec or exit.
            unsafe {
                child(
                    &cgroup_join,
                    &moves,
                    first_free,
                    &self.init_program,
                    &argv,
                    &envp,
                )
            }
        }
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        let pid = pid as i32;
        // SAFETY: clone3 stored a fresh pidfd for us in `pidfd`.
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
        drop(staged);
        drop(status_write);
        drop(control_init);

        let started = (|| {
            if let Some((uid, gid)) = request.map_to {
                write_id_maps(pid, uid, gid)?;
            }
            nix::sys::socket::send(
                control.as_raw_fd(),
                ControlMessage::Go.tag(),
                MsgFlags::MSG_NOSIGNAL,
            )?;
            Ok::<(), io::Error>(())
        })();
        if let Err(err) = started {
            let _ = process::signal(pidfd.as_fd(), libc::SIGKILL);
            return Err(err);
        }
        Ok(Launched {
            pid,
            pidfd,
            status: StatusReader::new(status_read)?,
            control: Control { socket: control },
        })
    }
}

/// Reset every signal handler to default in the child (Linux 5.5): a
/// handler of the daemon's must never run between clone and exec.
const CLONE_CLEAR_SIGHAND: u64 = 0x1_0000_0000;
/// Start the child in the cgroup whose directory is `clone_args.cgroup`
/// (Linux 5.7, cgroup v2).
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `struct clone_args` of clone3(2).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

fn namespace_flags(spec: &SandboxSpec) -> u64 {
    let ns = &spec.namespaces;
    [
        (ns.user, libc::CLONE_NEWUSER),
        (ns.pid, libc::CLONE_NEWPID),
        (ns.net, libc::CLONE_NEWNET),
        (ns.mount, libc::CLONE_NEWNS),
        (ns.uts, libc::CLONE_NEWUTS),
        (ns.ipc, libc::CLONE_NEWIPC),
    ]
    .into_iter()
    .filter(|(on, _)| *on)
    .fold(0, |flags, (_, flag)| flags | flag as u64)
}

/// The v1 cgroups the child moves itself into, and how it says it could not.
struct CgroupSelfJoin<'a> {
    /// `tasks` files, one per hierarchy.
    tasks: &'a [RawFd],
    /// The status pipe, at its staged number.
    report_to: RawFd,
    /// The status line to write there on failure.
    failure: &'a [u8],
}

/// The child between clone3 and execve.
///
/// # Safety
/// Must only be called in the child of clone3; never returns.
unsafe fn child(
    cgroup: &CgroupSelfJoin<'_>,
    moves: &[(RawFd, RawFd)],
    first_free: RawFd,
    program: &CString,
    argv: &[*const libc::c_char; 3],
    envp: &[*const libc::c_char; 1],
) -> ! {
    // SAFETY: raw system calls on descriptors staged above every target,
    // so no dup2 overwrites a descriptor still to be moved; dup2 leaves the
    // targets without close-on-exec. The cgroup files are written before
    // any dup2 can replace them.
    unsafe {
        // This child is a single thread writing its own id (0), which is
        // what keeps the move cheap (see `CgroupJoin::JoinSelf`).
        for tasks in cgroup.tasks {
            if libc::write(*tasks, b"0".as_ptr().cast(), 1) != 1 {
                libc::write(
                    cgroup.report_to,
                    cgroup.failure.as_ptr().cast(),
                    cgroup.failure.len(),
                );
                libc::_exit(124);
            }
        }
        for (source, target) in moves {
            if libc::dup2(*source, *target) < 0 {
                libc::_exit(126);
            }
        }
        // Anything else this process had open stays behind at exec.
        libc::syscall(
            libc::SYS_close_range,
            first_free as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        );
        // Exec only after the daemon's go: in a new user namespace it first
        // writes the id maps, and an execve before that would run as the
        // overflow uid and drop every capability the init needs.
        let mut go = [0u8; 16];
        loop {
            let received = libc::recv(fds::CONTROL, go.as_mut_ptr().cast(), go.len(), 0);
            if received > 0 {
                if ControlMessage::Go.is(&go[..received as usize]) {
                    break;
                }
                // Anything else is not the daemon's word to go.
                libc::_exit(125);
            }
            if received == 0 {
                // The daemon gave up on this sandbox.
                libc::_exit(0);
            }
            if *libc::__errno_location() != libc::EINTR {
                libc::_exit(125);
            }
        }
        libc::execve(program.as_ptr(), argv.as_ptr(), envp.as_ptr());
        libc::_exit(127)
    }
}

/// A close-on-exec duplicate of `fd` numbered above every fixed target.
fn stage(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor we hold; the result is owned.
    let staged = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, STAGING_FLOOR) };
    if staged < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(staged) })
}

/// A memfd holding `value` as JSON, positioned at its start.
fn json_memfd(name: &std::ffi::CStr, value: &impl serde::Serialize) -> io::Result<OwnedFd> {
    let json = serde_json::to_vec(value).map_err(io::Error::other)?;
    process::memfd_with(name, &json)
}

/// Maps uid/gid 0 inside the child's user namespace to `uid`/`gid` outside.
fn write_id_maps(pid: i32, uid: u32, gid: u32) -> io::Result<()> {
    std::fs::write(format!("/proc/{pid}/setgroups"), "deny")?;
    std::fs::write(format!("/proc/{pid}/uid_map"), format!("0 {uid} 1"))?;
    std::fs::write(format!("/proc/{pid}/gid_map"), format!("0 {gid} 1"))?;
    Ok(())
}
