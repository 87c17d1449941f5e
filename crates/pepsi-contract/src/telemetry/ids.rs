//! Trace and span ids as OpenTelemetry defines them (16 and 8 octets, never all zero),
//! written as lower-case hex in `state.trace` and on the wire. Pure but for `random`.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

macro_rules! hex_id {
    ($name:ident, $len:literal, $what:literal) => {
        #[doc = concat!("A ", $what, " id: ", stringify!($len), " octets, not all zero.")]
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name([u8; $len]);

        impl $name {
            /// A fresh random id.
            pub fn random() -> Self {
                loop {
                    let mut b = [0u8; $len];
                    // The kernel's generator does not fail on Linux after boot; an id of
                    // zeros is retried like a zero draw.
                    let _ = getrandom::fill(&mut b);
                    if b != [0u8; $len] {
                        return Self(b);
                    }
                }
            }

            /// The id of these octets; `None` when they are all zero.
            pub fn from_bytes(b: [u8; $len]) -> Option<Self> {
                (b != [0u8; $len]).then_some(Self(b))
            }

            /// The id of `bytes`, which must be exactly the id's length and not all zero.
            pub fn from_slice(bytes: &[u8]) -> Option<Self> {
                <[u8; $len]>::try_from(bytes)
                    .ok()
                    .and_then(Self::from_bytes)
            }

            pub fn to_bytes(self) -> [u8; $len] {
                self.0
            }

            /// Parses lower- or upper-case hex of exactly the id's length.
            pub fn parse(text: &str) -> Option<Self> {
                if text.len() != 2 * $len {
                    return None;
                }
                let mut b = [0u8; $len];
                for (i, out) in b.iter_mut().enumerate() {
                    *out = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
                }
                Self::from_bytes(b)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                for b in self.0 {
                    write!(f, "{b:02x}")?;
                }
                Ok(())
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({self})", stringify!($name))
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = String::deserialize(d)?;
                Self::parse(&text).ok_or_else(|| {
                    serde::de::Error::custom(format!(
                        "{} id {text:?} is not {} hex digits, not all zero",
                        $what,
                        2 * $len
                    ))
                })
            }
        }
    };
}

hex_id!(TraceId, 16, "trace");
hex_id!(SpanId, 8, "span");

impl TraceId {
    /// The trace of a row that carries no `state.trace` (one a stored function or a stage
    /// made rather than the ingress): derived from its queue id, so every pass over the row
    /// joins the same trace without writing to it. The first octets spell `pepsirw` so
    /// such a trace is told from a random one.
    pub fn of_row(queue_id: i64) -> Self {
        let mut b = [0u8; 16];
        b[..7].copy_from_slice(b"pepsirw");
        b[8..].copy_from_slice(&queue_id.to_be_bytes());
        Self(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse_and_print_as_hex_of_their_length_only() {
        for (text, ok) in [
            ("0af7651916cd43dd8448eb211c80319c", true),
            ("0AF7651916CD43DD8448EB211C80319C", true),
            ("00000000000000000000000000000000", false),
            ("0af7651916cd43dd8448eb211c80319", false),
            ("0af7651916cd43dd8448eb211c80319cc", false),
            ("0af7651916cd43dd8448eb211c80319g", false),
            ("", false),
        ] {
            let id = TraceId::parse(text);
            assert_eq!(id.is_some(), ok, "{text}");
            if let Some(id) = id {
                assert_eq!(id.to_string(), text.to_ascii_lowercase());
            }
        }
        assert!(SpanId::parse("b7ad6b7169203331").is_some());
        assert!(SpanId::parse("0000000000000000").is_none());
        assert!(SpanId::parse("b7ad6b716920333").is_none());
    }

    #[test]
    fn random_ids_differ_and_a_rows_trace_is_its_own() {
        assert_ne!(TraceId::random(), TraceId::random());
        assert_ne!(SpanId::random(), SpanId::random());
        assert_eq!(TraceId::of_row(7), TraceId::of_row(7));
        assert_ne!(TraceId::of_row(7), TraceId::of_row(8));
        let json = serde_json::to_string(&TraceId::of_row(1)).unwrap();
        assert_eq!(json, r#""70657073697277000000000000000001""#);
        assert!(serde_json::from_str::<SpanId>("\"zz\"").is_err());
    }
}
