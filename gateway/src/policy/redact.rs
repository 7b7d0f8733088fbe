//! URLs as the gateway shows them back (in `/admin/policy`, validation errors, logs and the
//! reload alert): never with a secret a policy file may hold in one.

/// `url` with the password of its userinfo (`scheme://user:password@host`) replaced by `***`
/// (a Redis URL holds one for `requirepass`).
pub fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{path}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// `url`'s scheme and host only: no userinfo, and `/…` for whatever path or query follows (a
/// webhook URL's path is its secret, as Slack's `/services/T…/B…/X…`).
pub fn host_only(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let more = if end < rest.len() { "/…" } else { "" };
    match scheme {
        Some(s) => format!("{s}://{host}{more}"),
        None => format!("{host}{more}"),
    }
}

/// `text` with every URL in it (`scheme://` up to a quote, a blank or a comma) shown by
/// [`host_only`]: for messages that quote a value, such as the TOML parser's.
pub fn urls_in(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        // The scheme: the letters, digits and `+.-` before `://`.
        let start = rest[..at]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || "+.-".contains(c)))
            .map_or(0, |i| i + 1);
        let end = rest[at..]
            .find(|c: char| c.is_whitespace() || "\"'`,".contains(c))
            .map_or(rest.len(), |i| at + i);
        out.push_str(&rest[..start]);
        out.push_str(&host_only(&rest[start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// The policy as `/admin/policy` shows it: every URL that may hold a secret shown as validation
/// errors quote it: the Redis, upstream, Alertmanager and trace
/// collector URLs without the password of their userinfo (a Redis URL holds one for
/// `requirepass`), webhooks by their host alone (a webhook's path is its secret). Reading the
/// policy back needs none of them.
pub fn shown(policy: &super::Policy) -> serde_json::Value {
    let mut v = serde_json::to_value(policy).unwrap_or(serde_json::Value::Null);
    type Redact = fn(&str) -> String;
    let fields: [(&str, Redact); 5] = [
        ("/shared/redis_url", without_password),
        ("/upstream/urls", without_password),
        ("/alerts/alertmanager_urls", without_password),
        ("/alerts/webhooks", host_only),
        ("/traces/endpoint", without_password),
    ];
    for (pointer, redact) in fields {
        let Some(field) = v.pointer_mut(pointer) else {
            continue;
        };
        let urls: Vec<&mut serde_json::Value> = match field {
            serde_json::Value::Array(items) => items.iter_mut().collect(),
            one => vec![one],
        };
        for url in urls {
            if let Some(s) = url.as_str() {
                *url = serde_json::Value::String(redact(s));
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_admin_policy_shows_no_secret_a_url_holds() {
        let mut p = crate::policy::Policy::default();
        p.shared.redis_url = Some("redis://:r3dis@10.0.0.5:6379".into());
        p.upstream.urls = vec!["https://u:upstr3am@vllm:8000".into()];
        p.alerts.alertmanager_urls = vec!["http://am:al3rt@am:9093".into()];
        p.alerts.webhooks = vec!["https://hooks.slack.com/services/T0/B0/w3bhook".into()];
        p.traces.endpoint = Some("https://t:tr4ce@otel:4318".into());
        let shown = shown(&p).to_string();
        for secret in ["r3dis", "upstr3am", "al3rt", "w3bhook", "tr4ce"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("hooks.slack.com"), "{shown}");
        assert!(shown.contains("vllm:8000"), "{shown}");
    }

    #[test]
    fn urls_quoted_in_a_message_show_their_host_only() {
        assert_eq!(
            urls_in(
                r#"invalid type: string "https://hooks.slack.com/services/T0/B0/s3cret", expected a sequence"#
            ),
            r#"invalid type: string "https://hooks.slack.com/…", expected a sequence"#
        );
        assert_eq!(
            urls_in("a redis://:pw@h:6379/0 and http://u:p@x/y, z"),
            "a redis://h:6379/… and http://x/…, z"
        );
        assert_eq!(urls_in("no url here"), "no url here");
    }

    #[test]
    fn the_redis_password_is_not_shown() {
        for (url, shown) in [
            (
                "redis://:s3cret@10.0.0.5:6379/0",
                "redis://:***@10.0.0.5:6379/0",
            ),
            ("redis://app:p@ss@host:6379", "redis://app:***@host:6379"),
            ("rediss://user@host", "rediss://user@host"),
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
            ("redis://host/0?x=a:b@c", "redis://host/0?x=a:b@c"),
            ("not a url", "not a url"),
        ] {
            assert_eq!(without_password(url), shown, "{url}");
        }
    }

    #[test]
    fn a_webhook_shows_its_host_only() {
        for (url, shown) in [
            (
                "https://hooks.slack.com/services/T0/B0/s3cret",
                "https://hooks.slack.com/…",
            ),
            ("ftp://u:s3cret@host:21/x?y", "ftp://host:21/…"),
            ("http://host:8080", "http://host:8080"),
            ("hooks.slack.com/services/s3cret", "hooks.slack.com/…"),
            ("https://host?token=s3cret", "https://host/…"),
        ] {
            assert_eq!(host_only(url), shown, "{url}");
        }
    }
}
