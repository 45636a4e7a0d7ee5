//! Drivers' own settings in a spec, carried as data: `"systemd": {…}`, `"kube": {…}`,
//! or the section of any external driver, each named after its driver's kind. `common`
//! checks only their shape; the driver that owns a section parses and checks it.

use super::DriverKind;
use serde::de::{self, DeserializeOwned, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;
use std::collections::BTreeMap;

/// One driver's settings: a JSON value kept as its text, minified, its keys in the
/// order they came in. A section is never re-spelled, so the canonical JSON of a spec
/// (its hash, its signature, the content its command id is bound to) is what the
/// coordinator wrote, whichever build reads it.
#[derive(Clone)]
pub struct Section(Box<RawValue>);

impl Section {
    /// The section holding `settings` (a driver's typed settings, in their field order).
    pub fn of<T: Serialize>(settings: &T) -> Section {
        let text = serde_json::to_string(settings).expect("driver settings serialise");
        Section(RawValue::from_string(text).expect("serde_json writes JSON"))
    }

    /// The settings, read by the driver that owns them.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.0.get())
    }

    /// The section's JSON text.
    pub fn json(&self) -> &str {
        self.0.get()
    }

    /// True when it is a JSON object (every section must be).
    pub fn is_object(&self) -> bool {
        self.0.get().starts_with('{')
    }

    /// True when it is `{}`: no settings.
    pub fn is_empty_object(&self) -> bool {
        self.0.get() == "{}"
    }
}

impl PartialEq for Section {
    fn eq(&self, other: &Self) -> bool {
        self.0.get() == other.0.get()
    }
}

impl Eq for Section {}

impl std::fmt::Debug for Section {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.get())
    }
}

impl Serialize for Section {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Section {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut text = Vec::with_capacity(64);
        Text(&mut text).deserialize(deserializer)?;
        let text = String::from_utf8(text).map_err(de::Error::custom)?;
        RawValue::from_string(text)
            .map(Section)
            .map_err(de::Error::custom)
    }
}

/// A driver's typed settings: the type of its section. The driver crate that owns the
/// section implements it (`capstan_systemd::SystemdSpec`, `capstan_kube::KubeSpec`).
pub trait Settings: Serialize + DeserializeOwned + Default + PartialEq {
    /// The driver whose section this is (the name it is under).
    const KIND: DriverKind;

    /// The settings in `spec` (the defaults when it has no section of this kind).
    fn read(spec: &crate::Spec) -> Result<Self, serde_json::Error> {
        spec.sections
            .get(Self::KIND)
            .map_or(Ok(Self::default()), Section::parse)
    }

    /// Sets these settings as `spec`'s section of this kind (none at their defaults,
    /// so a spec without settings keeps its canonical JSON).
    fn write_into(&self, spec: &mut crate::Spec) {
        if *self == Self::default() {
            spec.sections.remove(Self::KIND);
        } else {
            spec.sections.insert(Self::KIND, Section::of(self));
        }
    }

    /// Changes `spec`'s settings with `change`, from the defaults when it has none
    /// (or none that read as these settings).
    fn edit(spec: &mut crate::Spec, change: impl FnOnce(&mut Self)) {
        let mut settings = Self::read(spec).unwrap_or_default();
        change(&mut settings);
        settings.write_into(spec);
    }
}

/// The sections of a spec, by the name they are under. Any key a spec does not know
/// lands here (a spec's sections are flattened into it), so a misspelt field is
/// refused by [`crate::validate::spec`] instead of ignored. Reading a spec keeps every one:
/// a spec a later build wrote, with a field this build does not have, still decodes
/// from the log (and is written back with it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Sections(BTreeMap<String, Section>);

impl Sections {
    /// The section of driver `kind`.
    pub fn get(&self, kind: DriverKind) -> Option<&Section> {
        self.0.get(kind.as_str())
    }

    /// Sets the section of driver `kind`.
    pub fn insert(&mut self, kind: DriverKind, section: Section) {
        self.0.insert(kind.as_str().to_string(), section);
    }

    /// Sets the section under `name` (a spec member no field takes), answering the one
    /// it replaces.
    pub(crate) fn insert_named(&mut self, name: String, section: Section) -> Option<Section> {
        self.0.insert(name, section)
    }

