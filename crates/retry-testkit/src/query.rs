//! Query filters and update documents as the test server evaluates them: equality, the
//! comparison operators (`$eq`, `$ne`, `$gt`, `$gte`, `$lt`, `$lte`, `$in`, `$nin`, `$exists`),
//! `$and` / `$or`, and the update operators `$set`, `$unset`, `$inc` or a replacement. Anything
//! else is refused by name (TK-*: a filter the server cannot evaluate is an error, never a guess).

use core::cmp::Ordering;

use bson::{Bson, Document};

/// An operator the test server does not evaluate.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Unsupported(pub(crate) String);

/// The prefix of an [`Unsupported`] that is really the client's mistake: a real server answers
/// it with BadValue (2), e.g. `{$or: true}` (TK-14).
pub(crate) const BAD_VALUE: &str = "BadValue: ";

impl Unsupported {
    /// A malformed filter a real server refuses with BadValue.
    fn bad_value(message: &str) -> Unsupported {
        Unsupported(format!("{BAD_VALUE}{message}"))
    }
}

/// Whether `document` matches `filter`.
pub(crate) fn matches(document: &Document, filter: &Document) -> Result<bool, Unsupported> {
    for (key, condition) in filter {
        let ok = match key.as_str() {
            "$and" => all_of(document, condition, true)?,
            "$or" => all_of(document, condition, false)?,
            // Fixes18c (TK-15, house rule 7): a `$comment` of any value, at the top level of a
            // filter or of an `$and` / `$or` branch, is no expression at all to the server
            // (`expression_parser.cpp`: `parseComment` adds nothing).
            "$comment" => true,
            // TK-14: only `"sleep(N) || true"`, whose sleep the server took before running.
            "$where" if where_sleep_ms(condition).is_some() => true,
            k if k.starts_with('$') => return Err(Unsupported(k.into())),
            k => field_matches(lookup(document, k), condition)?,
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The N of a `$where: "sleep(N) || true"`, the one form the test server evaluates (TK-14).
fn where_sleep_ms(condition: &Bson) -> Option<u64> {
    let Bson::String(code) = condition else {
        return None;
    };
    code.strip_prefix("sleep(")?
        .strip_suffix(") || true")?
        .parse()
        .ok()
}

/// TK-14: how long a command's `$where: "sleep(N) || true"` filter makes it wait before it
/// runs (find's `filter`, an update's or delete's `q`, findAndModify's `query`), at most 10 s.
/// A client that closes meanwhile does not wait: its reply is never read.
pub(crate) fn where_sleep(command: &Document) -> Option<core::time::Duration> {
    let statements = ["updates", "deletes"].into_iter().flat_map(|field| {
        command
            .get_array(field)
            .into_iter()
            .flatten()
            .filter_map(Bson::as_document)
            .filter_map(|s| s.get_document("q").ok())
    });
    let filters = ["filter", "query"]
        .into_iter()
        .filter_map(|field| command.get_document(field).ok())
        .chain(statements);
    let total: u64 = filters
        .filter_map(|f| f.get("$where").and_then(where_sleep_ms))
        .sum();
    (total > 0).then(|| core::time::Duration::from_millis(total.min(10_000)))
}

/// `$and` (`all`) or `$or` over an array of filters.
fn all_of(document: &Document, filters: &Bson, all: bool) -> Result<bool, Unsupported> {
    let Bson::Array(filters) = filters else {
        return Err(Unsupported::bad_value(
            "$and/$or/$nor must be a nonempty array",
        ));
    };
    for filter in filters {
        let Bson::Document(filter) = filter else {
            return Err(Unsupported::bad_value(
                "$or/$and/$nor entries need to be full objects",
            ));
        };
        if matches(document, filter)? != all {
            return Ok(!all);
        }
    }
    Ok(all)
}

/// A dotted path's value.
fn lookup<'a>(document: &'a Document, path: &str) -> Option<&'a Bson> {
    let mut parts = path.split('.');
    let mut value = document.get(parts.next()?)?;
    for part in parts {
        value = match value {
            Bson::Document(d) => d.get(part)?,
            _ => return None,
        };
    }
    Some(value)
}

fn field_matches(value: Option<&Bson>, condition: &Bson) -> Result<bool, Unsupported> {
    let Bson::Document(operators) = condition else {
        return filter_equal(value, condition, "$eq");
    };
    if !operators.keys().next().is_some_and(|k| k.starts_with('$')) {
        return filter_equal(value, condition, "$eq");
    }
    for (op, operand) in operators {
        if matches!(op.as_str(), "$gt" | "$gte" | "$lt" | "$lte") {
            modelled(value, operand, op)?;
        }
        let ok = match op.as_str() {
            "$eq" => filter_equal(value, operand, op)?,
            "$ne" => !filter_equal(value, operand, op)?,
            "$gt" => compare(value, operand) == Some(Ordering::Greater),
            "$gte" => matches!(
                compare(value, operand),
                Some(Ordering::Greater | Ordering::Equal)
            ),
            "$lt" => compare(value, operand) == Some(Ordering::Less),
            "$lte" => matches!(
                compare(value, operand),
                Some(Ordering::Less | Ordering::Equal)
            ),
            "$in" | "$nin" => {
                let Bson::Array(items) = operand else {
                    return Err(Unsupported::bad_value(&format!("{op} needs an array")));
                };
                let mut found = false;
                for item in items {
                    found |= filter_equal(value, item, op)?;
                }
                found == (op == "$in")
            }
            // Fixes18c (TK-15, house rule 7): the server reads `$exists` by its operand's
            // truthiness (`expression_parser.cpp`: `e.trueValue()`), so `"x"` is true.
            "$exists" => value.is_some() == true_value(operand),
            other => return Err(Unsupported(other.into())),
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

/// [`equal`] of a filter's `operand` (of operator `op`) and a document's `value`, if present;
/// refused by [`modelled`] where it would differ from a real server's.
fn filter_equal(value: Option<&Bson>, operand: &Bson, op: &str) -> Result<bool, Unsupported> {
    modelled(value, operand, op)?;
    Ok(value.is_some_and(|v| equal(v, operand)))
}

/// TK-2 (review11 finding 4): refuses a filter whose operator `op` would compare, at some depth,
/// a Decimal128 that is not an int64 integer (`NumberDecimal("1.5")`, one too large, infinite or
/// NaN) with a number. A real server compares such decimals by value with every number
/// (`NumberDecimal("1.5")` equals `1.5` and `NumberDecimal("1.50")`); [`equal`] and [`compare`]
/// do not, so the filter is refused loudly rather than silently matching nothing.
fn modelled(value: Option<&Bson>, operand: &Bson, op: &str) -> Result<(), Unsupported> {
    match value {
        Some(value) if unmodelled_decimal(value, operand) => Err(Unsupported(format!(
            "{op} comparing a Decimal128 that is not an int64 integer with a number"
        ))),
        _ => Ok(()),
    }
}

/// Whether comparing `a` with `b` compares, at some depth, a Decimal128 that [`exact_number`]
/// does not read with a number: two numbers directly, or the values of two documents with the
/// same keys, or the elements of two arrays of the same length (what [`equal`] compares).
fn unmodelled_decimal(a: &Bson, b: &Bson) -> bool {
    let number = |v: &Bson| {
        matches!(
            v,
            Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_)
        )
    };
    let unread = |v: &Bson| matches!(v, Bson::Decimal128(d) if decimal_integer(d).is_none());
    match (a, b) {
        _ if number(a) && number(b) => unread(a) || unread(b),
        (Bson::Document(x), Bson::Document(y)) => {
            x.len() == y.len()
                && x.keys().eq(y.keys())
                && x.values()
                    .zip(y.values())
                    .any(|(x, y)| unmodelled_decimal(x, y))
        }
        (Bson::Array(x), Bson::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).any(|(x, y)| unmodelled_decimal(x, y))
        }
        _ => false,
    }
}

#[cfg(test)]
thread_local! {
    /// How many times [`equal`] ran on this thread, for the cost tests (house rule 9).
    pub(crate) static EQUAL_CALLS: core::cell::Cell<usize> = const { core::cell::Cell::new(0) };
}

/// Equality as the server sees it: numbers by exact value across their types (review8 finding
/// 7: int64s are never rounded through f64), and NaN equal to NaN, at every depth (review9
/// finding 9): embedded documents have the same keys in the same order with equal values, arrays
/// equal elements in the same order.
pub(crate) fn equal(a: &Bson, b: &Bson) -> bool {
    #[cfg(test)]
    EQUAL_CALLS.with(|calls| calls.set(calls.get() + 1));
    match (exact_number(a), exact_number(b)) {
        (Some(Exact::Double(x)), Some(Exact::Double(y))) if x.is_nan() && y.is_nan() => true,
        (Some(x), Some(y)) => compare_numbers(x, y) == Some(Ordering::Equal),
        _ => match (a, b) {
            (Bson::Document(x), Bson::Document(y)) => {
                x.len() == y.len()
                    && x.iter()
                        .zip(y)
                        .all(|((kx, vx), (ky, vy))| kx == ky && equal(vx, vy))
            }
            (Bson::Array(x), Bson::Array(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(x, y)| equal(x, y))
            }
            _ => a == b,
        },
    }
}

/// A BSON number as the server compares it: integers exactly, doubles as they are.
#[derive(Clone, Copy)]
pub(crate) enum Exact {
    /// An Int32 or Int64, or a Decimal128 that is an integer fitting one (review10 finding 9).
    Int(i64),
    /// A Double.
    Double(f64),
}

pub(crate) fn exact_number(value: &Bson) -> Option<Exact> {
    match value {
        Bson::Int32(v) => Some(Exact::Int(i64::from(*v))),
        Bson::Int64(v) => Some(Exact::Int(*v)),
        Bson::Double(v) => Some(Exact::Double(*v)),
        Bson::Decimal128(v) => decimal_integer(v).map(Exact::Int),
        _ => None,
    }
}

/// Review10 finding 9 (TK-15): the int64 a Decimal128 equals, when it is an integer that fits
/// one (`NumberDecimal("1")`, `"1.00"`, `"1E+2"`; -0 is 0), read from its IEEE 754-2008 BID
/// encoding; `None` for any other value (a fraction, too large, infinite, NaN, or the
/// large-coefficient form).
pub(crate) fn decimal_integer(value: &bson::Decimal128) -> Option<i64> {
    let bits = u128::from_le_bytes(value.bytes());
    if (bits >> 125) & 0b11 == 0b11 {
        return None;
    }
    let exponent = i32::try_from((bits >> 113) & 0x3FFF).ok()? - 6176;
    let mut coefficient = bits & ((1 << 113) - 1);
    if coefficient >= 10_u128.pow(34) {
        // Non-canonical: the value is zero.
        coefficient = 0;
    }
    if coefficient != 0 {
        for _ in exponent..0 {
            if !coefficient.is_multiple_of(10) {
                return None;
            }
            coefficient /= 10;
        }
        for _ in 0..exponent {
            coefficient = coefficient.checked_mul(10).filter(|&c| c <= 1 << 64)?;
        }
    }
    let magnitude = i128::try_from(coefficient).ok()?;
    i64::try_from(if bits >> 127 == 1 {
        -magnitude
    } else {
        magnitude
    })
    .ok()
}

/// Whether a real server reads `value` as true (`BSONElement::trueValue`): a boolean's own
/// value, a number other than zero (a NaN is true); `null` and undefined are false, any other
/// value (a string, even an empty one, a document, an array, ...) true.
pub(crate) fn true_value(value: &Bson) -> bool {
    match value {
        Bson::Boolean(b) => *b,
        Bson::Int32(n) => *n != 0,
        Bson::Int64(n) => *n != 0,
        Bson::Double(d) => *d != 0.0,
        Bson::Decimal128(d) => !decimal_is_zero(d),
        Bson::Null | Bson::Undefined => false,
        _ => true,
    }
}

/// Whether a Decimal128 is zero, of either sign and any exponent (IEEE 754-2008, binary integer
/// decimal: a coefficient of 0, or a non-canonical one above 10^34 - 1, which reads as 0).
fn decimal_is_zero(value: &bson::Decimal128) -> bool {
    let bits = u128::from_le_bytes(value.bytes());
    if (bits >> 122) & 0b1_1111 >= 0b1_1110 {
        // Infinity or NaN.
        return false;
    }
    if (bits >> 125) & 0b11 == 0b11 {
        // The large-coefficient form: always above 10^34 - 1.
        return true;
    }
    let coefficient = bits & ((1 << 113) - 1);
    coefficient == 0 || coefficient >= 10_u128.pow(34)
}

/// Review8 finding 7: the exact order of two numbers (an int64 against a double without
/// rounding the int64); `None` when a NaN is involved.
fn compare_numbers(a: Exact, b: Exact) -> Option<Ordering> {
    match (a, b) {
        (Exact::Int(x), Exact::Int(y)) => Some(x.cmp(&y)),
        (Exact::Double(x), Exact::Double(y)) => x.partial_cmp(&y),
        (Exact::Int(x), Exact::Double(y)) => int_against_double(x, y),
        (Exact::Double(x), Exact::Int(y)) => int_against_double(y, x).map(Ordering::reverse),
    }
}

/// The order of `int` against `double`, exactly.
fn int_against_double(int: i64, double: f64) -> Option<Ordering> {
    // 2^63 as f64 is exact; every double at or above it is above every int64.
    const TWO_TO_63: f64 = 9_223_372_036_854_775_808.0;
    if double.is_nan() {
        return None;
    }
    if double >= TWO_TO_63 {
        return Some(Ordering::Less);
    }
    if double < -TWO_TO_63 {
        return Some(Ordering::Greater);
    }
    let whole = double.trunc();
    // In range: the truncation is exact.
    let whole_int = whole as i64;
    Some(int.cmp(&whole_int).then_with(|| {
        if double > whole {
            Ordering::Less
        } else if double < whole {
            Ordering::Greater
        } else {
            Ordering::Equal
        }
    }))
}

fn compare(value: Option<&Bson>, operand: &Bson) -> Option<Ordering> {
    let value = value?;
    match (exact_number(value), exact_number(operand)) {
        (Some(x), Some(y)) => compare_numbers(x, y),
        _ => match (value, operand) {
            (Bson::String(x), Bson::String(y)) => Some(x.cmp(y)),
            _ => None,
        },
    }
}

/// Where `value` (a sort key's value, `None` when the field is missing) sorts among the BSON
/// types, in a real server's canonical type order (`canonicalizeBSONType`): MinKey, null (a
/// missing field sorts as null), numbers of every type together, strings and symbols,
/// ObjectIds, booleans, dates, Timestamps, MaxKey. TK-2: any other value is refused, as is a
/// Decimal128 that is not an int64 integer ([`exact_number`] cannot compare it exactly with the
/// other numbers), rather than sorted where a real server would not put it: documents and
/// arrays (a server orders an array by its least or greatest element), binary data, regular
/// expressions, code, undefined, DBPointers.
pub(crate) fn sort_rank(value: Option<&Bson>) -> Result<u8, Unsupported> {
    Ok(match value {
        Some(Bson::MinKey) => 0,
        None | Some(Bson::Null) => 5,
        Some(Bson::Decimal128(d)) if decimal_integer(d).is_none() => {
            return Err(Unsupported(String::from(
                "sort on a Decimal128 that is not an int64 integer",
            )))
        }
        Some(v) if exact_number(v).is_some() => 10,
        Some(Bson::String(_) | Bson::Symbol(_)) => 15,
        Some(Bson::ObjectId(_)) => 35,
        Some(Bson::Boolean(_)) => 40,
        Some(Bson::DateTime(_)) => 45,
        Some(Bson::Timestamp(_)) => 47,
        Some(Bson::MaxKey) => 127,
        Some(other) => {
            return Err(Unsupported(format!(
                "sort on a value of BSON type {:?}",
                other.element_type()
            )))
        }
    })
}

/// A real server's sort order of two sort-key values [`sort_rank`] accepts (it must have
/// accepted both): by type rank, then numbers by exact value with NaN below every other number
/// (the server's `compareDoubles`), strings by their bytes (no collation), ObjectIds by bytes,
/// `false` before `true`, dates and Timestamps by value.
pub(crate) fn order(a: Option<&Bson>, b: Option<&Bson>) -> Ordering {
    let rank = |v| sort_rank(v).unwrap_or(u8::MAX);
    rank(a).cmp(&rank(b)).then_with(|| match (a, b) {
        (Some(x), Some(y)) => match (exact_number(x), exact_number(y)) {
            (Some(x), Some(y)) => compare_numbers(x, y).unwrap_or_else(|| {
                let nan = |n: Exact| matches!(n, Exact::Double(d) if d.is_nan());
                nan(y).cmp(&nan(x))
            }),
            _ => match (x, y) {
                (Bson::String(x) | Bson::Symbol(x), Bson::String(y) | Bson::Symbol(y)) => {
                    x.as_bytes().cmp(y.as_bytes())
                }
                (Bson::ObjectId(x), Bson::ObjectId(y)) => x.bytes().cmp(&y.bytes()),
                (Bson::Boolean(x), Bson::Boolean(y)) => x.cmp(y),
                (Bson::DateTime(x), Bson::DateTime(y)) => x.cmp(y),
                (Bson::Timestamp(x), Bson::Timestamp(y)) => {
                    (x.time, x.increment).cmp(&(y.time, y.increment))
                }
                _ => Ordering::Equal,
            },
        },
        _ => Ordering::Equal,
    })
}

fn number(value: &Bson) -> Option<f64> {
    match value {
        Bson::Int32(v) => Some(f64::from(*v)),
        Bson::Int64(v) => Some(*v as f64),
        Bson::Double(v) => Some(*v),
        _ => None,
    }
}

/// `$inc` as a real server adds (its safe-number rules): two int32s give an int32, or an int64
/// when the sum does not fit; integers add exactly as int64s, and a sum that overflows an int64
/// is refused (BadValue) rather than wrapped; with a double on either side, a double.
fn increment(current: &Bson, by: &Bson, field: &str) -> Result<Bson, Unsupported> {
    let integer = |value: &Bson| match value {
        Bson::Int32(v) => Some(i64::from(*v)),
        Bson::Int64(v) => Some(*v),
        _ => None,
    };
    if let (Bson::Int32(a), Bson::Int32(b)) = (current, by) {
        return Ok(a
            .checked_add(*b)
            .map_or(Bson::Int64(i64::from(*a) + i64::from(*b)), Bson::Int32));
    }
    if let (Some(a), Some(b)) = (integer(current), integer(by)) {
        return a.checked_add(b).map(Bson::Int64).ok_or_else(|| {
            Unsupported::bad_value(&format!("$inc overflows the 64-bit integer {field}"))
        });
    }
    match (number(current), number(by)) {
        (Some(x), Some(y)) => Ok(Bson::Double(x + y)),
        _ => Err(Unsupported(format!("$inc on non-number {field}"))),
    }
}

/// Applies `update` (operators, or a replacement keeping `_id`) to `document`.
pub(crate) fn apply_update(document: &mut Document, update: &Document) -> Result<(), Unsupported> {
    if !update.keys().next().is_some_and(|k| k.starts_with('$')) {
        // Leftovers12 item 4: as the server's `ObjectReplaceExecutor`, a replacement naming an
        // `_id` stores its own (equal as a value, the caller checked it, but perhaps of another
        // number type); one without keeps the document's, where it was: first.
        let mut replaced = Document::new();
        if let Some(id) = document.get("_id").filter(|_| !update.contains_key("_id")) {
            replaced.insert("_id", id.clone());
        }
        replaced.extend(update.clone());
        *document = replaced;
        return Ok(());
    }
    for (op, fields) in update {
        let Bson::Document(fields) = fields else {
            return Err(Unsupported(format!("{op} needs a document")));
        };
        for (field, value) in fields {
            if field.contains('.') {
                return Err(Unsupported(format!("dotted update path {field}")));
            }
            match op.as_str() {
                "$set" => {
                    document.insert(field, value.clone());
                }
                "$unset" => {
                    document.remove(field);
                }
                "$inc" => {
                    let sum = match document.get(field) {
                        None => value.clone(),
                        Some(current) => increment(current, value, field)?,
                    };
                    document.insert(field, sum);
                }
                other => return Err(Unsupported(other.into())),
            }
        }
    }
    Ok(())
}

/// The document an upsert inserts: the filter's equality fields, then the update.
pub(crate) fn upsert_seed(filter: &Document) -> Document {
    filter
        .iter()
        .filter(|(k, v)| {
            !k.starts_with('$')
                && !k.contains('.')
                && !matches!(v, Bson::Document(d) if d.keys().any(|k| k.starts_with('$')))
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    /// Fixes18c (TK-15, house rule 7): `$exists` matches by its operand's truthiness, as the
    /// server's `BSONElement::trueValue` reads it: a string (even empty), a document, an array or
    /// a nonzero number (NaN included) is true; false, a zero of any numeric type (a decimal of
    /// either sign and any exponent), `null` and undefined are false.
    #[test]
    fn tk15_exists_reads_its_operand_by_truthiness() {
        let decimal = |text: &str| Bson::Decimal128(text.parse().expect("a decimal"));
        let d = doc! { "_id": 1 };
        let truthy = [
            Bson::Boolean(true),
            Bson::String("x".into()),
            Bson::String(String::new()),
            Bson::Int32(-1),
            Bson::Int64(2),
            Bson::Double(0.5),
            Bson::Double(f64::NAN),
            decimal("1E-6176"),
            decimal("-Infinity"),
            decimal("NaN"),
            Bson::Document(doc! {}),
            Bson::Array(vec![]),
        ];
        let falsy = [
            Bson::Boolean(false),
            Bson::Int32(0),
            Bson::Int64(0),
            Bson::Double(-0.0),
            decimal("0"),
            decimal("-0E+12"),
            decimal("0.000"),
            Bson::Null,
            Bson::Undefined,
        ];
        for (operands, truth) in [(&truthy[..], true), (&falsy[..], false)] {
            for operand in operands {
                for (field, present) in [("_id", true), ("absent", false)] {
                    let filter = doc! { field: { "$exists": operand.clone() } };
                    assert_eq!(matches(&d, &filter), Ok(truth == present), "{filter}");
                }
            }
        }
    }

    /// Fixes18c (TK-15, house rule 7): a `$comment` of any value beside a filter's other
    /// expressions, or in an `$and` / `$or` branch, matches every document (the server's parser
    /// adds no expression for it); one inside a field's condition is still an unknown operator.
    #[test]
    fn tk15_a_top_level_comment_is_no_expression() {
        let d = doc! { "_id": 1 };
        for (filter, expected) in [
            (doc! { "$comment": "why" }, true),
            (doc! { "$comment": { "any": 1 }, "_id": 1 }, true),
            (doc! { "_id": 2, "$comment": 3 }, false),
            (doc! { "$or": [{ "$comment": "x" }] }, true),
            (doc! { "$and": [{ "$comment": "x", "_id": 2 }] }, false),
        ] {
            assert_eq!(matches(&d, &filter), Ok(expected), "{filter}");
        }
        let inside = doc! { "_id": { "$comment": "x" } };
        assert_eq!(matches(&d, &inside), Err(Unsupported("$comment".into())));
    }

    /// TK-2 (review11 finding 4): a filter comparing a Decimal128 that is not an int64 integer
    /// with a number, on either side and at any depth, is refused by name (a real server
    /// compares them by decimal value, which is not modelled); integral decimals, and other
    /// comparisons on a document holding such a decimal, are answered.
    #[test]
    fn tk2_a_filter_on_a_fractional_decimal_is_refused() {
        let decimal = |text: &str| Bson::Decimal128(text.parse().expect("a decimal"));
        let d = doc! {
            "_id": 1, "x": decimal("1.5"), "y": { "z": decimal("2.5") }, "n": decimal("1E+2"),
            "f": 1.5,
        };
        let refused = |op: &str| {
            Err(Unsupported(format!(
                "{op} comparing a Decimal128 that is not an int64 integer with a number"
            )))
        };
        for (filter, op) in [
            (doc! { "x": 1.5 }, "$eq"),
            (doc! { "x": decimal("1.50") }, "$eq"),
            (doc! { "x": { "$eq": 1 } }, "$eq"),
            (doc! { "x": { "$ne": 2_i64 } }, "$ne"),
            (doc! { "x": { "$gt": 1 } }, "$gt"),
            (doc! { "x": { "$lte": decimal("2") } }, "$lte"),
            (doc! { "x": { "$in": ["a", 1.5] } }, "$in"),
            (doc! { "x": { "$nin": [1.5] } }, "$nin"),
            (doc! { "y": { "z": 2.5 } }, "$eq"),
            (doc! { "f": decimal("1.5") }, "$eq"),
            (doc! { "f": { "$gte": decimal("NaN") } }, "$gte"),
            (doc! { "$or": [{ "_id": 2 }, { "x": 1.5 }] }, "$eq"),
        ] {
            assert_eq!(matches(&d, &filter), refused(op), "{filter}");
        }
        for (filter, expected) in [
            (doc! { "_id": decimal("1.00") }, true),
            (doc! { "n": 100 }, true),
            (doc! { "n": { "$gt": 99.5 } }, true),
            (doc! { "x": "1.5" }, false),
            (doc! { "x": { "$exists": true } }, true),
            (doc! { "absent": decimal("1.5") }, false),
            (doc! { "y": { "w": 2.5 } }, false),
            (doc! { "_id": 1, "f": 1.5 }, true),
        ] {
            assert_eq!(matches(&d, &filter), Ok(expected), "{filter}");
        }
    }

    #[test]
    fn comparison_operators() {
        let d = doc! { "_id": 2, "x": { "y": "b" } };
        let cases = [
            (doc! { "_id": 2_i64 }, true),
            (doc! { "_id": { "$gt": 1 } }, true),
            (doc! { "_id": { "$gte": 3 } }, false),
            (doc! { "_id": { "$lt": 2.5 } }, true),
            (doc! { "_id": { "$in": [1, 2] } }, true),
            (doc! { "_id": { "$nin": [1, 2] } }, false),
            (doc! { "z": { "$exists": false } }, true),
            (doc! { "x.y": "b" }, true),
            (doc! { "$or": [{ "_id": 1 }, { "_id": 2 }] }, true),
            (
                doc! { "$and": [{ "_id": 2 }, { "_id": { "$ne": 2 } }] },
                false,
            ),
        ];
        for (filter, expected) in cases {
            assert_eq!(matches(&d, &filter), Ok(expected), "{filter}");
        }
        assert_eq!(
            matches(&d, &doc! { "_id": { "$regex": "a" } }),
            Err(Unsupported("$regex".into()))
        );
        assert_eq!(
            matches(&d, &doc! { "$where": "1" }),
            Err(Unsupported("$where".into()))
        );
        assert_eq!(
            matches(&d, &doc! { "$where": "sleep(20) || true" }),
            Ok(true)
        );
        let find = doc! { "find": "c", "filter": { "$where": "sleep(20) || true" } };
        assert_eq!(
            where_sleep(&find),
            Some(core::time::Duration::from_millis(20))
        );
        assert_eq!(where_sleep(&doc! { "find": "c", "filter": {} }), None);
    }

    #[test]
    fn updates_and_replacements() {
        let mut d = doc! { "_id": 1, "x": 1, "y": 2 };
        apply_update(
            &mut d,
            &doc! { "$inc": { "x": 1 }, "$unset": { "y": "" }, "$set": { "z": 3 } },
        )
        .unwrap();
        assert_eq!(d, doc! { "_id": 1, "x": 2, "z": 3 });
        apply_update(&mut d, &doc! { "w": 1 }).unwrap();
        assert_eq!(d, doc! { "w": 1, "_id": 1 });
        assert!(apply_update(&mut d, &doc! { "$push": { "a": 1 } }).is_err());
        assert_eq!(
            upsert_seed(&doc! { "_id": 4, "x": { "$gt": 1 } }),
            doc! { "_id": 4 }
        );
    }

    /// TK-14 (house rule 7): `$inc` adds as a real server does: an int32 sum that overflows
    /// becomes an int64, int64s add exactly (2^53 + 1 stays odd), an int64 overflow is refused,
    /// a double makes a double.
    #[test]
    fn inc_adds_like_a_real_server() {
        let inc = |current: Bson, by: Bson| {
            let mut document = doc! { "x": current };
            apply_update(&mut document, &doc! { "$inc": { "x": by } })
                .map(|()| document.get("x").cloned())
        };
        assert_eq!(
            inc(Bson::Int32(1), Bson::Int32(2)),
            Ok(Some(Bson::Int32(3)))
        );
        assert_eq!(
            inc(Bson::Int32(i32::MAX), Bson::Int32(1)),
            Ok(Some(Bson::Int64(i64::from(i32::MAX) + 1)))
        );
        assert_eq!(
            inc(Bson::Int64(1 << 53), Bson::Int32(1)),
            Ok(Some(Bson::Int64((1 << 53) + 1)))
        );
        assert!(
            inc(Bson::Int64(i64::MAX), Bson::Int64(1)).is_err_and(|e| e.0.starts_with(BAD_VALUE))
        );
        assert_eq!(
            inc(Bson::Int64(1), Bson::Double(0.5)),
            Ok(Some(Bson::Double(1.5)))
        );
        assert!(inc(Bson::String("a".into()), Bson::Int32(1)).is_err());
    }

    /// TK-2 (fixes11b's leftover): sorting follows a real server's BSON order: null and missing
    /// first, then every number type together by exact value (an integral Decimal128 among
    /// them, NaN below the rest), then strings by bytes, ObjectIds, booleans, dates, Timestamps;
    /// what cannot be placed exactly (a fractional Decimal128, a document, an array) is refused.
    #[test]
    fn tk2_sort_follows_the_servers_bson_order_and_refuses_what_it_cannot_place() {
        let decimal = |text: &str| Bson::Decimal128(text.parse().expect("a decimal"));
        let sorted = [
            None,
            Some(Bson::Null),
            Some(Bson::Double(f64::NAN)),
            Some(Bson::Double(f64::NEG_INFINITY)),
            Some(decimal("-1E+2")),
            Some(Bson::Int64(-3)),
            Some(Bson::Double(-2.5)),
            Some(Bson::Int32(2)),
            Some(decimal("3.00")),
            Some(Bson::Double(3.5)),
            Some(Bson::Int64((1 << 53) + 1)),
            Some(Bson::String("A".into())),
            Some(Bson::String("a".into())),
            Some(Bson::String("é".into())),
            Some(Bson::ObjectId(bson::oid::ObjectId::from_bytes([0; 12]))),
            Some(Bson::Boolean(false)),
            Some(Bson::Boolean(true)),
            Some(Bson::DateTime(bson::DateTime::from_millis(-1))),
            Some(Bson::Timestamp(bson::Timestamp {
                time: 1,
                increment: 2,
            })),
            Some(Bson::MaxKey),
        ];
        for (i, a) in sorted.iter().enumerate() {
            assert!(sort_rank(a.as_ref()).is_ok(), "{a:?}");
            for (j, b) in sorted.iter().enumerate() {
                let expected = if a.is_none() && b == &Some(Bson::Null)
                    || b.is_none() && a == &Some(Bson::Null)
                {
                    Ordering::Equal
                } else {
                    i.cmp(&j)
                };
                assert_eq!(order(a.as_ref(), b.as_ref()), expected, "{a:?} {b:?}");
            }
        }
        assert_eq!(
            order(Some(&Bson::Int32(3)), Some(&decimal("3"))),
            Ordering::Equal
        );
        for refused in [
            decimal("1.5"),
            decimal("Infinity"),
            Bson::Document(doc! { "a": 1 }),
            Bson::Array(vec![Bson::Int32(1)]),
            Bson::Undefined,
        ] {
            assert!(sort_rank(Some(&refused)).is_err(), "{refused:?}");
        }
    }
}
