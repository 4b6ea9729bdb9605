//! `agentos volume`: named disks of a fixed size — `create NAME [--size
//! SIZE]`, `ls`, `rm NAME` — and `--volume NAME:PATH[:ro]`, which mounts
//! one into a run (`agentos exec`) or an agent (`agentos spawn`).

use agentos_proto::payload::{
    check_mounts, ExecCall, VolumeInfo, VolumeMount, VolumeRemovedReply, VolumeReply, VolumesReply,
    MIN_VOLUME_BYTES,
};
use agentos_proto::Client;

use crate::error::CliError;
use crate::failure::usage;
use crate::format::human_size;
use crate::input::parse_size;
use crate::raw::{ask_exec, Raw};

#[derive(Debug, clap::Subcommand)]
pub enum VolumeCommand {
    /// Make volume NAME: an empty disk of a fixed size, yours until you
    /// remove it
    Create {
        name: String,
        /// Its size: bytes, or with K, M or G (at least 16M) [default: the
        /// kernel's, 1G]
        #[arg(long, value_name = "SIZE", value_parser = parse_size)]
        size: Option<u64>,
    },
    /// List your volumes, then those you were given
    Ls,
    /// Remove volume NAME and its files (a sandbox that has it mounted
    /// keeps it until it ends)
    Rm { name: String },
}

/// `--volume NAME:PATH[:ro]`, as `exec` and `spawn` take it.
#[derive(Debug, clap::Args)]
pub struct VolumeArgs {
    /// Mount volume NAME at PATH (/data, or beneath /data, /mnt or
    /// /workspace), read-only with :ro; repeat for more
    #[arg(long = "volume", value_name = "NAME:PATH[:ro]", value_parser = parse_mount)]
    volumes: Vec<VolumeMount>,
}

impl VolumeArgs {
    /// Checks the mounts as the kernel will (`what` is the request, EXEC
    /// or SPAWN), so a path refused, two that overlap or too many are
    /// named before anything is sent.
    pub fn check(&self, what: &str) -> Result<(), CliError> {
        check_mounts(what, "volumes", &self.volumes).map_err(|refusal| usage(refusal.error))
    }

    /// The request's `volumes`.
    pub fn mounts(self) -> Vec<VolumeMount> {
        self.volumes
    }
}

/// Why a `--volume` cannot be read.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadMount {
    /// No name, no path, or no `:` between them.
    #[error("{0:?} is not NAME:PATH[:ro] (e.g. data:/data, or data:/data:ro)")]
    NotASpec(String),
    /// What follows the path is neither `ro` nor `rw`.
    #[error("{mode:?} in {spec:?} is not a mode: ro (read-only) or rw (the default)")]
    UnknownMode { spec: String, mode: String },
}

/// `data:/data`, `data:/mnt/in:ro` or `data:/data:rw` as the mount it
/// names. Whether the path is one a volume may take is the kernel's rule
/// (`VolumeArgs::check`).
pub fn parse_mount(spec: &str) -> Result<VolumeMount, BadMount> {
    let mut parts = spec.splitn(3, ':');
    let (Some(name), Some(path)) = (parts.next(), parts.next()) else {
        return Err(BadMount::NotASpec(spec.to_owned()));
    };
    if name.is_empty() || path.is_empty() {
        return Err(BadMount::NotASpec(spec.to_owned()));
    }
    let read_only = match parts.next() {
        None | Some("rw") => false,
        Some("ro") => true,
        Some(mode) => {
            return Err(BadMount::UnknownMode {
                spec: spec.to_owned(),
                mode: mode.to_owned(),
            })
        }
    };
    Ok(VolumeMount {
        name: name.to_owned(),
        path: path.to_owned(),
        read_only,
    })
}

/// Asks the kernel for a volume operation; its reply as sent. A volume
/// the kernel does not know as the caller's is said in the CLI's words.
fn ask(client: &mut Client, call: &ExecCall) -> Result<Raw, CliError> {
    let volume = match call {
        ExecCall::RemoveVolume { volume } => Some(volume),
        _ => None,
    };
    let named = volume.map(|volume| {
        |message| CliError::NoSuchVolume {
            volume: volume.clone(),
            message,
        }
    });
    ask_exec(client, call, named)
}

