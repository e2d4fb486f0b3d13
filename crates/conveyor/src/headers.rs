//! Message headers: case-insensitive names, byte values.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;

/// The headers of a message or delivery.
///
/// Names compare case-insensitively (ASCII), as HTTP's do; values are bytes, since brokers
/// carry binary header values. The first header set under a name wins on lookup; `insert`
/// replaces every header of that name.
///
/// Cloning is cheap: the entries are shared and copied only when a clone is changed, so a
/// transport can hand the same headers to every redelivery without allocating. Empty
/// headers allocate nothing.
///
/// ```
/// use conveyor::Headers;
///
/// let mut headers = Headers::new();
/// headers.insert("Content-Type", "application/json");
/// assert_eq!(headers.get_str("content-type"), Some("application/json"));
/// assert_eq!(headers.len(), 1);
/// ```
#[derive(Clone, Default)]
pub struct Headers {
    /// `None` while empty, so a delivery without headers costs no allocation.
    entries: Option<Arc<Vec<(HeaderName, Bytes)>>>,
}

/// A header name: a static string or an owned one, compared case-insensitively.
pub type HeaderName = Cow<'static, str>;

impl Headers {
    /// No headers.
    pub fn new() -> Self {
        Self::default()
    }

    /// The value of the first header named `name` (any case).
    #[inline]
    pub fn get(&self, name: &str) -> Option<&Bytes> {
        self.entries()
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    }

    /// The value of the header `name` as UTF-8 text; `None` if absent or not UTF-8.
    #[inline]
    pub fn get_str(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// Whether a header named `name` (any case) is present.
    pub fn contains(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Sets `name` to `value`, replacing every header of that name.
    pub fn insert(&mut self, name: impl Into<HeaderName>, value: impl Into<Bytes>) {
        let name = name.into();
        let entries = Arc::make_mut(self.entries.get_or_insert_with(Default::default));
        entries.retain(|(n, _)| !n.eq_ignore_ascii_case(&name));
        entries.push((name, value.into()));
    }

    /// Removes every header named `name`, returning the first value removed.
    pub fn remove(&mut self, name: &str) -> Option<Bytes> {
        if !self.contains(name) {
            return None;
        }
        let entries = self.entries.as_mut().map(Arc::make_mut)?;
        let mut removed = None;
        entries.retain(|(n, v)| {
            let hit = n.eq_ignore_ascii_case(name);
            if hit && removed.is_none() {
                removed = Some(v.clone());
            }
            !hit
        });
        removed
    }

    /// How many headers there are.
    pub fn len(&self) -> usize {
        self.entries().len()
    }

    /// Whether there are no headers.
    pub fn is_empty(&self) -> bool {
        self.entries().is_empty()
    }

    /// The headers in the order they were set, names as they were given.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Bytes)> {
        self.entries().iter().map(|(n, v)| (n.as_ref(), v))
    }

    fn entries(&self) -> &[(HeaderName, Bytes)] {
        self.entries.as_deref().map_or(&[], Vec::as_slice)
    }
}

impl PartialEq for Headers {
    fn eq(&self, other: &Self) -> bool {
        self.entries() == other.entries()
    }
}

impl Eq for Headers {}

impl fmt::Debug for Headers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.entries().iter().map(|(n, v)| (n, v)))
            .finish()
    }
}

/// As many headers as [`Headers::insert`] takes one by one when collecting; past that,
/// collecting is linear in the count, where inserting each (which looks for its name
/// among the others) is quadratic: a broker's header table, which the sender controls,
/// can hold tens of thousands.
const FEW_HEADERS: usize = 32;

impl<N: Into<HeaderName>, V: Into<Bytes>> FromIterator<(N, V)> for Headers {
    /// As if each were [inserted](Headers::insert) in turn: of a name given more than
    /// once (in any case), the last value stays.
    fn from_iter<I: IntoIterator<Item = (N, V)>>(iter: I) -> Self {
        let iter = iter.into_iter();
        let mut headers = Headers::new();
        if iter.size_hint().1.is_some_and(|most| most <= FEW_HEADERS) {
            for (name, value) in iter {
                headers.insert(name, value);
            }
            return headers;
        }
        let given: Vec<(HeaderName, Bytes)> = iter.map(|(n, v)| (n.into(), v.into())).collect();
        let mut seen = std::collections::HashSet::with_capacity(given.len());
        let mut kept: Vec<(HeaderName, Bytes)> = given
            .into_iter()
            .rev()
            .filter(|(name, _)| seen.insert(name.to_ascii_lowercase()))
            .collect();
        kept.reverse();
        // None while empty, as everywhere: an empty collection allocates nothing.
        headers.entries = (!kept.is_empty()).then(|| Arc::new(kept));
        headers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collecting_nothing_from_an_iterator_of_unknown_length_allocates_nothing() {
        let headers: Headers = std::iter::from_fn(|| None::<(String, String)>).collect();
        assert!(headers.entries.is_none());
    }

    #[test]
    fn collecting_many_headers_keeps_the_last_value_of_each_name_as_inserting_does() {
        for count in [3, 40, 20_000] {
            let given: Vec<(String, String)> = (0..count)
                .map(|i| {
                    let name = format!("h{}", i % (count / 3 + 1));
                    let name = if i % 2 == 0 {
                        name.to_uppercase()
                    } else {
                        name
                    };
                    (name, i.to_string())
                })
                .collect();
            let collected: Headers = given.iter().cloned().collect();
            if count <= 40 {
                let mut inserted = Headers::new();
                for (name, value) in &given {
                    inserted.insert(name.clone(), value.clone());
                }
                let pairs = |h: &Headers| -> Vec<(String, Bytes)> {
                    h.iter().map(|(n, v)| (n.to_string(), v.clone())).collect()
                };
                assert_eq!(pairs(&collected), pairs(&inserted), "{count}");
            }
            assert_eq!(collected.len(), count / 3 + 1, "{count}");
        }
    }

    #[test]
    fn names_match_in_any_case() {
        let mut h = Headers::new();
        h.insert("X-Tenant", "acme");
        assert_eq!(h.get_str("x-tenant"), Some("acme"));
        assert_eq!(h.get_str("X-TENANT"), Some("acme"));
    }

    #[test]
    fn insert_replaces_every_header_of_that_name() {
        let mut h = Headers::new();
        h.insert("a", "1");
        h.insert("A", "2");
        assert_eq!(h.len(), 1);
        assert_eq!(h.get_str("a"), Some("2"));
    }

    #[test]
    fn values_may_be_binary() {
        let mut h = Headers::new();
        h.insert("bin", vec![0u8, 159, 146, 150]);
        assert_eq!(
            h.get("BIN").map(|v| v.as_ref()),
            Some(&[0u8, 159, 146, 150][..])
        );
        assert_eq!(h.get_str("bin"), None);
    }

    #[test]
    fn a_changed_clone_leaves_the_original_alone() {
        let mut a = Headers::new();
        a.insert("k", "v");
        let mut b = a.clone();
        b.insert("k", "w");
        assert_eq!(a.get_str("k"), Some("v"));
        assert_eq!(b.remove("K").as_deref(), Some(&b"w"[..]));
        assert!(b.is_empty());
    }
}
