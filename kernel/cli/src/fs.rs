//! `agentos fs`: one of your sessions' files, as its code sees them —
//! listed (`ls`), looked at (`stat`), printed (`cat`), copied out (`get`)
//! and in (`put`), made (`mkdir`), moved (`mv`) and removed (`rm`).

use std::io::{Read, Write};
use std::path::PathBuf;

use agentos_proto::payload::{
    ExecCall, FileCall, FileEntry, FileEntryReply, FileList, FileListReply, FileMadeReply,
    FileMkdir, FileMove, FilePath, FileRead, FileReadReply, FileRemovedReply, FileType, FileWrite,
    MAX_WRITE_BYTES,
};
use agentos_proto::{Client, ErrorCode, ErrorReply};
use base64::Engine;

use crate::error::CliError;
use crate::raw::{ask_exec, Raw};

/// `agentos fs`'s subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum FsCommand {
    /// A directory's entries (with --depth, those below too)
    Ls {
        /// The session
        session: String,
        /// The directory (absolute in the session)
        path: String,
        /// Levels to descend, 1 to 16
        #[arg(short, long, default_value_t = 1)]
        depth: u32,
    },
    /// What a path is: its type, size, mode, owner and time
    Stat {
        /// The session
        session: String,
        /// The path
        path: String,
    },
    /// Print a file
    Cat {
        /// The session
        session: String,
        /// The file
        path: String,
    },
    /// Copy a file of the session out to LOCAL (`-`: standard output)
    Get {
        /// The session
        session: String,
        /// The file in the session
        path: String,
        /// Where it goes here
        local: PathBuf,
    },
    /// Copy LOCAL (`-`: standard input) into the session at PATH, written
    /// beside it and moved into place, its directories made
    Put {
        /// The session
        session: String,
        /// The file here
        local: PathBuf,
        /// Where it goes in the session
        path: String,
    },
    /// Make a directory
    Mkdir {
        /// The session
        session: String,
        /// The directory
        path: String,
        /// Make those above it too, and say nothing if it is there
        #[arg(short, long)]
        parents: bool,
    },
    /// Rename a path (across the session's disks too)
    Mv {
        /// The session
        session: String,
        /// What moves
        from: String,
        /// Where it goes
        to: String,
    },
    /// Remove a path, a directory with all it holds
    Rm {
        /// The session
        session: String,
        /// The path
        path: String,
    },
}

pub fn fs(client: &mut Client, command: FsCommand, json: bool) -> Result<(), CliError> {
    match command {
        FsCommand::Ls {
            session,
            path,
            depth,
        } => {
            let call = FileCall::List(FileList {
                session,
                path,
                depth: Some(depth),
            });
            let raw = ask(client, call)?;
            if json {
                return raw.print();
            }
            let reply: FileListReply = raw.decode()?;
            for entry in &reply.entries {
                println!("{}", entry_line(entry));
            }
            if reply.truncated {
                eprintln!("agentos: more entries than one reply gives; list deeper directories");
            }
            Ok(())
        }
        FsCommand::Stat { session, path } => {
            let raw = ask(client, FileCall::Stat(FilePath { session, path }))?;
            if json {
                return raw.print();
            }
            let reply: FileEntryReply = raw.decode()?;
            println!("{}", entry_line(&reply.entry));
            Ok(())
        }
        FsCommand::Cat { session, path } => copy_out(client, session, path, &mut std::io::stdout()),
        FsCommand::Get {
            session,
            path,
            local,
        } => match local.as_os_str() == "-" {
            true => copy_out(client, session, path, &mut std::io::stdout()),
            false => copy_out(client, session, path, &mut std::fs::File::create(&local)?),
        },
        FsCommand::Put {
            session,
            local,
            path,
        } => {
            let data = match local.as_os_str() == "-" {
                true => {
                    let mut data = Vec::new();
                    std::io::stdin().lock().read_to_end(&mut data)?;
                    data
                }
                false => std::fs::read(&local)?,
            };
            let raw = upload(client, &session, &path, &data)?;
            print_entry(raw, json)
        }
        FsCommand::Mkdir {
            session,
            path,
            parents,
        } => {
            let raw = ask(
                client,
                FileCall::Mkdir(FileMkdir {
                    session,
                    path,
                    parents,
                }),
            )?;
            if json {
                return raw.print();
            }
            let reply: FileMadeReply = raw.decode()?;
            match reply.created || parents {
                true => Ok(()),
                // As mkdir(1): without --parents, one there is an error.
                false => Err(CliError::Refused(ErrorReply::new(
                    ErrorCode::AlreadyExists,
                    format!("{} is there already", reply.entry.path),
                ))),
            }
        }
        FsCommand::Mv { session, from, to } => {
            let raw = ask(client, FileCall::Move(FileMove { session, from, to }))?;
            print_entry(raw, json)
        }
        FsCommand::Rm { session, path } => {
            let raw = ask(client, FileCall::Remove(FilePath { session, path }))?;
            if json {
                return raw.print();
            }
            let _: FileRemovedReply = raw.decode()?;
            Ok(())
        }
    }
}

