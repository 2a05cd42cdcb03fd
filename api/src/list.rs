//! The envelope of every list.

use serde::{Deserialize, Serialize};

/// A page of a list, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct List<T> {
    /// Always `list`.
    #[serde(default)]
    pub object: ListObject,
    /// The path listed.
    #[serde(default)]
    pub url: String,
    /// Whether older items follow: ask with `starting_after` = the last id.
    #[serde(default)]
    pub has_more: bool,
    /// The items.
    pub data: Vec<T>,
}

/// The `object` member of a list.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ListObject {
    /// `list`.
    #[default]
    List,
}

/// Written by hand: a derived schema of a generic type inlines its item,
/// where the document should name it (`ChargeList` refers to `Charge`).
#[cfg(feature = "schema")]
mod schema {
    use std::borrow::Cow;

    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Schema, Type};
    use utoipa::openapi::{Ref, RefOr};
    use utoipa::{PartialSchema, ToSchema};

    use super::{List, ListObject};

    impl<T: ToSchema> PartialSchema for List<T> {
        fn schema() -> RefOr<Schema> {
            ObjectBuilder::new()
                .description(Some(format!(
                    "A page of `{}` items, newest first.",
                    T::name()
                )))
                .property("object", Ref::from_schema_name(ListObject::name()))
                .property("url", ObjectBuilder::new().schema_type(Type::String))
                .property(
                    "has_more",
                    ObjectBuilder::new()
                        .schema_type(Type::Boolean)
                        .description(Some(
                            "Whether older items follow: ask with `starting_after` = the last id.",
                        )),
                )
                .property(
                    "data",
                    ArrayBuilder::new().items(Ref::from_schema_name(T::name())),
                )
                .required("object")
                .required("url")
                .required("has_more")
                .required("data")
                .into()
        }
    }

    impl<T: ToSchema> ToSchema for List<T> {
        fn name() -> Cow<'static, str> {
            format!("{}List", T::name()).into()
        }

        fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
            schemas.push((ListObject::name().into(), ListObject::schema()));
            schemas.push((T::name().into(), T::schema()));
            T::schemas(schemas);
        }
    }
}
