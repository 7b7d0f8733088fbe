//! The Redis keys of one deployment. Every key starts with the hash tag `{prefix}`, so a
//! Redis Cluster keeps them all on one slot and the multi-key scripts stay atomic there.

use sha2::{Digest, Sha256};

/// Key names under one deployment's prefix.
#[derive(Clone, Debug)]
pub struct Keys {
    tag: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Self {
        Self {
            tag: format!("{{{prefix}}}"),
        }
    }

    /// A tenant's GCRA state (its theoretical arrival time).
    pub fn rate(&self, tenant: &str) -> String {
        format!("{}:rate:{tenant}", self.tag)
    }

    /// A tenant's token budget: the charges, their tokens, and their sum.
    pub fn budget(&self, tenant: &str) -> [String; 3] {
        let base = format!("{}:budget:{tenant}", self.tag);
        [
            format!("{base}:charges"),
            format!("{base}:tokens"),
            format!("{base}:used"),
        ]
    }

    /// An upstream's ceiling: the leases held, the interactive requests waiting, and the
    /// channel a freed slot is announced on.
    pub fn ceiling(&self, upstream: &str) -> Ceiling {
        let base = format!("{}:ceiling:{upstream}", self.tag);
        Ceiling {
            leases: format!("{base}:leases"),
            waiting: format!("{base}:waiting"),
            freed: format!("{base}:freed"),
        }
    }
}

/// The keys of one upstream's ceiling.
#[derive(Clone, Debug)]
pub struct Ceiling {
    pub leases: String,
    pub waiting: String,
    pub freed: String,
}

/// A short, stable name for an upstream: its base URLs, sorted, hashed (every gateway in front
/// of the same engines names them alike, whatever order their policies list them in).
pub fn upstream_id(urls: &[String]) -> String {
    let mut sorted: Vec<&str> = urls.iter().map(|u| u.trim_end_matches('/')).collect();
    sorted.sort_unstable();
    sorted.dedup();
    let digest = Sha256::digest(sorted.join("\n").as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_carries_the_deployments_hash_tag() {
        let k = Keys::new("prod-eu");
        assert_eq!(k.rate("alice"), "{prod-eu}:rate:alice");
        assert!(k
            .budget("alice")
            .iter()
            .all(|x| x.starts_with("{prod-eu}:")));
        let c = k.ceiling("ab");
        for key in [&c.leases, &c.waiting, &c.freed] {
            assert!(key.starts_with("{prod-eu}:ceiling:ab:"), "{key}");
        }
    }

    #[test]
    fn the_upstream_id_ignores_order_and_trailing_slashes() {
        let a = upstream_id(&["http://a:8000".into(), "http://b:8000/".into()]);
        let b = upstream_id(&["http://b:8000".into(), "http://a:8000".into()]);
        assert_eq!(a, b);
        assert_eq!(a.len(), 16);
        assert_ne!(a, upstream_id(&["http://a:8000".into()]));
    }
}
