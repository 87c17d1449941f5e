//! The ARC set itself (RFC 8617): the header block read into fields, the chain already on
//! the message, the decision whether and how to seal (`plan`), and the three new fields
//! signed (`Sealer::seal`).
//!
//! Pure: the caller supplies the key, the verdict on the existing chain and the clock's
//! reading; nothing here reads the queue, the network or the time. Canonicalization and the
//! signature primitives are mail-auth's (the same code the ingress verifies with); the
//! field layout, the chain rules and the `cv=fail` seal scope are ours, because mail-auth's
//! `ArcSealer` wants a verification result object the stage does not have (the verdict
//! arrives as `state.auth.arc`) and signs every earlier set even for `cv=fail`.

use std::collections::BTreeMap;

use mail_auth::common::crypto::{DkimKey, SigningKey as _};
use mail_auth::dkim::Canonicalization;

/// RFC 8617 §4.2.1: instances run from 1 to 50.
pub const MAX_INSTANCE: u32 = 50;

/// One header field of the block: the name as written (trailing blanks removed) and the
/// raw value after the colon, folding and final line break included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field<'a> {
    pub name: &'a [u8],
    pub value: &'a [u8],
}

impl Field<'_> {
    fn is(&self, name: &str) -> bool {
        self.name.eq_ignore_ascii_case(name.as_bytes())
    }
}

/// Splits a header block into fields. The error says which line is not a header field.
pub fn fields(block: &[u8]) -> Result<Vec<Field<'_>>, String> {
    let mut out: Vec<Field<'_>> = Vec::new();
    let mut start = 0;
    let mut line_no = 0;
    while start < block.len() {
        line_no += 1;
        let end = block[start..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(block.len(), |p| start + p + 1);
        let line = &block[start..end];
        if line.first().is_some_and(|&b| b == b' ' || b == b'\t') {
            let Some(last) = out.last_mut() else {
                return Err("the header block starts with a continuation line".into());
            };
            // The value runs on to the end of this line: extend the slice in place.
            let value_start = last.value.as_ptr() as usize - block.as_ptr() as usize;
            last.value = &block[value_start..end];
        } else {
            let shown = || String::from_utf8_lossy(&line[..line.len().min(60)]).into_owned();
            let Some(colon) = line.iter().position(|&b| b == b':') else {
                return Err(format!(
                    "header line {line_no} is not a field (no colon): {:?}",
                    shown()
                ));
            };
            let name = trim_end(&line[..colon]);
            if name.is_empty() || !name.iter().all(|b| b.is_ascii_graphic()) {
                return Err(format!(
                    "header line {line_no} has no valid field name: {:?}",
                    shown()
                ));
            }
            out.push(Field {
                name,
                value: &line[colon + 1..],
            });
        }
        start = end;
    }
    Ok(out)
}

fn trim_end(mut s: &[u8]) -> &[u8] {
    while let [rest @ .., b' ' | b'\t' | b'\r' | b'\n'] = s {
        s = rest;
    }
    s
}

/// The three fields of an ARC set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Results,
    Signature,
    Seal,
}

impl Kind {
    fn of(field: &Field<'_>) -> Option<Kind> {
        if field.is("ARC-Authentication-Results") {
            Some(Kind::Results)
        } else if field.is("ARC-Message-Signature") {
            Some(Kind::Signature)
        } else if field.is("ARC-Seal") {
            Some(Kind::Seal)
        } else {
            None
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Results => "ARC-Authentication-Results",
            Kind::Signature => "ARC-Message-Signature",
            Kind::Seal => "ARC-Seal",
        }
    }
}

/// The unfolded value with runs of blanks made one space, trimmed.
fn unfolded(value: &[u8]) -> String {
    let text = String::from_utf8_lossy(value);
    text.split_ascii_whitespace().collect::<Vec<_>>().join(" ")
}

/// The value of tag `name` in a tag list (`i=1; a=rsa-sha256; ...`), lower-cased.
fn tag(value: &[u8], name: &str) -> Option<String> {
    unfolded(value).split(';').find_map(|t| {
        let (n, v) = t.split_once('=')?;
        n.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_ascii_lowercase())
    })
}