    /// Drops the section of driver `kind`.
    pub fn remove(&mut self, kind: DriverKind) {
        self.0.remove(kind.as_str());
    }

    /// Every section with the name it is under, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Section)> {
        self.0.iter().map(|(name, s)| (name.as_str(), s))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Writes the value it deserializes as minified JSON, in the order it comes (through
/// serde's buffering of flattened and tagged content too, which keeps map order).
struct Text<'a>(&'a mut Vec<u8>);

impl Text<'_> {
    /// `value` as serde_json writes it (a string escaped, a number in its shortest form).
    fn json<T: Serialize + ?Sized, E: de::Error>(self, value: &T) -> Result<(), E> {
        value
            .serialize(&mut serde_json::Serializer::new(&mut *self.0))
            .map_err(E::custom)
    }
}

impl<'de> DeserializeSeed<'de> for Text<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Text<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.json(&v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.json(&v)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.json(&v)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        if !v.is_finite() {
            return Err(E::custom("a section number must be finite"));
        }
        self.json(&v)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.json(v)
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.0.extend_from_slice(b"null");
        Ok(())
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.0.push(b'[');
        let mut first = true;
        loop {
            let mark = self.0.len();
            if !first {
                self.0.push(b',');
            }
            if seq.next_element_seed(Text(self.0))?.is_none() {
                self.0.truncate(mark);
                break;
            }
            first = false;
        }
        self.0.push(b']');
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.0.push(b'{');
        let mut first = true;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if !first {
                self.0.push(b',');
            }
            first = false;
            Text(self.0).json::<_, A::Error>(key.as_ref())?;
            self.0.push(b':');
            map.next_value_seed(Text(self.0))?;
        }
        self.0.push(b'}');
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A spec read through serde's buffering of flattened content, as a command's is.
    #[derive(Deserialize)]
    struct Holder {
        #[serde(flatten)]
        spec: crate::Spec,
    }

    #[test]
    fn a_section_keeps_its_text_key_order_and_all_through_flattening() {
        let text = r#"{"driver":"sim","zeta":{"b":1,"a":[true,null,"é\n",-2,1.5,{"y":{},"x":[]}]},"alpha":{"k":"v"},"empty":{}}"#;
        let held: Holder = serde_json::from_str(text).unwrap();
        let zeta = held.spec.sections.0.get("zeta").unwrap();
        assert_eq!(
            zeta.json(),
            r#"{"b":1,"a":[true,null,"é\n",-2,1.5,{"y":{},"x":[]}]}"#
        );
        assert_eq!(held.spec.sections.0.get("empty").unwrap().json(), "{}");
        assert_eq!(
            serde_json::to_string(&held.spec.sections).unwrap(),
            r#"{"alpha":{"k":"v"},"empty":{},"zeta":{"b":1,"a":[true,null,"é\n",-2,1.5,{"y":{},"x":[]}]}}"#
        );
    }

    #[test]
    fn whitespace_is_dropped_and_strings_keep_their_escapes_meaning() {
        let held: Holder = serde_json::from_str(
            "{ \"driver\": \"sim\", \"s\" : { \"q\" : \"a\\\"b\\u0001\" , \"n\" : [ 1 , 2 ] } }",
        )
        .unwrap();
        let s = held.spec.sections.0.get("s").unwrap();
        assert_eq!(s.json(), r#"{"q":"a\"b\u0001","n":[1,2]}"#);
        let back: serde_json::Value = s.parse().unwrap();
        assert_eq!(back["q"], "a\"b\u{1}");
    }

    #[test]
    fn a_typed_section_is_written_in_its_field_order() {
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct Settings {
            user: Option<String>,
            group: Option<String>,
        }
        let settings = Settings {
            user: Some("app".into()),
            group: None,
        };
        let section = Section::of(&settings);
        assert_eq!(section.json(), r#"{"user":"app","group":null}"#);
        assert_eq!(section.parse::<Settings>().unwrap(), settings);
        let mut sections = Sections::default();
        sections.insert(DriverKind::SYSTEMD, section.clone());
        assert_eq!(sections.get(DriverKind::SYSTEMD), Some(&section));
        sections.remove(DriverKind::SYSTEMD);
        assert!(sections.is_empty());
    }
}
