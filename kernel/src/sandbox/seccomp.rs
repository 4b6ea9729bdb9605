//! The seccomp filter sandboxed code runs under: everything is allowed
//! except what sandboxed code never needs and what could reach past the
//! sandbox — mounting, tracing, loading kernel code or BPF, keyrings,
//! creating or entering namespaces, io_uring (whose operations never pass
//! through the filter), vsock sockets (which no namespace confines), and
//! the like — which fails with EPERM.
//!
//! `clone3` fails with ENOSYS instead: its flags live in memory a filter
//! cannot inspect, so it is refused outright, and ENOSYS makes glibc fall
//! back to `clone`, whose flags the filter does check. EPERM would make
//! thread creation fail.
//!
//! The filter is a decision tree over the call number rather than a list:
//! the kernel runs it for every call number when it is installed (to learn
//! which calls it may always allow) and again on each call it cannot
//! allow from that cache, so its depth, not its length, is what costs.
//! Other ABIs (32-bit x86 on x86_64, x32) are not allowed at all: the
//! process is killed, since their call numbers mean other calls.

/// System calls refused outright.
const DENIED: &[libc::c_long] = &[
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_kcmp,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_userfaultfd,
    libc::SYS_syslog,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_vhangup,
    libc::SYS_fanotify_init,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_iopl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_ioperm,
];

/// The socket family refused: vsock reaches the hypervisor and other
/// virtual machines, and no network namespace confines it.
const REFUSED_FAMILY: u32 = libc::AF_VSOCK as u32;

/// `clone` flags that create namespaces: refused. All live in the low 32
/// bits, the only ones `clone` reads.
const NAMESPACE_FLAGS: u32 = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWCGROUP) as u32;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;
/// x32 calls arrive with the native arch and this bit in the number.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

#[cfg(not(target_endian = "little"))]
compile_error!("the filter reads the low half of clone's flags at a little-endian offset");

/// Offsets into `struct seccomp_data`.
const NR_OFFSET: u32 = 0;
const ARCH_OFFSET: u32 = 4;
const ARG0_LOW_OFFSET: u32 = 16;

/// What becomes of a system call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Verdict {
    Allow,
    /// EPERM.
    Refuse,
    /// ENOSYS (clone3, so that glibc falls back to clone).
    Unsupported,
    /// Refused if the flags create a namespace, allowed otherwise.
    CheckCloneFlags,
    /// Refused if the family is [`REFUSED_FAMILY`], allowed otherwise.
    CheckSocketFamily,
}

/// What an exec host's zygote may do beyond a workload: make a user
/// namespace and, inside it, a set of namespaces and mounts per run, and
/// go back to its own PID namespace after making a run's (`setns` reaches
/// only namespaces its own user namespace owns: it holds no capability
/// anywhere else). Each run installs the whole filter on top before any
/// code arrives.
const NESTED_ALLOWED: [libc::c_long; 3] = [libc::SYS_unshare, libc::SYS_mount, libc::SYS_setns];

/// Calls that get anything but [`Verdict::Allow`], by number.
fn verdicts(nested: bool) -> Vec<(u32, Verdict)> {
    let mut table: Vec<(u32, Verdict)> = DENIED
        .iter()
        .filter(|nr| !(nested && NESTED_ALLOWED.contains(nr)))
        .map(|nr| (*nr as u32, Verdict::Refuse))
        .chain([
            (libc::SYS_clone as u32, Verdict::CheckCloneFlags),
            (libc::SYS_clone3 as u32, Verdict::Unsupported),
            (libc::SYS_socket as u32, Verdict::CheckSocketFamily),
            (libc::SYS_socketpair as u32, Verdict::CheckSocketFamily),
        ])
        .collect();
    table.sort_unstable();
    table
}

/// A compiled filter, ready to install.
#[derive(Debug, Clone)]
pub struct Filter {
    code: Vec<libc::sock_filter>,
}

impl Filter {
    /// The program as the kernel takes it: each instruction's `code` (u16),
    /// `jt`, `jf` (u8) and `k` (u32), in native byte order — for a process
    /// that installs it itself (an exec host's runs).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(self.code.len() * 8);
        for instruction in &self.code {
            bytes.extend_from_slice(&instruction.code.to_ne_bytes());
            bytes.push(instruction.jt);
            bytes.push(instruction.jf);
            bytes.extend_from_slice(&instruction.k.to_ne_bytes());
        }
        bytes
    }
}

