//! The configuration the operator renders is what the workloads read: the
//! gateway's and the inventory's own parsers accept it, for the shipped
//! example sale, at every stage.

use flashsale_api::FlashSale;
use flashsale_controller_sale::{build, build::Images, build::Input, build::Stage};
use gateway::{config::GatewayConfig, window::WindowState};
use inventory::store::SaleDefinition;

fn example() -> anyhow::Result<FlashSale> {
    let mut sale: FlashSale = serde_yaml_ng::from_str(include_str!(
        "../../crds/examples/flashsale-singles-day.yaml"
    ))?;
    // What the apiserver adds.
    sale.metadata.uid = Some("6f1c5b8e-0000-4000-8000-000000000001".to_owned());
    Ok(sale)
}

fn data<'a>(desired: &'a build::Desired, name: &str, key: &str) -> anyhow::Result<&'a str> {
    desired
        .config_maps
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(name))
        .and_then(|c| c.data.as_ref()?.get(key))
        .map(String::as_str)
        .ok_or_else(|| anyhow::anyhow!("no {key} in ConfigMap {name}"))
}

#[test]
fn the_gateway_and_the_inventory_accept_what_the_operator_renders() -> anyhow::Result<()> {
    let sale = example()?;
    let images = Images {
        gateway: "g".into(),
        inventory: "i".into(),
        order_writer: "o".into(),
    };
    for stage in [Stage::Pending, Stage::Active, Stage::Ending, Stage::Drained] {
        let desired = build::build(&Input {
            sale: &sale,
            images: &images,
            stage,
            operator_namespace: "flashsale-system",
        })?;
        let gateway: GatewayConfig =
            serde_json::from_str(data(&desired, "singles-day-gateway", "gateway.json")?)?;
        gateway.check()?;
        // The sale id, not the bare name: `<namespace>.<name>.<uid8>`.
        assert_eq!(gateway.sale, "default.singles-day.6f1c5b8e");
        assert_eq!(gateway.items.len(), sale.spec.items.len());
        assert_eq!(gateway.price("PHONE-X-256"), Some(399_900));
        assert_eq!(gateway.rate_limit.per_user_per_second, 2);
        assert!(gateway.waiting_room.enabled);
        let shield = gateway.waiting_room.bot_shield.as_ref();
        assert_eq!(
            shield.map(|s| s.settings().difficulty(2)),
            Some(17),
            "the example's tier-2 difficulty"
        );
        assert_eq!(gateway.concurrency.tier0_reserved_percent, 40);
        // The gateway opens and closes at the sale's own instants.
        let (start, end) = (sale.spec.schedule.start.0, sale.spec.schedule.end.0);
        let just_before = start - jiff::SignedDuration::from_millis(1);
        assert!(matches!(
            gateway.window_state(just_before),
            WindowState::NotYet { .. }
        ));
        assert!(matches!(gateway.window_state(start), WindowState::Open));
        assert!(matches!(
            gateway.window_state(end),
            WindowState::Ended { .. }
        ));

        let inventory: SaleDefinition =
            serde_json::from_str(data(&desired, "singles-day-inventory", "sale.json")?)?;
        assert_eq!(inventory.sale, gateway.sale);
        assert_eq!(inventory.reservation_ttl_ms, 15 * 60 * 1000);
        let phone = inventory.items.iter().find(|i| i.sku == "PHONE-X-256");
        assert_eq!(
            phone.map(|i| (i.stock, i.per_user_limit, i.shards)),
            Some((10_000, 1, 8))
        );
    }
    Ok(())
}
