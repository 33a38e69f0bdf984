//! A deserializer through which a struct reads only from a JSON object.
//!
//! serde's derived structs also take a sequence of their fields in order, so `[manifest,
//! selector, ...]` would be read as an RC. A body of the API is JSON objects wherever the
//! document says so: [`ObjectsOnly`] asks the deserializer it wraps for a map wherever a
//! struct is read, at any depth, so an array there is refused as the wrong type (expected
//! "an object"). It also words what an integer field takes ("a whole number"), where serde
//! would name the Rust type (`expected i64`).

use std::fmt;

use serde::de::{
    DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, Unexpected, VariantAccess,
    Visitor,
};

use crate::api::query_values::whole_number;

/// Wraps a deserializer (and everything it hands on: values, elements, entries, variants)
/// so that every struct is read with `deserialize_map`.
pub struct ObjectsOnly<D>(pub D);

macro_rules! forward_deserialize {
    ($($method:ident),* $(,)?) => {
        $(
            fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
                self.0.$method(ObjectsOnly(visitor))
            }
        )*
    };
}

macro_rules! whole_numbers {
    ($($method:ident($ty:ty)),* $(,)?) => {
        $(
            fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
                let range = (i128::from(<$ty>::MIN), i128::from(<$ty>::MAX));
                self.0.$method(WholeNumber { visitor: ObjectsOnly(visitor), range })
            }
        )*
    };
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for ObjectsOnly<D> {
    type Error = D::Error;

    forward_deserialize!(
        deserialize_any,
        deserialize_bool,
        deserialize_i128,
        deserialize_u128,
        deserialize_f32,
        deserialize_f64,
        deserialize_char,
        deserialize_str,
        deserialize_string,
        deserialize_bytes,
        deserialize_byte_buf,
        deserialize_option,
        deserialize_unit,
        deserialize_seq,
        deserialize_map,
        deserialize_identifier,
        deserialize_ignored_any,
    );

    whole_numbers!(
        deserialize_i8(i8),
        deserialize_i16(i16),
        deserialize_i32(i32),
        deserialize_i64(i64),
        deserialize_u8(u8),
        deserialize_u16(u16),
        deserialize_u32(u32),
        deserialize_u64(u64),
    );

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.deserialize_unit_struct(name, ObjectsOnly(visitor))
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0
            .deserialize_newtype_struct(name, ObjectsOnly(visitor))
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.deserialize_tuple(len, ObjectsOnly(visitor))
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0
            .deserialize_tuple_struct(name, len, ObjectsOnly(visitor))
    }

    /// The one change: a struct is read as a map, never as a sequence.
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.deserialize_map(AnObject(ObjectsOnly(visitor)))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0
            .deserialize_enum(name, variants, ObjectsOnly(visitor))
    }

    fn is_human_readable(&self) -> bool {
        self.0.is_human_readable()
    }
}

/// A struct's visitor, read from a map only, and expecting "an object" in the error of
/// anything else rather than the Rust type's name (`struct RcSpec`).
struct AnObject<V>(V);

impl<'de, V: Visitor<'de>> Visitor<'de> for AnObject<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        self.0.visit_map(map)
    }
}

/// An integer field's visitor, saying what it takes in words ("a whole number from 0 to
/// 255", "from -2^63 to 2^63-1" for an `i64`) rather than as the Rust type (`u8`), for a
/// value of another type and for one out of its range alike.
struct WholeNumber<V> {
    visitor: V,
    range: (i128, i128),
}

impl<'de, V: Visitor<'de>> WholeNumber<V> {
    fn check<E: serde::de::Error>(&self, v: i128, unexpected: Unexpected<'_>) -> Result<(), E> {
        let (min, max) = self.range;
        if v < min || v > max {
            return Err(E::invalid_value(unexpected, self));
        }
        Ok(())
    }
}

impl<'de, V: Visitor<'de>> Visitor<'de> for WholeNumber<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.range {
            (min, max) if (min, max) == (i128::from(i64::MIN), i128::from(i64::MAX)) => {
                f.write_str(&whole_number("-2^63", "2^63-1"))
            }
            (0, max) if max == i128::from(u64::MAX) => f.write_str(&whole_number(0, "2^64-1")),
            (min, max) => f.write_str(&whole_number(min, max)),
        }
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
        self.check(i128::from(v), Unexpected::Signed(v))?;
        self.visitor.visit_i64(v)
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
        self.check(i128::from(v), Unexpected::Unsigned(v))?;
        self.visitor.visit_u64(v)
    }
}

macro_rules! forward_visit {
    ($($method:ident($ty:ty)),* $(,)?) => {
        $(
            fn $method<E: serde::de::Error>(self, v: $ty) -> Result<Self::Value, E> {
                self.0.$method(v)
            }
        )*
    };
}

impl<'de, V: Visitor<'de>> Visitor<'de> for ObjectsOnly<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.expecting(f)
    }

    forward_visit!(
        visit_bool(bool),
        visit_i8(i8),
        visit_i16(i16),
        visit_i32(i32),
        visit_i64(i64),
        visit_i128(i128),
        visit_u8(u8),
        visit_u16(u16),
        visit_u32(u32),
        visit_u64(u64),
        visit_u128(u128),
        visit_f32(f32),
        visit_f64(f64),
        visit_char(char),
        visit_str(&str),
        visit_borrowed_str(&'de str),
        visit_string(String),
        visit_bytes(&[u8]),
        visit_borrowed_bytes(&'de [u8]),
        visit_byte_buf(Vec<u8>),
    );

    fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        self.0.visit_none()
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        self.0.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        self.0.visit_some(ObjectsOnly(deserializer))
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        self.0.visit_newtype_struct(ObjectsOnly(deserializer))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        self.0.visit_seq(ObjectsOnly(seq))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        self.0.visit_map(ObjectsOnly(map))
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Self::Value, A::Error> {
        self.0.visit_enum(ObjectsOnly(data))
    }
}

impl<'de, T: DeserializeSeed<'de>> DeserializeSeed<'de> for ObjectsOnly<T> {
    type Value = T::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<T::Value, D::Error> {
        self.0.deserialize(ObjectsOnly(deserializer))
    }
}

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for ObjectsOnly<A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, A::Error> {
        self.0.next_element_seed(ObjectsOnly(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for ObjectsOnly<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        self.0.next_key_seed(ObjectsOnly(seed))
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.0.next_value_seed(ObjectsOnly(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

impl<'de, A: EnumAccess<'de>> EnumAccess<'de> for ObjectsOnly<A> {
    type Error = A::Error;
    type Variant = ObjectsOnly<A::Variant>;

    fn variant_seed<S: DeserializeSeed<'de>>(
        self,
        seed: S,
    ) -> Result<(S::Value, Self::Variant), A::Error> {
        let (value, variant) = self.0.variant_seed(ObjectsOnly(seed))?;
        Ok((value, ObjectsOnly(variant)))
    }
}

impl<'de, A: VariantAccess<'de>> VariantAccess<'de> for ObjectsOnly<A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        self.0.unit_variant()
    }

    fn newtype_variant_seed<S: DeserializeSeed<'de>>(self, seed: S) -> Result<S::Value, A::Error> {
        self.0.newtype_variant_seed(ObjectsOnly(seed))
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        self.0.tuple_variant(len, ObjectsOnly(visitor))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        self.0.struct_variant(fields, ObjectsOnly(visitor))
    }
}
