//! The task store of a kernel whose socket `AGENTOS_SOCKET` names is its
//! own, not the default kernel's: the variable makes another kernel as
//! much as `--socket` does. Alone in its binary because it sets an
//! environment variable, which no other test may see change.

use std::path::Path;

use agentos_kernel::config::tasks::TasksConfig;
use agentos_proto::socket_path::{default_socket_path, resolve_socket_path, SOCKET_ENV};

#[test]
fn a_socket_named_by_the_environment_gets_a_store_of_its_own() {
    let socket = Path::new("/tmp/agentos-private/agentos.sock");
    std::env::set_var(SOCKET_ENV, socket);
    // Clients and the daemon find the kernel through the variable...
    assert_eq!(resolve_socket_path(None), socket);
    // ...but it does not make that kernel the default one.
    assert_ne!(default_socket_path(), socket);
    let config = TasksConfig::default();
    let own = config.state_dir(socket);
    let default = config.state_dir(&default_socket_path());
    assert_ne!(own, default);
    assert_eq!(
        own.strip_prefix(&default).unwrap(),
        Path::new("sockets/tmp_agentos-private_agentos.sock")
    );
}
