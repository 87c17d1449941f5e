//! Where a post sits in its list's archive: its parent, its thread, the placeholders its
//! unknown ancestors become and the placeholder it replaces. public-inbox style: only
//! References and In-Reply-To link posts, never a subject. Pure: the caller looks up what
//! the archive knows of the ids involved (by url id) and carries out the [`Decision`].

use std::collections::HashMap;

use sha2::{Digest as _, Sha256};

use crate::url::{self, MAX_ID_LEN};

/// The most References entries read: the last ones, nearest the post.
pub const MAX_REFERENCES: usize = 100;

/// The domain of a Message-ID made for a post that had none (RFC 2606 `.invalid`: it can
/// be no one's real id).
pub const MADE_ID_DOMAIN: &str = "archive.invalid";

/// The message ids of a References or In-Reply-To value, normalised, in order: every
/// `<...>`, or, in a value without angle brackets, every blank-separated word with an `@`.
/// Ids longer than [`MAX_ID_LEN`] bytes are dropped; at most [`MAX_REFERENCES`] are kept,
/// the last ones.
pub fn ids(value: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    if value.contains('<') {
        let mut rest = value;
        while let Some(open) = rest.find('<') {
            let after = &rest[open + 1..];
            let Some(close) = after.find('>') else { break };
            if let Some(id) = url::normalise(&after[..close]) {
                out.push(id);
            }
            rest = &after[close + 1..];
        }
    } else {
        out.extend(
            value
                .split_whitespace()
                .filter(|w| w.contains('@'))
                .filter_map(url::normalise),
        );
    }
    let skip = out.len().saturating_sub(MAX_REFERENCES);
    out.drain(..skip);
    out
}

/// A Message-ID for a post without one, made from a hash of the post, so that the same
/// post archived again gets the same id (and is recognised as already archived).
pub fn made_message_id(raw: &[u8]) -> String {
    format!("{}@{MADE_ID_DOMAIN}", url::hex16(&Sha256::digest(raw)))
}

/// The post's ancestry, oldest first: its References (the last [`MAX_REFERENCES`]), then
/// the first In-Reply-To id unless References already hold it. Each id once (its first
/// place), the post's own id never (a post cannot be its own ancestor).
pub fn chain(own: &str, references: &[String], in_reply_to: &[String]) -> Vec<String> {
    let refs = &references[references.len().saturating_sub(MAX_REFERENCES)..];
    let mut out: Vec<String> = Vec::with_capacity(refs.len() + 1);
    for id in refs.iter().chain(in_reply_to.first()) {
        if id != own && id.len() <= MAX_ID_LEN && !out.contains(id) {
            out.push(id.clone());
        }
    }
    out
}

/// What the archive of the list knows of one key (url id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Known {
    /// An archived post, in this thread.
    Message { thread: i64 },
    /// A placeholder, in this thread, with its parent when one is known.
    Placeholder { thread: i64, parent: Option<String> },
}

/// The post's thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Thread {
    Existing(i64),
    /// A thread of its own, rooted at `root` (the oldest ancestor, or the post itself).
    New {
        root: String,
    },
}

/// Where a post goes; keys are url ids (or whatever the caller keys `known` by).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Its parent: the nearest ancestor, archived, placeholder or placeholder to be.
    pub parent: Option<String>,
    pub thread: Thread,
    /// The post's own key is a placeholder, which the post replaces.
    pub replaces_placeholder: bool,
    /// Ancestors the archive does not know: (key, its parent), oldest first.
    pub placeholders: Vec<(String, Option<String>)>,
    /// Known placeholders of `thread` without a parent that the ancestry gives one:
    /// (key, parent).
    pub adopt: Vec<(String, String)>,
    /// The thread of the post's own placeholder, when it is not `thread`: merged into it.
    pub merge: Vec<i64>,
    /// Other threads the post's References name, left alone: one post naming ids of many
    /// threads must not merge them.
    pub unmerged: Vec<i64>,
}

/// Whether the post is archived, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The key is archived already (the same post again, or a Message-ID reused): nothing
    /// is done.
    Duplicate,
    Archive(Decision),
}