/// The instance of an ARC field: the `i=` tag (for ARC-Authentication-Results, the first
/// item, RFC 8617 §4.1.1).
fn instance(kind: Kind, value: &[u8]) -> Option<u32> {
    let i = match kind {
        Kind::Results => {
            let text = unfolded(value);
            let first = text.split(';').next()?;
            let (n, v) = first.split_once('=')?;
            n.trim()
                .eq_ignore_ascii_case("i")
                .then(|| v.trim().to_owned())?
        }
        _ => tag(value, "i")?,
    };
    if i.is_empty() || !i.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    i.parse().ok().filter(|&i| i > 0)
}

/// The ARC sets already on a message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chain {
    /// Instance → indices (into the field list) of its fields, by kind.
    sets: BTreeMap<u32, [Vec<usize>; 3]>,
}

impl Chain {
    /// Reads the ARC fields of `fields`. An ARC field whose instance cannot be read makes the
    /// chain unreadable: no instance number for a new set can be chosen.
    pub fn read(fields: &[Field<'_>]) -> Result<Chain, String> {
        let mut sets: BTreeMap<u32, [Vec<usize>; 3]> = BTreeMap::new();
        for (index, field) in fields.iter().enumerate() {
            let Some(kind) = Kind::of(field) else {
                continue;
            };
            let Some(i) = instance(kind, field.value) else {
                return Err(format!(
                    "{} field without a valid i= tag: {:?}",
                    kind.name(),
                    unfolded(&field.value[..field.value.len().min(80)])
                ));
            };
            sets.entry(i).or_default()[kind as usize].push(index);
        }
        Ok(Chain { sets })
    }

    /// The highest instance, 0 without a chain.
    pub fn last_instance(&self) -> u32 {
        self.sets.keys().next_back().copied().unwrap_or(0)
    }

    /// Every instance from 1 to the last has exactly one field of each kind.
    pub fn is_complete(&self) -> bool {
        let last = self.last_instance();
        self.sets.len() == last as usize
            && self
                .sets
                .values()
                .all(|set| set.iter().all(|kind| kind.len() == 1))
    }

    /// The last seal says `cv=fail`: the chain ended there (RFC 8617 §5.1.2).
    fn ended(&self, fields: &[Field<'_>]) -> bool {
        self.sets.values().next_back().is_some_and(|set| {
            set[Kind::Seal as usize]
                .iter()
                .any(|&i| tag(fields[i].value, "cv").as_deref() == Some("fail"))
        })
    }

    /// The fields of instances `1..=last` in seal order (results, signature, seal of each),
    /// for a complete chain.
    fn ordered<'f>(&self, fields: &'f [Field<'f>]) -> Vec<Field<'f>> {
        self.sets
            .values()
            .flat_map(|set| set.iter().flatten().map(|&i| fields[i]))
            .collect()
    }
}

/// The `cv=` of a new seal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cv {
    None,
    Pass,
    Fail,
}

impl Cv {
    pub fn as_str(self) -> &'static str {
        match self {
            Cv::None => "none",
            Cv::Pass => "pass",
            Cv::Fail => "fail",
        }
    }
}

/// Which messages a stage seals (`SEAL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SealMode {
    /// Only mail whose arrival was verified (it has `state.auth`): mail relayed onwards.
    Forwarded,
    /// Every message, locally submitted mail too.
    All,
}

/// Why a message advances without a new ARC set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    /// `SEAL = forwarded` and the message has no `state.auth`.
    NotForwarded,
    /// The last seal already says `cv=fail`: nobody adds to a failed chain.
    ChainEnded,
    /// The chain already has `MAX_INSTANCE` sets.
    ChainFull,
    /// A chain without a verdict on it (no `state.auth`): its `cv=` cannot be stated.
    NoVerdict,
}

/// What to do with one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    Seal { instance: u32, cv: Cv },
    Skip(Skip),
}

