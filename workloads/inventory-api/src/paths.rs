//! The routes of the inventory API. The templates mark a path segment as
//! `{name}` (the server's routing syntax); the functions fill them in for a
//! client. Segments go in as given: sale ids, reservation ids and SKUs are
//! made of URL-safe characters.

/// Loading a sale (`POST`, admin token): a [`crate::SaleDefinition`],
/// answered with a [`crate::LoadedSale`].
pub const SALES: &str = "/v1/sales";
/// Reserving (`POST`): a [`crate::ReserveBody`], answered with the
/// [`crate::Reservation`] (201 when made now, 200 for a repeated request id).
pub const RESERVATIONS: &str = "/v1/sales/{sale}/reservations";
/// Reserving several at once (`POST`): a [`crate::ReserveBatchBody`] of at
/// most [`crate::MAX_BATCH`], each member decided as if posted alone to
/// [`RESERVATIONS`], answered with a [`crate::ReserveBatchAnswer`] in the
/// same order (200; a member's own status is in its answer).
pub const RESERVATION_BATCHES: &str = "/v1/sales/{sale}/reservation-batches";
/// One reservation (`GET`): a [`crate::Reservation`].
pub const RESERVATION: &str = "/v1/sales/{sale}/reservations/{id}";
/// Confirming a reservation as paid (`POST`, no body, idempotent): a
/// [`crate::StateChange`].
pub const CONFIRM: &str = "/v1/sales/{sale}/reservations/{id}/confirm";
/// Cancelling a reservation, returning its units (`POST`, no body,
/// idempotent): a [`crate::StateChange`].
pub const CANCEL: &str = "/v1/sales/{sale}/reservations/{id}/cancel";
/// Stock of a SKU (`GET`): a [`crate::StockLevel`].
pub const STOCK: &str = "/v1/sales/{sale}/items/{sku}/stock";
/// Adjusting a SKU's stock (`POST`, admin token): an [`crate::AdjustBody`],
/// answered with an [`crate::Adjustment`].
pub const ADJUSTMENTS: &str = "/v1/sales/{sale}/items/{sku}/adjustments";

/// [`RESERVATIONS`] of `sale`.
pub fn reservations(sale: &str) -> String {
    fill(RESERVATIONS, &[sale])
}

/// [`RESERVATION_BATCHES`] of `sale`.
pub fn reservation_batches(sale: &str) -> String {
    fill(RESERVATION_BATCHES, &[sale])
}

/// [`RESERVATION`] `id` of `sale`.
pub fn reservation(sale: &str, id: &str) -> String {
    fill(RESERVATION, &[sale, id])
}

/// [`CONFIRM`] of reservation `id` of `sale`.
pub fn confirm(sale: &str, id: &str) -> String {
    fill(CONFIRM, &[sale, id])
}

/// [`CANCEL`] of reservation `id` of `sale`.
pub fn cancel(sale: &str, id: &str) -> String {
    fill(CANCEL, &[sale, id])
}

/// [`STOCK`] of `sku` of `sale`.
pub fn stock(sale: &str, sku: &str) -> String {
    fill(STOCK, &[sale, sku])
}

/// `template` with its `{name}` segments replaced by `segments`, in order;
/// one spelling of each route for the server and its clients.
fn fill(template: &str, segments: &[&str]) -> String {
    let length = template.len() + segments.iter().map(|s| s.len()).sum::<usize>();
    let mut path = String::with_capacity(length);
    let mut segments = segments.iter();
    // Splitting at the braces alternates text and names.
    for (i, part) in template.split(['{', '}']).enumerate() {
        if i % 2 == 0 {
            path.push_str(part);
        } else if let Some(segment) = segments.next() {
            path.push_str(segment);
        }
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_fill_the_templates() {
        let sale = "shop.spring.1a2b3c4d";
        assert_eq!(
            reservations(sale),
            "/v1/sales/shop.spring.1a2b3c4d/reservations"
        );
        assert_eq!(
            reservation(sale, "9f3c"),
            "/v1/sales/shop.spring.1a2b3c4d/reservations/9f3c"
        );
        assert_eq!(
            confirm(sale, "9f3c"),
            "/v1/sales/shop.spring.1a2b3c4d/reservations/9f3c/confirm"
        );
        assert_eq!(
            cancel(sale, "9f3c"),
            "/v1/sales/shop.spring.1a2b3c4d/reservations/9f3c/cancel"
        );
        assert_eq!(
            stock(sale, "PHONE"),
            "/v1/sales/shop.spring.1a2b3c4d/items/PHONE/stock"
        );
    }

    #[test]
    fn the_templates_are_the_routes() {
        assert_eq!(SALES, "/v1/sales");
        assert_eq!(RESERVATIONS, "/v1/sales/{sale}/reservations");
        assert_eq!(RESERVATION, "/v1/sales/{sale}/reservations/{id}");
        assert_eq!(CONFIRM, "/v1/sales/{sale}/reservations/{id}/confirm");
        assert_eq!(CANCEL, "/v1/sales/{sale}/reservations/{id}/cancel");
        assert_eq!(STOCK, "/v1/sales/{sale}/items/{sku}/stock");
        assert_eq!(ADJUSTMENTS, "/v1/sales/{sale}/items/{sku}/adjustments");
    }
}
