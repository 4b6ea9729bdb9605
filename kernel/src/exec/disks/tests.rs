//! The disks' room as owners share it, without disks: what is counted
//! against whom.

use agentos_proto::payload::DelegateName;

use super::*;

/// Disks under `dir` with no thread behind them: 1 GiB each, 4 GiB an
/// owner.
fn disks(dir: &Path) -> SessionDisks {
    SessionDisks {
        room: DiskRoom::new(dir.to_owned(), 1 << 30, 4 << 30),
        record_writes: RecordWrites::default(),
        stored: Stored::new(dir.join("sessions"), 1 << 30),
        templates: Templates::empty(dir.join("templates")),
        volumes: Volumes::empty(dir.join("volumes"), 1 << 30),
        snapshots: Snapshots::default(),
        agent_templates: HashMap::new(),
        template_bytes: 1 << 30,
        worker: None,
        unavailable: None,
        fleet_staging: FleetStaging::new(dir),
    }
}

#[test]
fn delegates_disks_count_against_their_operators_room_together() {
    let dir = tempfile::tempdir().unwrap();
    let mut disks = disks(dir.path());
    let mut made = 0;
    for n in 0..20 {
        // Two delegates of one uid, taking turns.
        let name = DelegateName::new(if n % 2 == 0 { "k1" } else { "k2" }).unwrap();
        let owner = Principal::Delegate { uid: 1000, name };
        let share = Share::Delegate(1000, name);
        match disks.create_volume((owner, share), &format!("v{n}"), Some(1 << 30)) {
            Ok(key) => {
                disks.volumes.made(&key, true);
                made += 1;
            }
            Err(refused) => {
                assert_eq!(refused.code, ErrorCode::LimitExceeded, "{}", refused.error);
                break;
            }
        }
    }
    assert_eq!(made, 4, "the uid's 4 GiB, whichever of its delegates asks");
    let operator = (Principal::Operator { uid: 1000 }, Share::Operator(1000));
    assert!(disks
        .create_volume(operator, "mine", Some(1 << 30))
        .is_err());
    let other = (Principal::Operator { uid: 1001 }, Share::Operator(1001));
    assert!(disks.create_volume(other, "theirs", Some(1 << 30)).is_ok());
}