/// Places the post keyed `own` whose ancestry is `chain` (oldest first, see [`chain`]),
/// given what the archive knows of those keys. The post joins the thread of its nearest
/// known ancestor (else its own placeholder's); threads merge only through that ancestor
/// and the post's own placeholder, never through the other ids of its References, which
/// anyone can fill with the ids of other threads.
pub fn decide(own: &str, chain: &[String], known: &HashMap<String, Known>) -> Outcome {
    let own_placeholder = match known.get(own) {
        Some(Known::Message { .. }) => return Outcome::Duplicate,
        Some(Known::Placeholder { thread, parent }) => Some((*thread, parent.clone())),
        None => None,
    };
    let thread_of = |key: &String| match known.get(key)? {
        Known::Message { thread } | Known::Placeholder { thread, .. } => Some(*thread),
    };
    let nearest = chain.iter().rev().find_map(thread_of);
    let own_thread = own_placeholder.as_ref().map(|(t, _)| *t);
    let (thread, merge) = match (nearest, own_thread) {
        (Some(n), Some(o)) if n != o => (Thread::Existing(n), vec![o]),
        (Some(t), _) | (None, Some(t)) => (Thread::Existing(t), Vec::new()),
        (None, None) => (
            Thread::New {
                root: chain.first().map_or_else(|| own.to_owned(), Clone::clone),
            },
            Vec::new(),
        ),
    };
    let ours = |t: i64| thread == Thread::Existing(t) || merge.contains(&t);
    let mut placeholders = Vec::new();
    let mut adopt = Vec::new();
    let mut unmerged: Vec<i64> = Vec::new();
    for (i, key) in chain.iter().enumerate() {
        let above = i.checked_sub(1).map(|j| chain[j].clone());
        match known.get(key) {
            None => placeholders.push((key.clone(), above)),
            Some(Known::Message { thread: t } | Known::Placeholder { thread: t, .. })
                if !ours(*t) =>
            {
                if !unmerged.contains(t) {
                    unmerged.push(*t);
                }
            }
            Some(Known::Message { .. }) => {}
            Some(Known::Placeholder { parent, .. }) => {
                if let (None, Some(above)) = (parent, above) {
                    adopt.push((key.clone(), above));
                }
            }
        }
    }
    let parent = chain
        .last()
        .cloned()
        .or_else(|| own_placeholder.as_ref().and_then(|(_, p)| p.clone()));
    Outcome::Archive(Decision {
        parent,
        thread,
        replaces_placeholder: own_placeholder.is_some(),
        placeholders,
        adopt,
        merge,
        unmerged,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn ids_are_read_bounded_and_normalised() {
        let cases: &[(&str, &[&str])] = &[
            ("<a@X.test> <b@y.test>", &["a@x.test", "b@y.test"]),
            (
                "<a@x.test>\t(comment) <b@y.test>",
                &["a@x.test", "b@y.test"],
            ),
            ("a@x.test b@y.test", &["a@x.test", "b@y.test"]),
            ("not an id", &[]),
            ("<> <a@x.test", &[]),
            ("", &[]),
        ];
        for (value, want) in cases {
            assert_eq!(ids(value), s(want), "{value:?}");
        }
        let many: String = (0..150).map(|i| format!("<m{i}@x.test> ")).collect();
        let got = ids(&many);
        assert_eq!(got.len(), MAX_REFERENCES);
        assert_eq!(got[0], "m50@x.test", "the last 100 are kept");
        let long = format!("<{}@x.test> <ok@x.test>", "a".repeat(MAX_ID_LEN));
        assert_eq!(ids(&long), s(&["ok@x.test"]));
    }

    #[test]
    fn the_chain_is_references_then_in_reply_to_each_once_without_itself() {
        let cases: &[(&[&str], &[&str], &[&str])] = &[
            (&["a", "b"], &["c"], &["a", "b", "c"]),
            (&["a", "b"], &["b"], &["a", "b"]),
            (&[], &["c", "d"], &["c"]),
            (&["a", "me", "a"], &[], &["a"]),
            (&[], &[], &[]),
        ];
        for (refs, irt, want) in cases {
            assert_eq!(chain("me", &s(refs), &s(irt)), s(want), "{refs:?} {irt:?}");
        }
    }

    #[test]
    fn a_post_without_message_id_gets_a_stable_made_one() {
        let a = made_message_id(b"Subject: x\r\n\r\nbody\r\n");
        assert_eq!(a, made_message_id(b"Subject: x\r\n\r\nbody\r\n"));
        assert_ne!(a, made_message_id(b"Subject: x\r\n\r\nbody!\r\n"));
        assert!(a.ends_with("@archive.invalid"), "{a}");
        assert_eq!(url::normalise(&a).as_deref(), Some(a.as_str()));
    }

    fn message(thread: i64) -> Known {
        Known::Message { thread }
    }

    fn placeholder(thread: i64, parent: Option<&str>) -> Known {
        Known::Placeholder {
            thread,
            parent: parent.map(str::to_owned),
        }
    }

    fn archive(
        parent: Option<&str>,
        thread: Thread,
        replaces: bool,
        placeholders: &[(&str, Option<&str>)],
        adopt: &[(&str, &str)],
        merge: &[i64],
    ) -> Outcome {
        archive_with(parent, thread, replaces, placeholders, adopt, merge, &[])
    }

    fn archive_with(
        parent: Option<&str>,
        thread: Thread,
        replaces: bool,
        placeholders: &[(&str, Option<&str>)],
        adopt: &[(&str, &str)],
        merge: &[i64],
        unmerged: &[i64],
    ) -> Outcome {
        Outcome::Archive(Decision {
            parent: parent.map(str::to_owned),
            thread,
            replaces_placeholder: replaces,
            placeholders: placeholders
                .iter()
                .map(|(k, p)| (k.to_string(), p.map(str::to_owned)))
                .collect(),
            adopt: adopt
                .iter()
                .map(|(k, p)| (k.to_string(), p.to_string()))
                .collect(),
            merge: merge.to_vec(),
            unmerged: unmerged.to_vec(),
        })
    }

    fn new(root: &str) -> Thread {
        Thread::New { root: root.into() }
    }

    /// (what happens, own key, chain, what the archive knows, the outcome)
    #[test]
    fn posts_are_placed_by_their_ancestry() {
        type Case<'a> = (
            &'a str,
            &'a str,
            &'a [&'a str],
            Vec<(&'a str, Known)>,
            Outcome,
        );
        let cases: Vec<Case> = vec![
            (
                "a first post starts a thread",
                "a",
                &[],
                vec![],
                archive(None, new("a"), false, &[], &[], &[]),
            ),
            (
                "a reply to an archived post joins its thread",
                "b",
                &["a"],
                vec![("a", message(1))],
                archive(Some("a"), Thread::Existing(1), false, &[], &[], &[]),
            ),
            (
                "a reply in order, three deep: the nearest known ancestor is the parent",
                "c",
                &["a", "b"],
                vec![("a", message(1)), ("b", message(1))],
                archive(Some("b"), Thread::Existing(1), false, &[], &[], &[]),
            ),
            (
                "a reply before its parent: the parent becomes a placeholder at a new root",
                "b",
                &["a"],
                vec![],
                archive(Some("a"), new("a"), false, &[("a", None)], &[], &[]),
            ),
            (
                "the parent arriving later replaces its placeholder in that thread",
                "a",
                &[],
                vec![("a", placeholder(4, None))],
                archive(None, Thread::Existing(4), true, &[], &[], &[]),
            ),
            (
                "a missing middle post is a placeholder under the root",
                "c",
                &["a", "b"],
                vec![("a", message(1))],
                archive(
                    Some("b"),
                    Thread::Existing(1),
                    false,
                    &[("b", Some("a"))],
                    &[],
                    &[],
                ),
            ),
            (
                "the middle post arriving takes its place, parent kept",
                "b",
                &["a"],
                vec![("a", message(1)), ("b", placeholder(1, Some("a")))],
                archive(Some("a"), Thread::Existing(1), true, &[], &[], &[]),
            ),
            (
                "a middle post without References keeps the parent its placeholder had",
                "b",
                &[],
                vec![("b", placeholder(1, Some("a")))],
                archive(Some("a"), Thread::Existing(1), true, &[], &[], &[]),
            ),
            (
                "a Message-ID reused (or the same post again) is not archived twice",
                "a",
                &[],
                vec![("a", message(1))],
                Outcome::Duplicate,
            ),
            (
                "References naming other threads merge nothing: the parent's thread is taken",
                "d",
                &["a", "b", "c"],
                vec![
                    ("a", message(1)),
                    ("b", placeholder(2, None)),
                    ("c", message(2)),
                ],
                archive_with(
                    Some("c"),
                    Thread::Existing(2),
                    false,
                    &[],
                    &[("b", "a")],
                    &[],
                    &[1],
                ),
            ),
            (
                "a post naming many threads' ids joins its parent's alone",
                "z",
                &["x1", "x2", "x3", "gap", "p"],
                vec![
                    ("x1", message(1)),
                    ("x2", message(2)),
                    ("x3", placeholder(3, None)),
                    ("p", message(4)),
                ],
                archive_with(
                    Some("p"),
                    Thread::Existing(4),
                    false,
                    &[("gap", Some("x3"))],
                    &[],
                    &[],
                    &[1, 2, 3],
                ),
            ),
            (
                "a post whose own placeholder is in another thread merges it",
                "b",
                &["a"],
                vec![("a", message(1)), ("b", placeholder(3, None))],
                archive(Some("a"), Thread::Existing(1), true, &[], &[], &[3]),
            ),
            (
                "a post whose own placeholder alone is known joins its thread",
                "b",
                &["a"],
                vec![("b", placeholder(3, None))],
                archive(
                    Some("a"),
                    Thread::Existing(3),
                    true,
                    &[("a", None)],
                    &[],
                    &[],
                ),
            ),
            (
                "In-Reply-To alone: its id is the parent",
                "x",
                &["p"],
                vec![("p", message(9))],
                archive(Some("p"), Thread::Existing(9), false, &[], &[], &[]),
            ),
        ];
        for (what, own, ch, known, want) in cases {
            let known: HashMap<String, Known> =
                known.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
            assert_eq!(decide(own, &s(ch), &known), want, "{what}");
        }
    }
}
