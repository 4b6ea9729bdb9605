//! The seccomp filter sandboxed code runs under: everything is allowed
//! except what sandboxed code never needs and what could reach past the
//! sandbox — mounting, tracing, loading kernel code or BPF, keyrings,
//! creating or entering namespaces, and the like — which fails with EPERM.
//!
//! `clone3` fails with ENOSYS instead: its flags live in memory a filter
//! cannot inspect, so it is refused outright, and ENOSYS makes glibc fall
//! back to `clone`, whose flags the filter does check. EPERM would make
//! thread creation fail.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

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
    #[cfg(target_arch = "x86_64")]
    libc::SYS_iopl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_ioperm,
];

/// `clone` flags that create namespaces: refused.
const NAMESPACE_FLAGS: [libc::c_int; 7] = [
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWNS,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWCGROUP,
];

#[cfg(target_arch = "x86_64")]
const ARCH: TargetArch = TargetArch::x86_64;
#[cfg(target_arch = "aarch64")]
const ARCH: TargetArch = TargetArch::aarch64;

/// The two filters, in the order to install them.
pub fn filters() -> Result<[BpfProgram; 2], seccompiler::BackendError> {
    let clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, vec![])]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        ARCH,
    )?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().map(|nr| (*nr, Vec::new())).collect();
    // clone's first argument holds the flags on every architecture we build for.
    let namespace_clones = NAMESPACE_FLAGS
        .iter()
        .map(|flag| {
            SeccompRule::new(vec![SeccompCondition::new(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(*flag as u64),
                *flag as u64,
            )?])
        })
        .collect::<Result<Vec<_>, _>>()?;
    rules.insert(libc::SYS_clone, namespace_clones);
    let denied = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        ARCH,
    )?;
    Ok([clone3.try_into()?, denied.try_into()?])
}

/// Installs both filters on the calling thread (and so on everything it
/// forks). Needs no_new_privs or CAP_SYS_ADMIN.
pub fn install(filters: &[BpfProgram; 2]) -> Result<(), String> {
    for filter in filters {
        seccompiler::apply_filter(filter)
            .map_err(|err| format!("cannot install the seccomp filter: {err}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_compile() {
        let [clone3, denied] = filters().unwrap();
        assert!(!clone3.is_empty());
        assert!(denied.len() > DENIED.len());
    }

    /// Installs the filter in a forked child and reports what syscalls return.
    #[test]
    fn denied_calls_fail_and_ordinary_ones_work() {
        // SAFETY: the child only makes raw system calls and exits; it never
        // returns into the test harness.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                let code = (|| {
                    // SAFETY: prctl with constant arguments.
                    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
                        return 10;
                    }
                    if install(&filters().unwrap()).is_err() {
                        return 11;
                    }
                    let errno = || std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
                    // SAFETY: raw syscalls with harmless arguments.
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
                        if libc::getpid() <= 0 {
                            return 15;
                        }
                        // Threads still work: glibc falls back from clone3 to clone.
                        if std::thread::spawn(|| 7).join().unwrap_or(0) != 7 {
                            return 16;
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