/// Entries a leaf of the tree compares one by one.
const LEAF_SIZE: usize = 4;

/// Builds the filter sandboxed code runs under.
pub fn filter() -> Filter {
    filter_for(false)
}

/// Builds the filter; `nested`: the variant for an exec host's zygote
/// (see [`NESTED_ALLOWED`]).
pub fn filter_for(nested: bool) -> Filter {
    let mut code = vec![
        load(ARCH_OFFSET),
        jump(libc::BPF_JEQ, AUDIT_ARCH, 1, 0),
        ret(libc::SECCOMP_RET_KILL_PROCESS),
        load(NR_OFFSET),
    ];
    #[cfg(target_arch = "x86_64")]
    code.extend([
        jump(libc::BPF_JGE, X32_SYSCALL_BIT, 0, 1),
        ret(libc::SECCOMP_RET_KILL_PROCESS),
    ]);
    let mut exits = Vec::new();
    decide(&verdicts(nested), &mut code, &mut exits);

    // The verdicts, each after every jump to it (BPF jumps only forward).
    // The argument checks come first: the socket check jumps over the
    // clone check to the allow or the refusal; the clone check falls
    // through to the allow, or skips it to refuse.
    let socket_check = code.len();
    code.extend([
        load(ARG0_LOW_OFFSET),
        jump(libc::BPF_JEQ, REFUSED_FAMILY, 3, 2),
    ]);
    let clone_check = code.len();
    code.extend([
        load(ARG0_LOW_OFFSET),
        jump(libc::BPF_JSET, NAMESPACE_FLAGS, 1, 0),
    ]);
    let allow = code.len();
    code.push(ret(libc::SECCOMP_RET_ALLOW));
    let refuse = code.len();
    code.push(ret(libc::SECCOMP_RET_ERRNO | libc::EPERM as u32));
    let unsupported = code.len();
    code.push(ret(libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32));
    debug_assert_eq!((allow, refuse), (socket_check + 4, socket_check + 5));

    // Aim the tree's exits: a leaf's comparisons jump when true, and its
    // closing unconditional jump goes to the allow.
    for (at, verdict) in exits {
        let target = match verdict {
            Verdict::Allow => allow,
            Verdict::Refuse => refuse,
            Verdict::Unsupported => unsupported,
            Verdict::CheckCloneFlags => clone_check,
            Verdict::CheckSocketFamily => socket_check,
        };
        let offset = target - at - 1;
        let instruction = &mut code[at];
        if instruction.code == (libc::BPF_JMP | libc::BPF_JA) as u16 {
            instruction.k = offset as u32;
        } else {
            instruction.jt = u8::try_from(offset).expect("seccomp filter: jump too long");
        }
    }
    Filter { code }
}

/// Emits the decision for `table` (sorted by number) with the number in
/// the accumulator; records in `exits` the jumps still to aim at verdicts.
fn decide(
    table: &[(u32, Verdict)],
    code: &mut Vec<libc::sock_filter>,
    exits: &mut Vec<(usize, Verdict)>,
) {
    if table.len() <= LEAF_SIZE {
        for (nr, verdict) in table {
            exits.push((code.len(), *verdict));
            code.push(jump(libc::BPF_JEQ, *nr, 0, 0));
        }
        exits.push((code.len(), Verdict::Allow));
        code.push(jump(libc::BPF_JA, 0, 0, 0));
        return;
    }
    let (below, from) = table.split_at(table.len() / 2);
    let split = code.len();
    code.push(jump(libc::BPF_JGE, from[0].0, 0, 0));
    decide(below, code, exits);
    code[split].jt = u8::try_from(code.len() - split - 1).expect("seccomp filter: jump too long");
    decide(from, code, exits);
}

fn load(offset: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
        jt: 0,
        jf: 0,
        k: offset,
    }
}

fn jump(condition: u32, value: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: (libc::BPF_JMP | condition | libc::BPF_K) as u16,
        jt,
        jf,
        k: value,
    }
}

fn ret(value: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: (libc::BPF_RET | libc::BPF_K) as u16,
        jt: 0,
        jf: 0,
        k: value,
    }
}

/// Why the filter could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// The filter has more instructions than a BPF program may hold.
    #[error("seccomp filter too long: {instructions} instructions")]
    TooLong {
        /// How many it has.
        instructions: usize,
    },
    /// seccomp(2) refused it.
    #[error("cannot install the seccomp filter: {0}")]
    Install(#[source] std::io::Error),
}

