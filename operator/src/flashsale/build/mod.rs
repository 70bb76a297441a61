//! The pure build step: the objects a FlashSale needs.
