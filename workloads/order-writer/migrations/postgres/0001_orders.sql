-- Orders as the order-writer stores them. The idempotency key is unique, so a
-- replayed event is a no-op; status only moves forward.
CREATE TABLE orders (
    order_id        VARCHAR(64)  PRIMARY KEY,
    idempotency_key VARCHAR(128) NOT NULL UNIQUE,
    sale            VARCHAR(63)  NOT NULL,
    user_id         VARCHAR(128) NOT NULL,
    sku             VARCHAR(64)  NOT NULL,
    quantity        INTEGER      NOT NULL CHECK (quantity > 0),
    amount_minor    BIGINT       NOT NULL CHECK (amount_minor >= 0),
    reservation_id  VARCHAR(64)  NOT NULL,
    status          VARCHAR(16)  NOT NULL CHECK (status IN ('pending_payment', 'paid', 'expired')),
    created_at      TIMESTAMPTZ  NOT NULL,
    updated_at      TIMESTAMPTZ  NOT NULL DEFAULT now(),
    kafka_partition INTEGER      NOT NULL,
    kafka_offset    BIGINT       NOT NULL
);

CREATE INDEX orders_by_sale_user ON orders (sale, user_id);
