//! Problems found in operator files, each with file, line and key, and the machinery
//! that finds the line of a key path in the TOML text.

use std::fmt;
use std::path::{Path, PathBuf};
use toml_edit::{ImDocument, Item, Value};

/// What kind of problem, so tests (and tools) can tell them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProblemKind {
    /// The file cannot be read.
    Read,
    /// Not valid TOML.
    Syntax,
    /// A field the format does not have.
    UnknownField,
    /// A required field is absent.
    MissingField,
    /// A value of the wrong type or outside its range (e.g. a negative latency).
    InvalidValue,
    /// A name that does not follow the naming rule.
    InvalidName,
    /// A reference to a region, replica, policy, table or family that does not exist.
    UnknownReference,
    /// Two things with the same id.
    Duplicate,
    /// A link from a region to itself.
    SelfLink,
    /// A region with no serving replica.
    NoServingReplica,
    /// Replicas that links do not connect.
    Disconnected,
    /// A placement policy whose regions cannot reach each other without leaving it.
    PolicyDisconnected,
    /// A pinned app profile naming a relay (relays store no rows).
    PinnedRelay,
    /// An app profile that could never touch a row: `policies = []`, or pinned to
    /// replicas outside every region of the policies it lists.
    ProfileReachesNothing,
}

/// One problem: where it is and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub kind: ProblemKind,
    pub file: PathBuf,
    /// 1-based; `None` when the value came from the environment or the file is unreadable.
    pub line: Option<usize>,
    /// The key path, e.g. `continents[0].regions[1].replicas[0].role`.
    pub key: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if !self.key.is_empty() {
            write!(f, ": {}", self.key)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Every problem found in one or two files, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problems(pub Vec<Problem>);

impl Problems {
    pub fn kinds(&self) -> Vec<ProblemKind> {
        self.0.iter().map(|p| p.kind).collect()
    }
}

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        writeln!(f, "{n} problem{}:", if n == 1 { "" } else { "s" })?;
        for p in &self.0 {
            writeln!(f, "  {p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Problems {}

/// A key path inside a file: field names and array indices.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyPath(Vec<Seg>);

/// One step of a key path in a TOML file: a key, or an element of an array (of
/// tables).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    Key(String),
    Index(usize),
}

impl From<&str> for Seg {
    fn from(s: &str) -> Self {
        Seg::Key(s.to_owned())
    }
}

impl From<usize> for Seg {
    fn from(i: usize) -> Self {
        Seg::Index(i)
    }
}

/// Where the deepest part of `path` present in `doc` starts (the byte offset of its
/// key, or of its array element): how an operator file's problem, or a drill
/// file's, names a line.
pub fn span_start(doc: &ImDocument<String>, path: &[Seg]) -> Option<usize> {
    let mut span = None;
    let mut item: Option<&Item> = None;
    let mut value: Option<&Value> = None;
    let mut table: Option<&toml_edit::Table> = Some(doc.as_table());
    for seg in path {
        match seg {
            Seg::Key(k) => {
                let found = if let Some(t) = table {
                    t.get_key_value(k)
                } else if let Some(Value::InlineTable(t)) = value {
                    t.get_key_value(k)
                } else {
                    None
                };
                let Some((key, next)) = found else { break };
                span = key.span().or(span);
                (item, value, table) = (Some(next), next.as_value(), next.as_table());
            }
            Seg::Index(i) => {
                if let Some(Item::ArrayOfTables(a)) = item {
                    let Some(t) = a.get(*i) else { break };
                    span = t.span().or(span);
                    (item, value, table) = (None, None, Some(t));
                } else if let Some(Value::Array(a)) = value {
                    let Some(v) = a.get(*i) else { break };
                    span = v.span().or(span);
                    (item, value, table) = (None, Some(v), None);
                } else {
                    break;
                }
            }
        }
    }
    span.map(|s| s.start)
}

impl KeyPath {
    pub fn root() -> Self {
        KeyPath::default()
    }

    pub fn key(&self, k: &str) -> KeyPath {
        let mut p = self.clone();
        p.0.push(Seg::Key(k.to_owned()));
        p
    }

    pub fn index(&self, i: usize) -> KeyPath {
        let mut p = self.clone();
        p.0.push(Seg::Index(i));
        p
    }

    /// From figment's error path, where array indices are decimal strings.
    fn from_figment(path: &[String]) -> KeyPath {
        KeyPath(
            path.iter()
                .map(|s| s.parse().map_or_else(|_| Seg::Key(s.clone()), Seg::Index))
                .collect(),
        )
    }
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                Seg::Key(k) if i == 0 => write!(f, "{k}")?,
                Seg::Key(k) => write!(f, ".{k}")?,
                Seg::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// One operator file: its path and text, parsed once more with spans so that a key
/// path can be turned into a line number.
#[derive(Debug)]
pub(crate) struct Source {
    file: PathBuf,
    doc: Option<ImDocument<String>>,
    /// Byte offsets of line starts.
    line_starts: Vec<usize>,
}

impl Source {
    pub(crate) fn new(file: &Path, text: &str) -> Source {
        let line_starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        Source {
            file: file.to_owned(),
            doc: ImDocument::parse(text.to_owned()).ok(),
            line_starts,
        }
    }

    pub(crate) fn file(&self) -> &Path {
        &self.file
    }

    fn line_at(&self, offset: usize) -> usize {
        self.line_starts.partition_point(|&s| s <= offset)
    }

    /// The line of the deepest part of `path` present in the file.
    pub(crate) fn line_of(&self, path: &KeyPath) -> Option<usize> {
        span_start(self.doc.as_ref()?, &path.0).map(|o| self.line_at(o))
    }

    pub(crate) fn problem(
        &self,
        kind: ProblemKind,
        key: &KeyPath,
        message: impl Into<String>,
    ) -> Problem {
        Problem {
            kind,
            file: self.file.clone(),
            line: self.line_of(key),
            key: key.to_string(),
            message: message.into(),
        }
    }

    /// Turns figment's extraction errors into problems.
    pub(crate) fn figment_problems(&self, err: figment::Error, env_prefix: &str) -> Vec<Problem> {
        use figment::error::Kind;
        err.into_iter()
            .map(|e| {
                let mut key = KeyPath::from_figment(&e.path);
                let from_env = e
                    .metadata
                    .as_ref()
                    .is_some_and(|m| m.name.contains("environment"));
                let (kind, message) = match &e.kind {
                    Kind::UnknownField(field, expected) => {
                        // figment's path usually ends with the field already.
                        if e.path.last().is_none_or(|l| l != field) {
                            key = key.key(field);
                        }
                        (
                            ProblemKind::UnknownField,
                            format!("unknown field; expected one of: {}", expected.join(", ")),
                        )
                    }
                    Kind::MissingField(field) => {
                        let m = format!("missing field `{field}`");
                        (ProblemKind::MissingField, m)
                    }
                    Kind::Message(m)
                        if m.contains("TOML") || m.contains("expected") && key.0.is_empty() =>
                    {
                        (ProblemKind::Syntax, m.clone())
                    }
                    other => (ProblemKind::InvalidValue, other.to_string()),
                };
                let mut p = self.problem(kind, &key, message);
                if from_env {
                    p.line = None;
                    p.message =
                        format!("{} (from a {env_prefix}* environment variable)", p.message);
                }
                p
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_lines_of_nested_keys() {
        let text = "name = \"x\"\n\n[[continents]]\nname = \"eu\"\n\n  [[continents.regions]]\n  name = \"eu-west-1\"\n  replicas = [ { id = \"a\" },\n    { id = \"b\" } ]\n";
        let s = Source::new(Path::new("t.toml"), text);
        assert_eq!(s.line_of(&KeyPath::root().key("name")), Some(1));
        assert_eq!(
            s.line_of(&KeyPath::root().key("continents").index(0).key("name")),
            Some(4)
        );
        let region = KeyPath::root()
            .key("continents")
            .index(0)
            .key("regions")
            .index(0);
        assert_eq!(s.line_of(&region.key("name")), Some(7));
        assert_eq!(
            s.line_of(&region.key("replicas").index(1).key("id")),
            Some(9)
        );
        // A missing key resolves to the deepest part that exists.
        assert_eq!(s.line_of(&region.key("nope")), Some(6));
        assert_eq!(
            region.key("replicas").index(1).key("id").to_string(),
            "continents[0].regions[0].replicas[1].id"
        );
    }
}