/// Decides from the chain on the message and the ingress verdict on it (`state.auth.arc`
/// `result`; `None` when the message has no `state.auth` at all, `Some("none")` when the
/// verdict is missing from it).
pub fn plan(chain: &Chain, fields: &[Field<'_>], verdict: Option<&str>, mode: SealMode) -> Plan {
    if verdict.is_none() && mode == SealMode::Forwarded {
        return Plan::Skip(Skip::NotForwarded);
    }
    let last = chain.last_instance();
    if last == 0 {
        return Plan::Seal {
            instance: 1,
            cv: Cv::None,
        };
    }
    if chain.ended(fields) {
        return Plan::Skip(Skip::ChainEnded);
    }
    if last >= MAX_INSTANCE {
        return Plan::Skip(Skip::ChainFull);
    }
    let Some(verdict) = verdict else {
        return Plan::Skip(Skip::NoVerdict);
    };
    // "fail: the chain as received does not or can not validate" (RFC 8617 §4.1.3): any
    // verdict but pass, or a chain that lost or gained fields since it was verified.
    let cv = if verdict.eq_ignore_ascii_case("pass") && chain.is_complete() {
        Cv::Pass
    } else {
        Cv::Fail
    };
    Plan::Seal {
        instance: last + 1,
        cv,
    }
}

/// A sealing identity: the key and `d=`/`s=`, and the AMS's `h=` list.
pub struct Sealer {
    pub key: DkimKey,
    pub domain: String,
    pub selector: String,
    /// The `h=` list of the message signature.
    pub headers: Vec<String>,
}

/// Relaxed canonical form (RFC 6376 §3.4.2) of whole fields, each ending in CRLF.
fn canonical_fields<'a>(fields: impl Iterator<Item = Field<'a>>, out: &mut Vec<u8>) {
    for f in fields {
        Canonicalization::Relaxed.canonicalize_headers(std::iter::once((f.name, f.value)), out);
        if !f.value.ends_with(b"\n") {
            out.extend_from_slice(b"\r\n");
        }
    }
}

/// The fields `h=` names, in `h=` order, each name taking the next instance from the bottom
/// of the block (RFC 6376 §5.4.2); a name with no instance left signs nothing.
fn selected<'f>(fields: &[Field<'f>], h: &[String]) -> Vec<Field<'f>> {
    let mut taken: Vec<(String, usize)> = Vec::new();
    let mut out = Vec::new();
    for name in h {
        let lower = name.to_ascii_lowercase();
        let n = match taken.iter_mut().find(|(t, _)| *t == lower) {
            Some((_, n)) => {
                *n += 1;
                *n - 1
            }
            None => {
                taken.push((lower, 1));
                0
            }
        };
        if let Some(f) = fields.iter().rev().filter(|f| f.is(name)).nth(n) {
            out.push(*f);
        }
    }
    out
}

/// Builds a field `Name: tag=value; ...`, folding (CRLF TAB) before a piece that would
/// pass column 76. Relaxed canonicalization turns each fold into one space, so where the
/// lines break never changes what is signed.
struct Folder {
    out: String,
    column: usize,
}

impl Folder {
    fn new(name: &str) -> Folder {
        Folder {
            out: format!("{name}:"),
            column: name.len() + 1,
        }
    }

    /// Appends `piece`, breaking the line instead of writing `sep` when it would pass the
    /// limit.
    fn push(&mut self, sep: &str, piece: &str) {
        if self.column + sep.len() + piece.len() > 76 && self.column > 1 {
            self.out.push_str("\r\n\t");
            self.column = 1;
        } else {
            self.out.push_str(sep);
            self.column += sep.len();
        }
        self.out.push_str(piece);
        self.column += piece.len();
    }

    /// A `tag=value;` item, unbreakable.
    fn tag(&mut self, tag: &str, value: &str) {
        self.push(" ", &format!("{tag}={value};"));
    }

    /// `tag=` and then `pieces` joined by `joiner`, a line break possible before each
    /// piece (the h= names, base64 in chunks); no `;` after.
    fn list(&mut self, tag: &str, pieces: &[String], joiner: &str) {
        self.push(" ", &format!("{tag}="));
        self.pieces(pieces, joiner);
    }

    fn pieces(&mut self, pieces: &[String], joiner: &str) {
        for (n, p) in pieces.iter().enumerate() {
            if n + 1 < pieces.len() {
                self.push("", &format!("{p}{joiner}"));
            } else {
                self.push("", p);
            }
        }
    }

