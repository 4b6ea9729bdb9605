//! The fleet's notifications, on a connection and a thread of their own:
//! each one wakes the fleet thread, which then looks at the rows. A
//! notification is only ever a wake-up (any role may send one, and a
//! listener that was away missed some): the fleet thread also looks every
//! second, and after each reconnection here.

use std::sync::mpsc::SyncSender;
use std::time::Duration;

use postgres::fallible_iterator::FallibleIterator;

use super::database;
use super::member::{self, Order};
use super::notes::Notes;
use super::tasks::CHANNEL;
use crate::config::fleet::FleetConfig;

/// Listens until the fleet thread is gone, reconnecting a second after
/// each loss.
pub fn listen(config: &FleetConfig, node: &str, notes: &Notes, orders: &SyncSender<Order>) {
    loop {
        match database::connect(config, node) {
            Ok(mut client) => {
                if let Err(err) = client.batch_execute(&format!("LISTEN {CHANNEL}")) {
                    log::debug!("fleet: cannot listen for notifications: {err}");
                } else {
                    // Whatever was said while away is looked at now.
                    if !member::wake(notes, orders, "queued") {
                        return;
                    }
                    let mut notifications = client.notifications();
                    let mut iter = notifications.blocking_iter();
                    loop {
                        match iter.next() {
                            Ok(Some(note)) => {
                                if !member::wake(notes, orders, note.payload()) {
                                    return;
                                }
                            }
                            Ok(None) => break,
                            Err(err) => {
                                log::debug!("fleet: notifications stopped: {err}");
                                break;
                            }
                        }
                    }
                }
            }
            Err(err) => log::debug!("fleet: cannot connect to listen: {err}"),
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}
