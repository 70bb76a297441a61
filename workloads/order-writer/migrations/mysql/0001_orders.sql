-- Orders as the order-writer stores them (MySQL, MariaDB, TiDB). The
-- idempotency key is unique, so a replayed event is a no-op; status only
-- moves forward.
CREATE TABLE orders (
    order_id        VARCHAR(64)  NOT NULL PRIMARY KEY,
    idempotency_key VARCHAR(128) NOT NULL,
    sale            VARCHAR(63)  NOT NULL,
    user_id         VARCHAR(128) NOT NULL,
    sku             VARCHAR(64)  NOT NULL,
    quantity        INT          NOT NULL CHECK (quantity > 0),
    amount_minor    BIGINT       NOT NULL CHECK (amount_minor >= 0),
    reservation_id  VARCHAR(64)  NOT NULL,
    status          VARCHAR(16)  NOT NULL CHECK (status IN ('pending_payment', 'paid', 'expired')),
    created_at      DATETIME(6)  NOT NULL,
    updated_at      DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    kafka_partition INT          NOT NULL,
    kafka_offset    BIGINT       NOT NULL,
    UNIQUE KEY orders_idempotency_key (idempotency_key),
    KEY orders_by_sale_user (sale, user_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