    /// The field so far, as a name and a value for canonicalization.
    fn field(&self) -> Field<'_> {
        as_field(&self.out)
    }
}

fn chunks(text: &str, size: usize) -> Vec<String> {
    text.as_bytes()
        .chunks(size)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect()
}

/// A field as written: `Name: value` without the final CRLF, split for canonicalization.
fn as_field(text: &str) -> Field<'_> {
    let (name, value) = text.split_once(':').expect("our fields have a colon");
    Field {
        name: name.as_bytes(),
        value: value.as_bytes(),
    }
}

impl Sealer {
    fn algorithm(&self) -> &'static str {
        match self.key {
            DkimKey::Rsa(_) => "rsa-sha256",
            DkimKey::Ed25519(_) => "ed25519-sha256",
        }
    }

    /// Ends `folder` with `b=`, signs what `signed` holds plus the field so far (relaxed,
    /// without a final CRLF: the field with an empty `b=`, RFC 6376 §3.7) and appends the
    /// signature.
    fn finish(&self, folder: &mut Folder, mut signed: Vec<u8>) -> Result<(), String> {
        folder.push(" ", "b=");
        let f = folder.field();
        Canonicalization::Relaxed
            .canonicalize_headers(std::iter::once((f.name, f.value)), &mut signed);
        let b = self
            .key
            .sign(&signed[..])
            .map_err(|e| format!("signing with {}: {e}", self.describe()))?;
        folder.pieces(&chunks(&pepsi_smtp::encoding::base64_encode(&b), 40), "");
        Ok(())
    }

    /// `s._domainkey.d`, for messages.
    pub fn describe(&self) -> String {
        format!("{}._domainkey.{}", self.selector, self.domain)
    }

    /// The new ARC set for a message: the `ARC-Seal`, `ARC-Message-Signature` and
    /// `ARC-Authentication-Results` fields, each ending in CRLF, to be put above the header
    /// block. `results` is the authentication-results payload after the authserv-id (see
    /// `aar::payload`); `now` the signing time in seconds since the epoch.
    #[allow(clippy::too_many_arguments)]
    pub fn seal(
        &self,
        fields: &[Field<'_>],
        chain: &Chain,
        body: &[u8],
        instance: u32,
        cv: Cv,
        results: &str,
        now: u64,
    ) -> Result<String, String> {
        let a = self.algorithm();
        let aar = format!("ARC-Authentication-Results: i={instance}; {results}");

        // The message signature: the h= fields, then itself with b= empty.
        let body_hash = self
            .key
            .hash(Canonicalization::Relaxed.canonical_body(body, 0));
        let mut ams = Folder::new("ARC-Message-Signature");
        ams.tag("i", &instance.to_string());
        ams.tag("a", a);
        ams.tag("d", &self.domain);
        ams.tag("s", &self.selector);
        ams.tag("c", "relaxed/relaxed");
        ams.tag("t", &now.to_string());
        ams.list("h", &self.headers, ":");
        ams.out.push(';');
        ams.column += 1;
        ams.list(
            "bh",
            &chunks(&pepsi_smtp::encoding::base64_encode(body_hash.as_ref()), 40),
            "",
        );
        ams.out.push(';');
        ams.column += 1;
        let mut signed = Vec::new();
        canonical_fields(selected(fields, &self.headers).into_iter(), &mut signed);
        self.finish(&mut ams, signed)?;

        // The seal: earlier sets (none after a failed chain, RFC 8617 §5.1.2), this set's
        // results and message signature, then itself with b= empty.
        let mut seal = Folder::new("ARC-Seal");
        seal.tag("i", &instance.to_string());
        seal.tag("a", a);
        seal.tag("d", &self.domain);
        seal.tag("s", &self.selector);
        seal.tag("t", &now.to_string());
        seal.tag("cv", cv.as_str());
        let mut sealed = Vec::new();
        if cv == Cv::Pass {
            canonical_fields(chain.ordered(fields).into_iter(), &mut sealed);
        }
        canonical_fields([as_field(&aar), ams.field()].into_iter(), &mut sealed);
        self.finish(&mut seal, sealed)?;

        Ok(format!("{}\r\n{}\r\n{aar}\r\n", seal.out, ams.out))
    }
}
