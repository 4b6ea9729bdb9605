//! `agentos top`'s tasks and tool-servers views.

use agentos_proto::payload::{ServerInfo, TaskInfo};

use crate::format::cut;

/// The tasks table: newest first, with the last line each has printed.
pub fn tasks_table(tasks: &[TaskInfo], room: usize) -> Vec<String> {
    let mut lines = vec![format!(
        "{:<20} {:<7} {:<11} {:<21} {:<16} LAST OUTPUT",
        "TASK", "KIND", "STATE", "CREATED", "LABEL"
    )];
    rows(&mut lines, tasks.len(), room, "(no tasks)", |n| {
        let task = &tasks[n];
        let last = task
            .progress
            .as_ref()
            .and_then(|progress| progress.output.lines().last())
            .unwrap_or("");
        format!(
            "{:<20} {:<7} {:<11} {:<21} {:<16} {last}",
            task.task_id,
            task.kind.as_str(),
            task.state.as_str(),
            task.created_at,
            cut(task.label.as_deref().unwrap_or(""), 16),
        )
    });
    lines
}

/// The tool servers table: state, tool count, and why one failed.
pub fn servers_table(servers: &[ServerInfo], room: usize) -> Vec<String> {
    let mut lines = vec![format!(
        "{:<24} {:<9} {:>6}  ERROR",
        "SERVER", "STATE", "TOOLS"
    )];
    rows(&mut lines, servers.len(), room, "(no tool servers)", |n| {
        let server = &servers[n];
        format!(
            "{:<24} {:<9} {:>6}  {}",
            server.name,
            server.state,
            server.tools,
            server.error.as_deref().unwrap_or(""),
        )
    });
    lines
}

/// Appends `count` rows made by `row` below a header already in `lines`,
/// as many as `room` lines hold (the last saying how many more there are).
pub fn rows(
    lines: &mut Vec<String>,
    count: usize,
    room: usize,
    none: &str,
    mut row: impl FnMut(usize) -> String,
) {
    // The header is one of the `room` lines.
    let room = room.saturating_sub(1);
    for n in 0..count {
        if n + 1 == room && count > room {
            lines.push(format!("… {} more", count - n));
            return;
        }
        lines.push(row(n).trim_end().to_owned());
    }
    if count == 0 {
        lines.push(none.to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_show_state_label_and_their_last_output_line() {
        let tasks: [TaskInfo; 1] = [serde_json::from_str(
            r#"{"task_id": "t-9", "kind": "exec", "state": "running",
                "created_at": "2026-11-26T08:00:00Z", "label": "crawl",
                "started_at": null, "finished_at": null,
                "progress": {"output": "page 1\npage 2\n"}}"#,
        )
        .unwrap()];
        let lines = tasks_table(&tasks, 10);
        assert!(lines[0].starts_with("TASK"), "{lines:?}");
        let words: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            words,
            [
                "t-9",
                "exec",
                "running",
                "2026-11-26T08:00:00Z",
                "crawl",
                "page",
                "2"
            ]
        );
        assert_eq!(tasks_table(&[], 10)[1], "(no tasks)");
    }

    #[test]
    fn servers_show_state_tools_and_error_and_a_long_list_is_cut() {
        let servers: Vec<ServerInfo> = (0..10)
            .map(|n| ServerInfo {
                name: format!("s{n}"),
                state: "failed".into(),
                tools: 0,
                error: Some("exited with code 1".into()),
            })
            .collect();
        let lines = servers_table(&servers, 5);
        assert_eq!(lines.len(), 5, "{lines:?}");
        let words: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(words, ["s0", "failed", "0", "exited", "with", "code", "1"]);
        assert_eq!(lines[4], "… 7 more");
    }
}
