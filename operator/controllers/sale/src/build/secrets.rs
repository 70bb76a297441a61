//! The Secrets the workloads read, so the controller can check they exist
//! before it applies pods that would otherwise hang in ContainerCreating.

use flashsale_api::{FlashSale, common::SecretKeyRef};

/// The secrets the workloads mount, for the controller to check they exist
/// before applying: every SecretKeyRef of the spec with the spec field path
/// it came from (e.g. "spec.gateway.auth.hs256SecretRef").
///
/// `spec.gateway.waitingRoom.ticketSecretRef` is listed only while the
/// waiting room is enabled, since only then is it mounted: a disabled room
/// must not hold a sale back for a Secret nobody reads.
pub fn secret_refs(sale: &FlashSale) -> Vec<(&'static str, &SecretKeyRef)> {
    let spec = &sale.spec;
    let auth = &spec.gateway.auth;
    let waiting_room = &spec.gateway.waiting_room;
    [
        (
            "spec.gateway.auth.hs256SecretRef",
            auth.hs256_secret_ref.as_ref(),
        ),
        (
            "spec.gateway.auth.rs256PublicKeySecretRef",
            auth.rs256_public_key_secret_ref.as_ref(),
        ),
        (
            "spec.gateway.payment.secretRef",
            spec.gateway.payment.as_ref().map(|p| &p.secret_ref),
        ),
        (
            "spec.gateway.waitingRoom.ticketSecretRef",
            waiting_room
                .ticket_secret_ref
                .as_ref()
                .filter(|_| waiting_room.signs()),
        ),
        (
            "spec.gateway.drillKeySecretRef",
            spec.gateway.drill_key_secret_ref.as_ref(),
        ),
        (
            "spec.gateway.redis.urlSecretRef",
            spec.gateway
                .redis
                .as_ref()
                .and_then(|r| r.url_secret_ref.as_ref()),
        ),
        (
            "spec.inventory.redis.urlSecretRef",
            spec.inventory.redis.url_secret_ref.as_ref(),
        ),
        (
            "spec.orderWriter.database.urlSecretRef",
            Some(&spec.order_writer.database.url_secret_ref),
        ),
    ]
    .into_iter()
    .filter_map(|(path, secret)| secret.map(|secret| (path, secret)))
    .collect()
}