fn ask(client: &mut Client, call: FileCall) -> Result<Raw, CliError> {
    ask_exec(
        client,
        &ExecCall::Files(call),
        None::<fn(String) -> CliError>,
    )
}

/// With `--json` the reply as sent, else its entry's line.
fn print_entry(raw: Raw, json: bool) -> Result<(), CliError> {
    if json {
        return raw.print();
    }
    let reply: FileEntryReply = raw.decode()?;
    println!("{}", entry_line(&reply.entry));
    Ok(())
}

/// `-rw-r--r-- nobody nogroup 12 2026-11-30T10:00:00Z /home/user/a.txt`
fn entry_line(entry: &FileEntry) -> String {
    let target = match (&entry.symlink_target, entry.kind) {
        (Some(target), FileType::Symlink) => format!(" -> {target}"),
        _ => String::new(),
    };
    format!(
        "{} {} {} {:>10} {} {}{target}",
        entry.permissions, entry.owner, entry.group, entry.size, entry.modified_at, entry.path
    )
}

/// A whole file of the session into `out`, a read (4 MiB at most) at a
/// time.
fn copy_out(
    client: &mut Client,
    session: String,
    path: String,
    out: &mut impl Write,
) -> Result<(), CliError> {
    let engine = base64::engine::general_purpose::STANDARD;
    let mut offset = 0;
    loop {
        let call = FileCall::Read(FileRead {
            session: session.clone(),
            path: path.clone(),
            offset,
            length: None,
        });
        let reply: FileReadReply = ask(client, call)?.decode()?;
        let bytes = engine
            .decode(&reply.data)
            .map_err(|err| CliError::Usage(format!("a read is not base64: {err}")))?;
        out.write_all(&bytes)?;
        offset += bytes.len() as u64;
        if reply.eof || bytes.is_empty() {
            return Ok(out.flush()?);
        }
    }
}

/// `data` into the session at `path`: written in parts beside it, then
/// moved into place (a failed upload leaves the old file, and removes its
/// part written).
fn upload(client: &mut Client, session: &str, path: &str, data: &[u8]) -> Result<Raw, CliError> {
    let engine = base64::engine::general_purpose::STANDARD;
    let mut suffix = [0u8; 6];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut suffix)?;
    let suffix: String = suffix.iter().map(|b| format!("{b:02x}")).collect();
    // Beside it, under a name short enough whatever its own is.
    let directory = path.rsplit_once('/').map_or("", |(directory, _)| directory);
    let partial = format!("{directory}/.agentos-upload-{suffix}");
    let written = (|| {
        let mut offset = 0;
        // One write even for no bytes: the file is made.
        for (index, part) in data
            .chunks(MAX_WRITE_BYTES)
            .chain(data.is_empty().then_some(&[][..]))
            .enumerate()
        {
            let call = FileCall::Write(FileWrite {
                session: session.to_owned(),
                path: partial.clone(),
                data: engine.encode(part),
                offset,
                truncate: true,
                parents: index == 0,
                metadata: None,
            });
            let _: FileEntryReply = ask(client, call)?.decode()?;
            offset += part.len() as u64;
        }
        ask(
            client,
            FileCall::Move(FileMove {
                session: session.to_owned(),
                from: partial.clone(),
                to: path.to_owned(),
            }),
        )
    })();
    if written.is_err() {
        let call = FileCall::Remove(FilePath {
            session: session.to_owned(),
            path: partial,
        });
        let _ = ask(client, call);
    }
    written
}
