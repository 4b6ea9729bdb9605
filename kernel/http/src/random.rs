//! Random bytes from the kernel's pool (/dev/urandom, which never
//! blocks), for the ids, keys and nonces the faces make.

use std::fs::File;
use std::io::{self, Read};

/// `N` random bytes.
pub fn bytes<const N: usize>() -> io::Result<[u8; N]> {
    let mut random = [0u8; N];
    File::open("/dev/urandom")?.read_exact(&mut random)?;
    Ok(random)
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn bytes_differ_each_time_and_hex_is_two_digits_a_byte() {
        assert_ne!(super::bytes::<16>().unwrap(), super::bytes::<16>().unwrap());
        assert_eq!(super::hex(&[0, 0xab]), "00ab");
    }
}