pub fn volume(client: &mut Client, command: VolumeCommand, json: bool) -> Result<(), CliError> {
    match command {
        VolumeCommand::Create { name, size } => {
            if let Some(bytes) = size.filter(|bytes| *bytes < MIN_VOLUME_BYTES) {
                return Err(usage(format!(
                    "--size {bytes} is too small: a volume holds at least {} (its filesystem \
                     needs room for its own records)",
                    human_size(MIN_VOLUME_BYTES)
                )));
            }
            let call = ExecCall::CreateVolume {
                volume: name.clone(),
                bytes: size,
            };
            let raw = ask(client, &call)?;
            if json {
                return raw.print();
            }
            let reply: VolumeReply = raw.decode()?;
            println!(
                "volume '{name}' created: {} (agentos exec --volume {name}:/data ...)",
                human_size(reply.volume.bytes)
            );
        }
        VolumeCommand::Ls => {
            let raw = ask(client, &ExecCall::Volumes)?;
            if json {
                return raw.print();
            }
            let reply: VolumesReply = raw.decode()?;
            println!(
                "{:<24} {:>10} {:>10}  {:<21} ACCESS",
                "NAME", "SIZE", "USED", "CREATED"
            );
            for volume in &reply.volumes {
                println!(
                    "{:<24} {:>10} {:>10}  {:<21} {}",
                    volume.volume,
                    human_size(volume.bytes),
                    volume.used_bytes.map_or_else(|| "-".to_owned(), human_size),
                    volume.created_at,
                    access(volume)
                );
            }
            if reply.volumes.is_empty() {
                eprintln!("agentos: no volumes (agentos volume create NAME [--size SIZE])");
            }
        }
        VolumeCommand::Rm { name } => {
            let call = ExecCall::RemoveVolume {
                volume: name.clone(),
            };
            let raw = ask(client, &call)?;
            if json {
                return raw.print();
            }
            let reply: VolumeRemovedReply = raw.decode()?;
            if !reply.removed {
                return Err(CliError::NoSuchVolume {
                    volume: name,
                    message: "there is no such volume".into(),
                });
            }
            println!("volume '{name}' removed");
        }
    }
    Ok(())
}

/// Whose a volume is and how it may be used: `own rw`, `given ro`.
fn access(volume: &VolumeInfo) -> &'static str {
    match (volume.owned, volume.read_only) {
        (true, false) => "own rw",
        (true, true) => "own ro",
        (false, false) => "given rw",
        (false, true) => "given ro",
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Line {
        #[command(flatten)]
        volumes: VolumeArgs,
    }

    fn parsed(args: &[&str]) -> Result<VolumeArgs, clap::Error> {
        Line::try_parse_from(std::iter::once("exec").chain(args.iter().copied()))
            .map(|line| line.volumes)
    }

    fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
        VolumeMount {
            name: name.into(),
            path: path.into(),
            read_only,
        }
    }

    #[test]
    fn a_spec_is_a_name_a_path_and_an_optional_mode() {
        assert_eq!(parse_mount("data:/data"), Ok(mount("data", "/data", false)));
        assert_eq!(
            parse_mount("in:/mnt/in:ro"),
            Ok(mount("in", "/mnt/in", true))
        );
        assert_eq!(
            parse_mount("out:/workspace/out:rw"),
            Ok(mount("out", "/workspace/out", false))
        );
    }

    #[test]
    fn a_malformed_spec_is_refused_saying_what_a_spec_is() {
        for spec in ["data", "data:", ":/data", ""] {
            let err = parse_mount(spec).unwrap_err();
            assert_eq!(err, BadMount::NotASpec(spec.into()));
            assert!(err.to_string().contains("NAME:PATH[:ro]"), "{err}");
        }
        let err = parse_mount("data:/data:readonly").unwrap_err();
        assert_eq!(
            err.to_string(),
            r#""readonly" in "data:/data:readonly" is not a mode: ro (read-only) or rw (the default)"#
        );
        assert!(matches!(
            parse_mount("data:/a:b:ro"),
            Err(BadMount::UnknownMode { .. })
        ));
    }

    #[test]
    fn volume_repeats_and_a_bad_one_is_a_usage_error() {
        let args = parsed(&["--volume", "a:/data", "--volume", "b:/mnt/b:ro"]).expect("parsed");
        args.check("EXEC").expect("places volumes may go");
        assert_eq!(
            args.mounts(),
            [mount("a", "/data", false), mount("b", "/mnt/b", true)]
        );
        assert!(parsed(&["--volume", "data"]).is_err());
        assert!(parsed(&[]).expect("no volumes").mounts().is_empty());
    }

    #[test]
    fn a_path_the_kernel_would_refuse_is_named_before_anything_is_sent() {
        for (specs, word) in [
            (&["data:/proc/x"][..], "/proc"),
            (&["data:/etc"][..], "outside"),
            (&["a:/data", "b:/data/x"][..], "overlap"),
            (&["../x:/data"][..], "volumes.name"),
        ] {
            let args: Vec<&str> = specs.iter().flat_map(|spec| ["--volume", spec]).collect();
            let err = parsed(&args)
                .expect("read")
                .check("SPAWN")
                .expect_err("refused");
            assert!(err.is_usage(), "{err}");
            assert!(err.to_string().contains(word), "{specs:?}: {err}");
        }
    }

    #[test]
    fn access_says_whose_and_how() {
        let info = |owned, read_only| VolumeInfo {
            volume: "v".into(),
            bytes: MIN_VOLUME_BYTES,
            used_bytes: None,
            created_at: "2026-01-01T00:00:00Z".into(),
            owned,
            read_only,
        };
        assert_eq!(access(&info(true, false)), "own rw");
        assert_eq!(access(&info(false, true)), "given ro");
    }
}
