//! Random bytes from the kernel's pool (/dev/urandom), which never blocks:
//! the reactor may ask at any time, even early at boot.

use std::fs::File;
use std::io::{self, Read};

/// Fills `buf` with random bytes.
pub fn fill(buf: &mut [u8]) -> io::Result<()> {
    File::open("/dev/urandom")?.read_exact(buf)
}

#[cfg(test)]
mod tests {
    #[test]
    fn fills_differently_each_time() {
        let (mut a, mut b) = ([0u8; 16], [0u8; 16]);
        super::fill(&mut a).unwrap();
        super::fill(&mut b).unwrap();
        assert_ne!(a, b);
    }
}
