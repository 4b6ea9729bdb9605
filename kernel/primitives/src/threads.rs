//! Every thread the daemons start is started here.
//!
//! A thread that panics otherwise dies with a line on stderr, which a
//! daemon's log never sees: the only trace of a pool that lost a worker,
//! or of a writer that stopped writing, would be what stopped working.
//! So each thread gets a name (which `top -H`, a core dump and the log all
//! show) and its panic is written to the log, with that name, before it
//! unwinds on. The panic still ends the thread as before: whoever joins it
//! sees the `Err` it always saw.
//!
//! ```
//! let handle = agentos_primitives::threads::spawn("adder", || 2 + 2).unwrap();
//! assert_eq!(handle.join().unwrap(), 4);
//! ```

use std::any::Any;
use std::io;
use std::panic::{self, AssertUnwindSafe};
use std::thread::JoinHandle;

/// Starts a thread called `name` running `body`; if `body` panics, the
/// panic is logged (with the name) and goes on unwinding.
pub fn spawn<F, T>(name: impl Into<String>, body: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    Named::new(name).spawn(body)
}

/// A thread to be started: its name and, when the default is not wanted,
/// its stack size.
///
/// ```
/// use agentos_primitives::threads::Named;
///
/// let small = Named::new("small").stack_size(256 * 1024);
/// assert_eq!(small.spawn(|| "done").unwrap().join().unwrap(), "done");
/// ```
#[derive(Clone, Debug)]
pub struct Named {
    name: String,
    stack_size: Option<usize>,
}

impl Named {
    /// A thread called `name`, with the default stack.
    pub fn new(name: impl Into<String>) -> Named {
        Named {
            name: name.into(),
            stack_size: None,
        }
    }

    /// Gives it a stack of `bytes` (threads that only wait and call out
    /// need far less than the default, and a pool has many).
    pub fn stack_size(mut self, bytes: usize) -> Named {
        self.stack_size = Some(bytes);
        self
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The `index`th of a set of such threads, called `{name}-{index}`.
    pub fn numbered(&self, index: usize) -> Named {
        Named {
            name: format!("{}-{index}", self.name),
            stack_size: self.stack_size,
        }
    }

    /// Starts it running `body`.
    pub fn spawn<F, T>(self, body: F) -> io::Result<JoinHandle<T>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let mut builder = std::thread::Builder::new().name(self.name.clone());
        if let Some(bytes) = self.stack_size {
            builder = builder.stack_size(bytes);
        }
        let name = self.name;
        builder.spawn(move || match panic::catch_unwind(AssertUnwindSafe(body)) {
            Ok(value) => value,
            Err(payload) => {
                log::error!(
                    "thread {name} panicked: {}",
                    panic_message(payload.as_ref())
                );
                panic::resume_unwind(payload)
            }
        })
    }
}

/// What a panic said, when it said it with a string (as `panic!`,
/// `expect` and `unwrap` do).
pub fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(message) = payload.downcast_ref::<&str>() {
        message
    } else if let Some(message) = payload.downcast_ref::<String>() {
        message
    } else {
        "(no message)"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_has_its_name_and_returns_its_value() {
        let handle = spawn("primitives-named", || {
            std::thread::current().name().map(str::to_owned)
        })
        .unwrap();
        assert_eq!(handle.join().unwrap().as_deref(), Some("primitives-named"));
    }

    #[test]
    fn a_panic_still_reaches_whoever_joins_with_its_message() {
        let handle = Named::new("primitives-panics")
            .stack_size(128 * 1024)
            .spawn(|| -> u32 { panic!("on purpose") })
            .unwrap();
        let payload = handle.join().unwrap_err();
        assert_eq!(panic_message(payload.as_ref()), "on purpose");
    }

    #[test]
    fn a_formatted_panic_message_is_read_too() {
        let payload = panic::catch_unwind(|| panic!("{} {}", "formatted", 7)).unwrap_err();
        assert_eq!(panic_message(payload.as_ref()), "formatted 7");
        let payload = panic::catch_unwind(|| panic::panic_any(7u8)).unwrap_err();
        assert_eq!(panic_message(payload.as_ref()), "(no message)");
    }
}
