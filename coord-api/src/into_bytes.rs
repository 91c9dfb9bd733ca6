//! [`IntoBytes`]: how the request builders take keys and values.

use bytes::Bytes;

/// A key or a value as the request builders take it: anything that becomes [`Bytes`]. Owned
/// bytes (`Bytes`, `Vec<u8>`, `String`) are taken without a copy, so a value kept as `Bytes`
/// and written again and again is never copied; borrowed ones are copied once.
///
/// ```
/// use coord_api::{Bytes, PutRequest};
/// let metadata = Bytes::from("10.0.0.1:80");
/// let put = PutRequest::new("hosts/a", metadata.clone());
/// // The same buffer, not a copy.
/// assert_eq!(put.value.as_ptr(), metadata.as_ptr());
/// ```
pub trait IntoBytes {
    /// The bytes.
    fn into_bytes(self) -> Bytes;
}

impl IntoBytes for Bytes {
    fn into_bytes(self) -> Bytes {
        self
    }
}

impl IntoBytes for &Bytes {
    fn into_bytes(self) -> Bytes {
        self.clone()
    }
}

impl IntoBytes for Vec<u8> {
    fn into_bytes(self) -> Bytes {
        Bytes::from(self)
    }
}

impl IntoBytes for String {
    fn into_bytes(self) -> Bytes {
        Bytes::from(self)
    }
}

impl IntoBytes for Box<[u8]> {
    fn into_bytes(self) -> Bytes {
        Bytes::from(self)
    }
}

impl IntoBytes for &[u8] {
    fn into_bytes(self) -> Bytes {
        Bytes::copy_from_slice(self)
    }
}

impl IntoBytes for &Vec<u8> {
    fn into_bytes(self) -> Bytes {
        Bytes::copy_from_slice(self)
    }
}

impl IntoBytes for &str {
    fn into_bytes(self) -> Bytes {
        Bytes::copy_from_slice(self.as_bytes())
    }
}

impl IntoBytes for &String {
    fn into_bytes(self) -> Bytes {
        Bytes::copy_from_slice(self.as_bytes())
    }
}

impl<const N: usize> IntoBytes for [u8; N] {
    fn into_bytes(self) -> Bytes {
        Bytes::copy_from_slice(&self)
    }
}

impl<const N: usize> IntoBytes for &[u8; N] {
    fn into_bytes(self) -> Bytes {
        Bytes::copy_from_slice(self)
    }
}
