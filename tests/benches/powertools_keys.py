"""Key derivation in AWS Lambda Powertools' idempotency utility, per key (issue 44, item 1).

Run by `benches/ledger.rs` with the Python of a venv it made (`aws-lambda-powertools` from
PyPI), never by hand: it prints one line per measurement, `name nanoseconds`, for the same
five-field arguments the Rust bench derives idem's key of (`charge_args`), built fresh for each
key as the Rust side builds its struct. Nanoseconds are the best of fifty rounds, like
`nanos_per` there.

- `default`: the utility's defaults (no JMESPath, the whole event is the key; MD5), which is
  what a handler decorated with `@idempotent` and a bare `IdempotencyConfig()` derives;
- `key+validation`: the key over the two key fields by JMESPath, and the payload validation
  hash over the whole event (`payload_validation_jmespath`) — the same work as idem's key and
  fingerprint, SHA-256 as idem's.
"""

import sys
import time

from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig
from aws_lambda_powertools.utilities.idempotency.persistence.base import BasePersistenceLayer


class Keys(BasePersistenceLayer):
    """Only the key derivation is measured: no record is read or written."""

    def _get_record(self, idempotency_key):
        raise NotImplementedError

    def _put_record(self, data_record):
        raise NotImplementedError

    def _update_record(self, data_record):
        raise NotImplementedError

    def _delete_record(self, data_record):
        raise NotImplementedError


def charge_args(i):
    return {
        "order_id": f"order-{i}",
        "card": "tok_visa_4242",
        "amount_cents": 1250 + i,
        "currency": "eur",
        "description": "two coffees and a croissant",
    }


def nanos_per(n, f):
    n = max(n // 10, 1)
    best = float("inf")
    for _ in range(50):
        start = time.perf_counter_ns()
        for i in range(n):
            f(i)
        best = min(best, (time.perf_counter_ns() - start) / n)
    return best


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    default = Keys()
    default.configure(IdempotencyConfig(), function_name="charge_card")
    both = Keys()
    both.configure(
        IdempotencyConfig(
            event_key_jmespath="[order_id, amount_cents]",
            payload_validation_jmespath="@",
            hash_function="sha256",
        ),
        function_name="charge_card",
    )
    assert default._get_hashed_idempotency_key(charge_args(1)) != default._get_hashed_idempotency_key(charge_args(2))
    build = nanos_per(n, charge_args)
    plain = nanos_per(n, lambda i: default._get_hashed_idempotency_key(charge_args(i)))
    def key_and_validation(i):
        event = charge_args(i)
        return both._get_hashed_idempotency_key(event), both._get_hashed_payload(event)

    pair = nanos_per(n, key_and_validation)
    print(f"default {plain - build:.0f}")
    print(f"key+validation {pair - build:.0f}")


if __name__ == "__main__":
    main()
