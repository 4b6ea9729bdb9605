//! The fleet's notifications, on a connection and a thread of their own:
//! each one wakes the fleet thread, which then looks at the rows. A
//! notification is only ever a wake-up (any role may send one, and a
//! listener that was away missed some): the fleet thread also looks every
//! second, and after each reconnection here.

use std::sync::mpsc::{SyncSender, TrySendError};
use std::time::Duration;

use postgres::fallible_iterator::FallibleIterator;

use super::database;
use super::member::Order;
use super::tasks::CHANNEL;
use crate::config::fleet::FleetConfig;

/// Listens until the fleet thread is gone, reconnecting a second after
/// each loss.
pub fn listen(config: &FleetConfig, node: &str, orders: &SyncSender<Order>) {
    loop {
        match database::connect(config, node) {
            Ok(mut client) => {
                if let Err(err) = client.batch_execute(&format!("LISTEN {CHANNEL}")) {
                    log::debug!("fleet: cannot listen for notifications: {err}");
                } else {
                    // Whatever was said while away is looked at now.
                    if !wake(orders, "queued".into()) {
                        return;
                    }
                    let mut notifications = client.notifications();
                    let mut iter = notifications.blocking_iter();
                    loop {
                        match iter.next() {
                            Ok(Some(note)) => {
                                if !wake(orders, note.payload().to_owned()) {
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

/// Wakes the fleet thread; false when it is gone. A full queue drops the
/// wake: the fleet thread is busy and looks again within a second.
fn wake(orders: &SyncSender<Order>, what: String) -> bool {
    !matches!(
        orders.try_send(Order::Notified(what)),
        Err(TrySendError::Disconnected(_))
    )
}