/// Installs the filter on the calling thread (and so on everything it
/// forks). Needs no_new_privs or CAP_SYS_ADMIN.
pub fn install(filter: &Filter) -> Result<(), SeccompError> {
    let instructions = filter.code.len();
    let program = libc::sock_fprog {
        len: u16::try_from(instructions).map_err(|_| SeccompError::TooLong { instructions })?,
        filter: filter.code.as_ptr().cast_mut(),
    };
    // SAFETY: seccomp(2) reads the program, which outlives the call.
    let installed = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            &program as *const libc::sock_fprog,
        )
    };
    if installed != 0 {
        return Err(SeccompError::Install(std::io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the filter the way the kernel does, for one call; returns the
    /// action and how many instructions ran.
    fn run(filter: &Filter, arch: u32, nr: u32, arg0: u64) -> (u32, usize) {
        let data = |offset: u32| match offset {
            NR_OFFSET => nr,
            ARCH_OFFSET => arch,
            ARG0_LOW_OFFSET => arg0 as u32,
            other => panic!("the filter reads offset {other}"),
        };
        let (mut pc, mut accumulator, mut steps) = (0usize, 0u32, 0usize);
        loop {
            let op = filter.code[pc];
            steps += 1;
            let code = op.code as u32;
            pc += 1;
            match code {
                c if c == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS => accumulator = data(op.k),
                c if c == libc::BPF_RET | libc::BPF_K => return (op.k, steps),
                c if c == libc::BPF_JMP | libc::BPF_JA => pc += op.k as usize,
                c if c & 0x07 == libc::BPF_JMP => {
                    let taken = match c & 0xf0 {
                        x if x == libc::BPF_JEQ => accumulator == op.k,
                        x if x == libc::BPF_JGE => accumulator >= op.k,
                        x if x == libc::BPF_JSET => accumulator & op.k != 0,
                        other => panic!("unexpected jump {other:#x}"),
                    };
                    pc += if taken { op.jt } else { op.jf } as usize;
                }
                other => panic!("unexpected instruction {other:#x}"),
            }
        }
    }

    const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
    const EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
    const ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
    const KILL: u32 = libc::SECCOMP_RET_KILL_PROCESS;

    #[test]
    fn every_call_number_gets_its_verdict() {
        let filter = filter();
        for nr in 0..1024u32 {
            let expected = if DENIED.contains(&(nr as libc::c_long)) {
                EPERM
            } else if nr == libc::SYS_clone3 as u32 {
                ENOSYS
            } else {
                ALLOW
            };
            // clone with plain fork flags, and sockets of an ordinary
            // family, are allowed like any call.
            let arg0 = libc::SIGCHLD as u64;
            assert_ne!(arg0, libc::AF_VSOCK as u64);
            assert_eq!(run(&filter, AUDIT_ARCH, nr, arg0).0, expected, "call {nr}");
        }
    }

    #[test]
    fn an_exec_hosts_filter_lets_through_namespaces_and_mounts_and_nothing_more() {
        let (workload, host) = (filter(), filter_for(true));
        for nr in [libc::SYS_unshare, libc::SYS_mount, libc::SYS_setns] {
            assert_eq!(run(&workload, AUDIT_ARCH, nr as u32, 0).0, EPERM);
            assert_eq!(run(&host, AUDIT_ARCH, nr as u32, 0).0, ALLOW);
        }
        for nr in DENIED.iter().filter(|nr| !NESTED_ALLOWED.contains(nr)) {
            assert_eq!(run(&host, AUDIT_ARCH, *nr as u32, 0).0, EPERM, "{nr}");
        }
        // Runs install the workload's filter from its bytes.
        assert_eq!(workload.to_bytes().len(), workload.code.len() * 8);
    }

    #[test]
    fn clone_is_refused_exactly_when_it_asks_for_a_namespace() {
        let filter = filter();
        let clone = libc::SYS_clone as u32;
        let thread = (libc::CLONE_VM
            | libc::CLONE_FS
            | libc::CLONE_FILES
            | libc::CLONE_SIGHAND
            | libc::CLONE_THREAD
            | libc::CLONE_SYSVSEM
            | libc::CLONE_SETTLS
            | libc::CLONE_PARENT_SETTID
            | libc::CLONE_CHILD_CLEARTID) as u64;
        assert_eq!(run(&filter, AUDIT_ARCH, clone, thread).0, ALLOW);
        for flag in [
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWNS,
            libc::CLONE_NEWPID,
            libc::CLONE_NEWNET,
            libc::CLONE_NEWUTS,
            libc::CLONE_NEWIPC,
            libc::CLONE_NEWCGROUP,
        ] {
            let flags = libc::SIGCHLD as u64 | flag as u64;
            assert_eq!(run(&filter, AUDIT_ARCH, clone, flags).0, EPERM, "{flag:#x}");
        }
    }

    #[test]
    fn vsock_sockets_are_refused_and_other_families_allowed() {
        let filter = filter();
        for call in [libc::SYS_socket, libc::SYS_socketpair] {
            let call = call as u32;
            assert_eq!(
                run(&filter, AUDIT_ARCH, call, libc::AF_VSOCK as u64).0,
                EPERM
            );
            for family in [
                libc::AF_UNIX,
                libc::AF_INET,
                libc::AF_INET6,
                libc::AF_NETLINK,
            ] {
                assert_eq!(run(&filter, AUDIT_ARCH, call, family as u64).0, ALLOW);
            }
        }
    }

    #[test]
    fn io_uring_is_refused() {
        let filter = filter();
        for call in [
            libc::SYS_io_uring_setup,
            libc::SYS_io_uring_enter,
            libc::SYS_io_uring_register,
        ] {
            assert_eq!(run(&filter, AUDIT_ARCH, call as u32, 0).0, EPERM);
        }
    }

    #[test]
    fn other_abis_are_killed() {
        let filter = filter();
        const AUDIT_ARCH_I386: u32 = 0x4000_0003;
        assert_eq!(run(&filter, AUDIT_ARCH_I386, 1, 0).0, KILL);
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            run(
                &filter,
                AUDIT_ARCH,
                X32_SYSCALL_BIT | libc::SYS_mount as u32,
                0
            )
            .0,
            KILL
        );
    }

    #[test]
    fn the_tree_stays_shallow() {
        let filter = filter();
        let deepest = (0..1024u32)
            .map(|nr| run(&filter, AUDIT_ARCH, nr, 0).1)
            .max()
            .unwrap();
        // A list would run one comparison per refused call (about 50).
        assert!(deepest <= 16, "{deepest} instructions on the longest path");
    }

    /// Installs the filter in a forked child and reports what syscalls return.
    #[test]
    fn the_kernel_accepts_the_filter_and_applies_it() {
        // SAFETY: the child only makes raw system calls and exits; it never
        // returns into the test harness.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                let code = (|| {
                    // SAFETY: prctl with constant arguments.
                    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
                        return 10;
                    }
                    if install(&filter()).is_err() {
                        return 11;
                    }
                    let errno = || std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
                    // SAFETY: raw syscalls with harmless arguments; a clone
                    // that wrongly succeeds leaves its child at once.
                    unsafe {
                        if libc::syscall(libc::SYS_unshare, libc::CLONE_NEWNS) != -1
                            || errno() != libc::EPERM
                        {
                            return 12;
                        }
                        if libc::syscall(libc::SYS_clone3, 0, 0) != -1 || errno() != libc::ENOSYS {
                            return 13;
                        }
                        if libc::syscall(libc::SYS_ptrace, 0, 0, 0, 0) != -1
                            || errno() != libc::EPERM
                        {
                            return 14;
                        }
                        if libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM, 0) != -1
                            || errno() != libc::EPERM
                        {
                            return 18;
                        }
                        let flags = (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong;
                        match libc::syscall(libc::SYS_clone, flags, 0, 0, 0, 0) {
                            0 => libc::_exit(0),
                            -1 if errno() == libc::EPERM => {}
                            _ => return 15,
                        }
                        if libc::getpid() <= 0 {
                            return 16;
                        }
                        // Threads still work: glibc falls back from clone3 to clone.
                        if std::thread::spawn(|| 7).join().unwrap_or(0) != 7 {
                            return 17;
                        }
                    }
                    0
                })();
                // SAFETY: leaving the forked child without running destructors.
                unsafe { libc::_exit(code) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                let status = nix::sys::wait::waitpid(child, None).unwrap();
                assert_eq!(status, nix::sys::wait::WaitStatus::Exited(child, 0));
            }
        }
    }
}
